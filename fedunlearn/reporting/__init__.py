"""Reports of run directories, Flower- and PyTorch-free: one self-contained HTML page of a run
(:mod:`~fedunlearn.reporting.html_report`, ``fedunlearn report RUN``) and several runs'
comparisons side by side (:mod:`~fedunlearn.reporting.compare`, ``fedunlearn compare RUN...``).
The run directories are read as untrusted input (:mod:`~fedunlearn.reporting.run_files`)."""
