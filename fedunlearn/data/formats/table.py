"""A table with one row per sample: a CSV file, or a Parquet file when ``pyarrow`` is installed.

``data-root`` is either one file (``.csv`` or ``.parquet``), split by
:func:`~fedunlearn.data.formats.common.stratified_split` (``test-fraction`` of each class held out,
seeded with ``seed``), or a folder holding ``train.csv`` and ``test.csv`` (or ``train.parquet`` and
``test.parquet``), the splits as given; the test file must have the training file's columns.

The column ``label-column`` (default ``label``) holds the class; its values, text or numbers, become
codes ``0..C-1`` in their sorted order (:func:`read_table` returns them in code order). Every other
column is a feature: a numeric column (as pandas reads it from the training split) is standardised
with the training split's mean and standard deviation; any other column is one-hot encoded with the
training split's categories, sorted, a test category never seen in training encoding as all zeros
(the Adult loader's rule, ``_encode_adult``). Features keep the file's column order.

Missing values are refused, not imputed: an empty field (CSV) or a null (Parquet) is reported with its
row and column, since any imputation would be a modelling choice made silently. Text such as ``NA``
or ``?`` is a category like any other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.data.datasets import DatasetSplits
from fedunlearn.data.formats.common import (
    data_path,
    label_codes,
    standardize_features,
    stratified_split,
    tabular_splits,
    unusable,
)
from fedunlearn.errors import ConfigError

NAME = "table"
EXPECTED = "a .csv or .parquet file, or a folder holding train.csv and test.csv"
SUFFIXES = (".csv", ".parquet")


def load_table(source) -> DatasetSplits:
    """Load a CSV or Parquet table (see the module docstring) as encoded, standardised splits.

    Parameters
    ----------
    source : DataSource
        ``root`` the file or folder, ``label_column`` the class column; ``seed`` and
        ``test_fraction`` split a single file.

    Returns
    -------
    DatasetSplits
        Features ``(N, F)`` float32; labels the codes of the sorted label values.

    Raises
    ------
    ConfigError
        ``data-root`` unset; ``label-column`` not a column; ``test-fraction`` out of range; a
        Parquet file without ``pyarrow``.
    DatasetNotFoundError
        The file is missing or unreadable, a value is missing, a test file's columns differ from
        the training file's, a test label was never seen in training, or fewer than two classes.
    """
    return read_table(source)[0]


def read_table(source) -> tuple[DatasetSplits, list]:
    """:func:`load_table`'s splits and the label values in code order."""
    path = data_path(source, NAME, EXPECTED)
    train, test, where = _frames(path, source)
    label = source.label_column
    train_y, test_y, classes = label_codes(
        train.pop(label).to_numpy(), test.pop(label).to_numpy(), NAME, where
    )
    if train.shape[1] == 0:
        raise unusable(NAME, where, f"no feature column besides the label column {label!r}")
    train_x, test_x = encode_frames(train, test, NAME, where)
    return tabular_splits(NAME, (train_x, train_y), (test_x, test_y), len(classes)), classes


def _frames(path: Path, source):
    """The training and test frames (labels still in them) and the path errors should name."""
    if path.is_dir():
        train_path, test_path = _split_files(path)
        train, test = _read(train_path, source), _read(test_path, source)
        if list(test.columns) != list(train.columns):
            raise unusable(
                NAME,
                test_path,
                f"its columns {list(test.columns)} differ from "
                f"{train_path.name}'s {list(train.columns)}",
            )
        return train, test, path
    frame = _read(path, source)
    train_rows, test_rows = stratified_split(
        frame[source.label_column].to_numpy(), source, NAME, path
    )
    return (
        frame.iloc[train_rows].reset_index(drop=True),
        frame.iloc[test_rows].reset_index(drop=True),
        path,
    )


