"""Arrays in a NumPy ``.npz`` archive: ``x_train, y_train, x_test, y_test``, or ``x, y`` (then split by
:func:`~fedunlearn.data.formats.common.stratified_split`, ``test-fraction`` of each class held out,
seeded with ``seed``). Other keys are ignored (never read).

The archive is untrusted input: it is opened with ``allow_pickle=False`` always, so an object array
is refused, never unpickled.

Shapes of ``x`` (N samples), the rule that decides what a sample is:

- ``(N, F)``: tabular; each feature standardised with the training split's mean and std;
- ``(N, H, W)``: one-channel images, read as ``(N, 1, H, W)``;
- ``(N, A, B, D)``: images, channels-first ``(N, C, H, W)``, except channels-last ``(N, H, W, C)``
  when the last axis is 1 or 3 and the second is neither (then moved to channels-first).

Images are standardised per channel with the training split's statistics (8-bit ``uint8`` pixels
scaled to [0, 1] first; any other dtype as it is). ``x`` must be numeric (bool, integer or float) and
finite. ``y`` holds integers, integral floats or text; its values become codes ``0..C-1`` in their
sorted order (:func:`read_npz` returns them in code order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.data.datasets import DatasetSplits, image_splits
from fedunlearn.data.formats.common import (
    data_path,
    label_codes,
    standardize_features,
    stratified_split,
    tabular_splits,
    unusable,
)

NAME = "npz"
EXPECTED = "a .npz file holding x_train, y_train, x_test, y_test (or x, y)"
SPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")
WHOLE_KEYS = ("x", "y")


def load_npz(source) -> DatasetSplits:
    """Load a ``.npz`` archive (see the module docstring) as standardised splits.

    Parameters
    ----------
    source : DataSource
        ``root`` the ``.npz`` file; ``seed`` and ``test_fraction`` split an ``x, y`` archive.

    Returns
    -------
    DatasetSplits
        ``(N, F)`` features or ``(N, C, H, W)`` images, float32; labels the sorted values' codes.

    Raises
    ------
    ConfigError
        ``data-root`` unset, or ``test-fraction`` out of range.
    DatasetNotFoundError
        The file is missing, not an ``.npz``, lacks the keys, holds an object array, non-numeric or
        non-finite inputs, shapes that disagree, a test label never seen in training, or fewer than
        two classes.
    """
    return read_npz(source)[0]


def read_npz(source) -> tuple[DatasetSplits, list]:
    """:func:`load_npz`'s splits and the label values in code order."""
    path = data_path(source, NAME, EXPECTED)
    (train_x, train_values), (test_x, test_values) = _arrays(path, source)
    train_y, test_y, classes = label_codes(train_values, test_values, NAME, path)
    if train_x.shape[1:] != test_x.shape[1:]:
        raise unusable(
            NAME, path, f"x_train's samples are {train_x.shape[1:]} but x_test's {test_x.shape[1:]}"
        )
    if train_x.ndim == 2:
        features = standardize_features(train_x, test_x)
        splits = tabular_splits(NAME, (features[0], train_y), (features[1], test_y), len(classes))
    else:
        scale = 255.0 if train_x.dtype == np.uint8 and test_x.dtype == np.uint8 else 1.0
        splits = image_splits(NAME, (train_x, train_y), (test_x, test_y), scale, len(classes))
    return splits, classes


def _arrays(path: Path, source) -> tuple[tuple, tuple]:
    """``((x_train, y_train), (x_test, y_test))`` from the archive, images channels-first."""
    archive = _opened(path)
    with archive:
        keys = set(archive.files)
        if set(SPLIT_KEYS) <= keys:
            x_train, y_train, x_test, y_test = (_array(archive, key, path) for key in SPLIT_KEYS)
            return _pair(x_train, y_train, "train", path), _pair(x_test, y_test, "test", path)
        if set(WHOLE_KEYS) <= keys:
            x, y = _pair(_array(archive, "x", path), _array(archive, "y", path), "", path)
            train, test = stratified_split(y, source, NAME, path)
            return (x[train], y[train]), (x[test], y[test])
    raise unusable(
        NAME,
        path,
        f"keys {sorted(keys)}; expected {', '.join(SPLIT_KEYS)} or {', '.join(WHOLE_KEYS)}",
    )


def _opened(path: Path):
    if not path.is_file():
        raise unusable(NAME, path, f"not a file; data-root should be {EXPECTED}")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as error:  # not a zip, a pickle (refused), a truncated file...
        raise unusable(
            NAME, path, f"not a readable .npz ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise unusable(NAME, path, "a single .npy array, not an .npz archive of named arrays")
    return archive


def _array(archive, key: str, path: Path) -> np.ndarray:
    try:
        return archive[key]
    except Exception as error:  # an object array (allow_pickle=False refuses it), a bad member
        reason = " ".join(str(error).split())
        raise unusable(
            NAME, path, f"array {key!r} is unreadable ({type(error).__name__}: {reason})"
        ) from error


def _pair(x: np.ndarray, y: np.ndarray, split: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` checked: numeric finite inputs in a known shape, one label per sample."""
    suffix = f"_{split}" if split else ""
    if x.dtype.kind not in "biuf":
        raise unusable(NAME, path, f"x{suffix} has dtype {x.dtype}; inputs must be numbers")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise unusable(NAME, path, f"x{suffix} holds NaN or infinite values")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise unusable(
            NAME,
            path,
            f"y{suffix} has shape {y.shape} for x{suffix} of shape {x.shape}; one label per sample",
        )
    return _channels_first(x, f"x{suffix}", path), _labels(y, f"y{suffix}", path)


def _channels_first(x: np.ndarray, key: str, path: Path) -> np.ndarray:
    if x.ndim == 2:
        return x
    if x.ndim == 3:
        return x[:, np.newaxis]
    if x.ndim == 4:
        last_is_channels = x.shape[3] in (1, 3) and x.shape[1] not in (1, 3)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if last_is_channels else x
    raise unusable(
        NAME,
        path,
        f"{key} has shape {x.shape}; expected (N, F), (N, H, W), (N, C, H, W) or (N, H, W, C)",
    )


def _labels(y: np.ndarray, key: str, path: Path) -> np.ndarray:
    if y.dtype.kind in "biuU":
        return y
    if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
        return y.astype(np.int64)
    raise unusable(NAME, path, f"{key} has dtype {y.dtype}; labels must be integers or text")
