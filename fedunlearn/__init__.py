"""fedunlearn: the Flower-free core of the federated-unlearning platform.

Data, models, training loops, the retained-update store, the math of the unlearning papers and their
metrics. Nothing in this package imports ``flwr``; the Flower layer lives in ``strategies``,
``clients`` and ``server``.
"""

__version__ = "0.1.0"
