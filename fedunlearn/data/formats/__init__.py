"""Datasets in common forms, loaded with no code: an image folder (``image_folder``), a CSV or
Parquet table (``table``), a NumPy ``.npz`` archive (``arrays``) and a Hugging Face ``save_to_disk``
folder (``hf_disk``). Each loader is called as ``load(source)`` with the run's data source (its
``root``, ``seed``, ``label_column`` and ``test_fraction``) and returns a ``DatasetSplits``; what the
formats share (the checks of the root, the stratified split, the label codes) is in ``common``.
"""
