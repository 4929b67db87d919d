"""UCI Adult (Census Income): ``<root>/adult/adult.data`` and ``<root>/adult/adult.test``, numeric
columns standardised and categorical ones one-hot encoded with the training split's statistics."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import numpy as np
import torch

from fedunlearn.data.datasets import (
    MINIMUM_STD,
    DatasetSplits,
    TensorSplit,
    missing_file,
    unreadable_file,
)

URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
FILES = ("adult.data", "adult.test")
COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
NUMERIC = frozenset(
    ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
)
LABELS = {"<=50K": 0, ">50K": 1}


def _download_adult(folder: Path) -> None:
    """Fetch whichever of adult.data and adult.test is missing from the UCI archive."""
    folder.mkdir(parents=True, exist_ok=True)
    for file_name in FILES:
        target = folder / file_name
        if target.is_file():
            continue
        partial = target.with_name(file_name + ".part")
        try:
            urllib.request.urlretrieve(URL + file_name, partial)
            # Renamed only once complete, so an interrupted download never looks like a good file.
            os.replace(partial, target)
        except Exception as error:
            partial.unlink(missing_ok=True)
            expected = (
                f"the file at {URL + file_name} (download failed: check the network, or "
                "copy the file there by hand)"
            )
            raise unreadable_file("adult", target, expected, error) from error


def _read_adult_file(path: Path):
    """Parse one Adult file into a DataFrame (numbers as float, categories as text) and 0/1 labels."""
    import pandas as pd

    if not path.is_file():
        raise missing_file("adult", path)
    try:
        with path.open("r", encoding="utf-8") as handle:
            first_line = handle.readline()
        # adult.test opens with a non-data line such as "|1x3 Cross validator".
        frame = pd.read_csv(
            path,
            header=None,
            names=list(COLUMNS),
            skiprows=1 if first_line.lstrip().startswith("|") else 0,
            skipinitialspace=True,
            dtype=str,
            na_filter=False,  # keep '?' as text: it is a category of its own
        )
        frame = frame.apply(lambda column: column.str.strip())
        if frame.empty:
            raise ValueError("the file holds no data rows")
        short_rows = np.flatnonzero((frame == "").any(axis=1).to_numpy())
        if short_rows.size:
            raise ValueError(
                f"{short_rows.size} rows have empty or missing fields, e.g. data row {short_rows[0] + 1}"
            )
        # adult.test writes its labels with a trailing '.', e.g. ">50K.".
        label_text = frame.pop("income").str.rstrip(".")
        unknown = sorted(set(label_text) - set(LABELS))
        if unknown:
            raise ValueError(f"found income labels {unknown[:5]}")
        labels = label_text.map(LABELS).to_numpy(dtype=np.int64, copy=True)
        for column in NUMERIC:
            try:
                frame[column] = pd.to_numeric(frame[column]).astype(np.float64)
            except ValueError as error:
                raise ValueError(f"column {column!r}: {error}") from error
    except Exception as error:  # parser, encoding and content errors alike: one clear message
        expected = "15 comma-separated columns per row, numeric columns as numbers, income '<=50K' or '>50K'"
        raise unreadable_file("adult", path, expected, error) from error
    return frame, labels


def _encode_adult(train_frame, test_frame) -> tuple[np.ndarray, np.ndarray]:
    """Encode both frames with training statistics: numerics standardised, categoricals one-hot.

    Features keep the column order of the files; each categorical column becomes a block with one
    entry per category seen in training, sorted. A test category never seen in training encodes as an
    all-zero block, the honest answer for a value the model never saw.
    """
    import pandas as pd

    train_blocks, test_blocks = [], []
    for column in COLUMNS[:-1]:
        if column in NUMERIC:
            train_values = train_frame[column].to_numpy()
            mean, std = train_values.mean(), train_values.std()
            std = std if std > MINIMUM_STD else 1.0
            train_blocks.append(((train_values - mean) / std)[:, np.newaxis])
            test_blocks.append(((test_frame[column].to_numpy() - mean) / std)[:, np.newaxis])
            continue
        categories = pd.Index(sorted(train_frame[column].unique()))
        for frame, blocks in ((train_frame, train_blocks), (test_frame, test_blocks)):
            codes = categories.get_indexer(frame[column])  # -1 for a category unseen in training
            one_hot = np.zeros((len(frame), len(categories)), dtype=np.float32)
            seen = np.flatnonzero(codes >= 0)
            one_hot[seen, codes[seen]] = 1.0
            blocks.append(one_hot)
    return (
        np.concatenate(train_blocks, axis=1).astype(np.float32),
        np.concatenate(test_blocks, axis=1).astype(np.float32),
    )


def load(source) -> DatasetSplits:
    """UCI Adult (Census Income, Kohavi 1996): tabular features, label 1 for income above 50K."""
    root, download = (
        source.require_root("adult", "adult/adult.data and adult/adult.test"),
        source.download,
    )
    folder = root / "adult"
    if download and not all((folder / file_name).is_file() for file_name in FILES):
        _download_adult(folder)
    train_frame, train_labels = _read_adult_file(folder / "adult.data")
    test_frame, test_labels = _read_adult_file(folder / "adult.test")
    train_x, test_x = _encode_adult(train_frame, test_frame)
    return DatasetSplits(
        name="adult",
        train=TensorSplit(torch.from_numpy(train_x), torch.from_numpy(train_labels)),
        test=TensorSplit(torch.from_numpy(test_x), torch.from_numpy(test_labels)),
        num_classes=2,
        input_shape=(train_x.shape[1],),
    )
