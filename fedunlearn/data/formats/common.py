"""What every local format shares: the data root's check, the seeded stratified split, the label
codes and the packaging into :class:`~fedunlearn.data.datasets.DatasetSplits`.

A file is untrusted input: whatever is wrong with it is reported as one line naming the file, what
was found and what was expected (:class:`~fedunlearn.errors.DatasetNotFoundError`), and a parameter
out of range as a :class:`~fedunlearn.errors.ConfigError` naming the run-config key.

Labels become ``0..C-1`` in the sorted order of the training split's label values (``"cat" < "dog"``,
``3 < 7``), the rule torchvision's ``ImageFolder`` applies to class folders; :func:`label_codes`
returns the values in that order, so code ``i`` means ``classes[i]``.

The data source's ``download`` is ignored: local data has nothing to fetch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from fedunlearn.data.datasets import MINIMUM_STD, DatasetSplits, TensorSplit
from fedunlearn.errors import ConfigError, DatasetNotFoundError

#: Fewest samples of a class that a split of one file into train and test accepts: one for each.
MIN_PER_CLASS_TO_SPLIT = 2


def data_path(source, name: str, expected: str) -> Path:
    """``source.root`` as an existing path, or the error that says what dataset ``name`` expects."""
    if source.root is None or str(source.root) == "":
        raise ConfigError("data-root", source.root, f"dataset {name!r} needs data-root: {expected}")
    path = Path(source.root).expanduser()
    if not path.exists():
        raise DatasetNotFoundError(
            name, path, hint=f"nothing there; data-root should be {expected}"
        )
    return path


def unusable(name: str, path: Path, reason: str) -> DatasetNotFoundError:
    """The error for a file or folder that exists but cannot be used, saying why."""
    return DatasetNotFoundError(name, path, hint=f"found it unusable: {reason}")


def test_fraction_of(source) -> float:
    """``source.test_fraction``, checked: the share of one file's samples held out for testing."""
    value = source.test_fraction
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError("test-fraction", value, "a number strictly between 0 and 1")
    return float(value)


def stratified_split(labels: np.ndarray, source, name: str, path: Path):
    """Indices ``(train, test)`` of a seeded split of ``labels`` that keeps every class in both.

    The split is scikit-learn's ``train_test_split`` stratified on the label, seeded with
    ``source.seed``, holding out ``source.test_fraction`` of the samples (at least one per class).
    """
    from sklearn.model_selection import train_test_split

    fraction = test_fraction_of(source)
    values, counts = np.unique(labels, return_counts=True)
    _check_two_classes(values, name, path)
    if counts.min() < MIN_PER_CLASS_TO_SPLIT:
        rare = values[np.argmin(counts)]
        raise unusable(
            name,
            path,
            f"class {rare!r} has {counts.min()} sample; a split into train and test "
            f"needs at least {MIN_PER_CLASS_TO_SPLIT} of every class",
        )
    # At least one test sample per class, and at least one left for training.
    test_size = min(max(math.ceil(fraction * len(labels)), len(values)), len(labels) - len(values))
    if test_size < len(values):
        raise ConfigError(
            "test-fraction",
            fraction,
            f"a share that leaves each of the {len(values)} classes a "
            f"test sample and a training sample; {path} holds only {len(labels)} samples",
        )
    indices = np.arange(len(labels))
    train, test = train_test_split(
        indices, test_size=test_size, stratify=labels, random_state=source.seed
    )
    return np.sort(train), np.sort(test)


def _check_two_classes(classes, name: str, path: Path) -> None:
    if len(classes) < 2:
        found = ", ".join(repr(value) for value in list(classes)[:1]) or "none"
        raise unusable(
            name, path, f"it holds {len(classes)} class ({found}); at least 2 are needed"
        )


def label_codes(train_values, test_values, name: str, path: Path):
    """Codes ``0..C-1`` for both splits' labels and the label values in code order.

    Parameters
    ----------
    train_values, test_values : array-like
        Each sample's label value (integers or text), training and test split.
    name, path : str, Path
        The format and the file, for the error messages.

    Returns
    -------
    train_codes, test_codes : numpy.ndarray
        int64 codes into ``classes``.
    classes : list
        The training split's label values, sorted; ``classes[code]`` is a code's value.

    Raises
    ------
    DatasetNotFoundError
        Fewer than two classes in training, an empty split, or a test label never seen in training.
    """
    train_values, test_values = _comparable(np.asarray(train_values), np.asarray(test_values))
    if len(test_values) == 0 or len(train_values) == 0:
        raise unusable(
            name, path, f"{len(train_values)} training and {len(test_values)} test samples"
        )
    classes = np.unique(train_values)
    _check_two_classes(classes, name, path)
    unseen = np.setdiff1d(np.unique(test_values), classes)
    if unseen.size:
        shown = ", ".join(repr(value.item()) for value in unseen[:5])
        raise unusable(
            name,
            path,
            f"test labels never seen in training: {shown}; every test class must be "
            "a training class",
        )
    codes = [
        np.searchsorted(classes, values).astype(np.int64) for values in (train_values, test_values)
    ]
    return codes[0], codes[1], [value.item() for value in classes]


def _comparable(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both label arrays as numbers, or both as text when either is text (or Python objects)."""
    numeric = all(values.dtype.kind in "biuf" for values in (train, test))
    return (train, test) if numeric else (train.astype(str), test.astype(str))


def standardize_features(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardise the columns of ``(N, F)`` features with the training split's mean and std."""
    train = np.asarray(train, dtype=np.float64)
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > MINIMUM_STD, std, 1.0)
    return ((train - mean) / std).astype(np.float32), ((np.asarray(test) - mean) / std).astype(
        np.float32
    )


def tabular_splits(name: str, train: tuple, test: tuple, num_classes: int) -> DatasetSplits:
    """``(features, codes)`` pairs of already encoded ``(N, F)`` float features, packaged."""
    return _splits(
        name,
        (torch.as_tensor(np.ascontiguousarray(train[0], dtype=np.float32)), train[1]),
        (torch.as_tensor(np.ascontiguousarray(test[0], dtype=np.float32)), test[1]),
        num_classes,
    )


def _splits(name: str, train: tuple, test: tuple, num_classes: int) -> DatasetSplits:
    return DatasetSplits(
        name=name,
        train=TensorSplit(train[0], torch.as_tensor(np.asarray(train[1], dtype=np.int64))),
        test=TensorSplit(test[0], torch.as_tensor(np.asarray(test[1], dtype=np.int64))),
        num_classes=num_classes,
        input_shape=tuple(train[0].shape[1:]),
    )
