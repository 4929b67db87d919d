"""The built-in datasets' loaders, one module each, registered in :mod:`fedunlearn.dataset_registry`.

Each loader is called as ``load(source)`` with a :class:`fedunlearn.dataset_spec.DataSource` and
returns :class:`fedunlearn.data.datasets.DatasetSplits`; ``docs/adding-a-dataset.md`` shows how
to add one.
"""
