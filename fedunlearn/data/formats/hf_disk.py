"""A Hugging Face ``datasets`` folder written by ``save_to_disk``, read with ``load_from_disk``.

``data-root`` is the folder: a ``DatasetDict`` with ``train`` and ``test`` splits (the splits as
given), a ``DatasetDict`` with ``train`` alone, or a single ``Dataset`` (then split by
:func:`~fedunlearn.data.formats.common.stratified_split`, ``test-fraction`` of each class held out,
seeded with ``seed``). Other splits (``validation``) are ignored.

The column ``label-column`` (default ``label``) holds the class: a ``ClassLabel``, integers or text;
its values become codes ``0..C-1`` in their sorted order (a ``ClassLabel`` whose every class has a
training sample keeps its ids). The inputs are either

- the one ``Image`` column, decoded and read as the image folder reads files (one size, grayscale or
  RGB, scaled to [0, 1] and standardised per channel with training statistics; see
  :mod:`~fedunlearn.data.formats.image_folder`), or
- when there is no ``Image`` column, every other column, each a scalar: numbers standardised, text
  one-hot encoded with the training categories (the table format's encoding, see
  :mod:`~fedunlearn.data.formats.table`).

``datasets`` is an optional dependency: ``pip install 'fedunlearn[hf]'``.
"""

from __future__ import annotations

from pathlib import Path

from fedunlearn.data.datasets import DatasetSplits, image_splits
from fedunlearn.data.formats.common import (
    data_path,
    label_codes,
    stratified_split,
    tabular_splits,
    unusable,
)
from fedunlearn.data.formats.image_folder import images_as_arrays
from fedunlearn.data.formats.table import encode_frames
from fedunlearn.errors import ConfigError

NAME = "hf-disk"
EXPECTED = "a folder written by Hugging Face datasets' save_to_disk"
INSTALL = "needs the Hugging Face datasets package: pip install 'fedunlearn[hf]'"


def load_hf_disk(source) -> DatasetSplits:
    """Load a ``save_to_disk`` folder (see the module docstring) as standardised splits.

    Parameters
    ----------
    source : DataSource
        ``root`` the folder, ``label_column`` the class column; ``seed`` and ``test_fraction``
        split a folder with no test split.

    Returns
    -------
    DatasetSplits
        ``(N, C, H, W)`` images or ``(N, F)`` features, float32; labels the sorted values' codes.

    Raises
    ------
    ConfigError
        ``datasets`` is not installed, ``data-root`` unset, ``label-column`` not a column, or
        ``test-fraction`` out of range.
    DatasetNotFoundError
        The folder is missing or not a saved dataset, it has no ``train`` split, its columns are
        neither one image column nor scalars, a test label was never seen in training, or fewer
        than two classes.
    """
    return read_hf_disk(source)[0]


def read_hf_disk(source) -> tuple[DatasetSplits, list]:
    """:func:`load_hf_disk`'s splits and the label values in code order."""
    path = data_path(source, NAME, EXPECTED)
    train, test = _splits(path, source)
    label = source.label_column
    train_y, test_y, classes = label_codes(_column(train, label), _column(test, label), NAME, path)
    image_columns = [name for name, feature in train.features.items() if _is_image(feature)]
    if len(image_columns) > 1:
        raise unusable(NAME, path, f"several image columns {image_columns}; keep one")
    if image_columns:
        train_x, test_x = images_as_arrays(
            [
                [(f"{split} row {row}", image) for row, image in enumerate(data[image_columns[0]])]
                for split, data in (("train", train), ("test", test))
            ],
            NAME,
            path,
        )
        splits = image_splits(NAME, (train_x, train_y), (test_x, test_y), 255.0, len(classes))
        return splits, classes
    train_x, test_x = _tabular(train, test, label, path)
    return tabular_splits(NAME, (train_x, train_y), (test_x, test_y), len(classes)), classes


def _splits(path: Path, source):
    """The training and test ``Dataset`` (split here when the folder holds no test split)."""
    datasets = _datasets_module()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # FileNotFoundError for a folder of something else, Arrow errors...
        reason = " ".join(str(error).split())[:300]
        raise unusable(
            NAME, path, f"not a saved dataset ({type(error).__name__}: {reason})"
        ) from error
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise unusable(NAME, path, f"splits {sorted(loaded)}; a 'train' split is needed")
        _check_label_column(loaded["train"], source.label_column)
        if "test" in loaded:
            train, test = loaded["train"], loaded["test"]
            if test.column_names != train.column_names:
                raise unusable(
                    NAME,
                    path,
                    f"test columns {test.column_names} differ from train's {train.column_names}",
                )
            return train, test
        loaded = loaded["train"]
    _check_label_column(loaded, source.label_column)
    train, test = stratified_split(_column(loaded, source.label_column), source, NAME, path)
    return loaded.select(train), loaded.select(test)


def _datasets_module():
    try:
        import datasets
    except ImportError as error:
        raise ConfigError("dataset", NAME, INSTALL) from error
    return datasets


def _column(dataset, name: str):
    """One column's values as a NumPy array."""
    import numpy as np

    return np.asarray(dataset.select_columns([name]).with_format("numpy")[name])


def _check_label_column(dataset, label: str) -> None:
    if label not in dataset.column_names:
        shown = ", ".join(repr(name) for name in dataset.column_names)
        raise ConfigError("label-column", label, f"one of the columns: {shown}")


def _is_image(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Image)


def _tabular(train, test, label: str, path: Path):
    """Scalar columns as features: numbers standardised, text one-hot (the table's encoding)."""
    import datasets

    columns = [name for name in train.column_names if name != label]
    if not columns:
        raise unusable(NAME, path, f"no feature column besides the label column {label!r}")
    for name in columns:
        feature = train.features[name]
        if not isinstance(feature, (datasets.Value, datasets.ClassLabel)):
            raise unusable(
                NAME,
                path,
                f"column {name!r} is a {type(feature).__name__}; the inputs must be one "
                "Image column or scalar columns",
            )
    frames = [data.select_columns(columns).to_pandas() for data in (train, test)]
    for frame in frames:
        if frame.isna().to_numpy().any():
            row, column = frame.isna().to_numpy().nonzero()
            raise unusable(
                NAME, path, f"a missing value at row {row[0]}, column {columns[column[0]]!r}"
            )
    return encode_frames(frames[0], frames[1], NAME, path)