def _split_files(folder: Path) -> tuple[Path, Path]:
    for suffix in SUFFIXES:
        train, test = folder / f"train{suffix}", folder / f"test{suffix}"
        if train.is_file() and test.is_file():
            return train, test
    raise unusable(
        NAME, folder, "a folder needs train.csv and test.csv (or train.parquet and test.parquet)"
    )


def _read(path: Path, source):
    """One file as a DataFrame, its label column checked and no value missing."""
    frame = _parsed(path)
    label = source.label_column
    if label not in frame.columns:
        shown = ", ".join(repr(str(column)) for column in frame.columns[:20])
        raise ConfigError("label-column", label, f"one of the columns of {path.name}: {shown}")
    missing = frame.isna().to_numpy()
    if missing.any():
        row, column = np.argwhere(missing)[0]
        raise unusable(
            NAME,
            path,
            f"a missing value at data row {row + 1}, column {frame.columns[column]!r} "
            f"({missing.sum()} in all); fill or drop them first",
        )
    if frame.empty:
        raise unusable(NAME, path, "it holds no data rows")
    return frame


def _parsed(path: Path):
    import pandas as pd

    if path.suffix.lower() not in SUFFIXES or not path.is_file():
        raise unusable(NAME, path, f"not a .csv or .parquet file; data-root should be {EXPECTED}")
    if path.suffix.lower() == ".parquet":
        _require_pyarrow(path)
    try:
        if path.suffix.lower() == ".parquet":
            return pd.read_parquet(path)
        # Only an empty field is missing: "NA", "null" or "?" are values a table may mean.
        return pd.read_csv(path, keep_default_na=False, na_values=[""])
    except Exception as error:  # parser, encoding and Arrow errors alike: one line
        reason = " ".join(str(error).split())[:300]
        raise unusable(
            NAME, path, f"not a readable table ({type(error).__name__}: {reason})"
        ) from error


def _require_pyarrow(path: Path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "data-root",
            str(path),
            "a .parquet file needs pyarrow: pip install pyarrow (or "
            "'fedunlearn[hf]', which brings it), or save the table as CSV",
        ) from error


def encode_frames(train, test, name: str, where: Path) -> tuple[np.ndarray, np.ndarray]:
    """Both frames' features with training statistics: numbers standardised, the rest one-hot.

    ``name`` and ``where`` (the format and its file) are for the error messages.
    """
    import pandas as pd

    train_blocks, test_blocks = [], []
    for column in train.columns:
        if pd.api.types.is_numeric_dtype(train[column]):
            train_block, test_block = standardize_features(
                _numeric(train[column], column, "training", (name, where))[:, None],
                _numeric(test[column], column, "test", (name, where))[:, None],
            )
        else:
            train_block, test_block = _one_hot(train[column].astype(str), test[column].astype(str))
        train_blocks.append(train_block)
        test_blocks.append(test_block)
    return np.concatenate(train_blocks, axis=1), np.concatenate(test_blocks, axis=1)


def _numeric(values, column, split: str, where: tuple[str, Path]) -> np.ndarray:
    """A numeric column's values as finite floats; text or infinity is refused with its row."""
    import pandas as pd

    numbers = pd.to_numeric(values, errors="coerce").to_numpy(np.float64)
    bad = np.flatnonzero(~np.isfinite(numbers))
    if bad.size:
        raise unusable(
            *where,
            f"column {column!r} is numeric but the {split} split holds "
            f"{values.iloc[bad[0]]!r} at its data row {bad[0] + 1}",
        )
    return numbers


def _one_hot(train, test) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    categories = pd.Index(sorted(train.unique()))
    blocks = []
    for values in (train, test):
        codes = categories.get_indexer(values)  # -1: a category unseen in training
        one_hot = np.zeros((len(values), len(categories)), dtype=np.float32)
        seen = np.flatnonzero(codes >= 0)
        one_hot[seen, codes[seen]] = 1.0
        blocks.append(one_hot)
    return blocks[0], blocks[1]
