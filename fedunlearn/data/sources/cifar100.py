"""CIFAR-100 (Krizhevsky, *Learning Multiple Layers of Features from Tiny Images*, 2009) from
torchvision's pickled layout: ``<root>/cifar-100-python/train`` and ``.../test``.

Each file is one pickled dict: ``data`` uint8 of shape (N, 3072) (the red, green and blue planes of
a 32x32 image, row-major) and ``fine_labels`` in 0..99; the coarse labels (20 superclasses) are
not read. Inputs are scaled to [0, 1] and standardised per channel with the training split's
statistics, as CIFAR-10's (:mod:`fedunlearn.data.datasets`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from fedunlearn.data.datasets import (
    DatasetSplits,
    fetch_with_torchvision,
    image_splits,
    missing_file,
    unreadable_file,
)

NAME = "cifar100"
NUM_CLASSES = 100
FOLDER = "cifar-100-python"
_SIDE = 32


def _read_split(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled split: uint8 images (N, 3, 32, 32) and int64 fine labels (N,)."""
    if not path.is_file():
        raise missing_file(NAME, path)
    try:
        with path.open("rb") as handle:
            # The official files are Python 2 pickles; encoding="bytes" keeps their keys as bytes.
            split = pickle.load(handle, encoding="bytes")
        data = np.asarray(split.get(b"data", split.get("data")), dtype=np.uint8)
        labels = np.asarray(split.get(b"fine_labels", split.get("fine_labels")), dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3 * _SIDE * _SIDE:
            raise ValueError(f"found data of shape {data.shape}")
        if labels.shape != (data.shape[0],):
            raise ValueError(f"found {labels.shape} fine labels for {data.shape[0]} images")
        if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
            raise ValueError(f"found fine labels {labels.min()}..{labels.max()}")
    except Exception as error:  # unpickling fails in many ways; report them as one unreadable file
        expected = (
            "a pickled dict with b'data' of uint8 shape (N, 3072) and N b'fine_labels' in 0..99"
        )
        raise unreadable_file(NAME, path, expected, error) from error
    return data.reshape(-1, 3, _SIDE, _SIDE), labels


def load_cifar100(root: Path, download: bool) -> DatasetSplits:
    """CIFAR-100's 50,000 training and 10,000 test images with their 100 fine labels.

    Parameters
    ----------
    root : Path
        The data root, holding ``cifar-100-python/``.
    download : bool
        Fetch the archive through torchvision when the folder is absent: the only network access.

    Raises
    ------
    DatasetNotFoundError
        A file is missing, unreadable or malformed, or the download failed.

    Notes
    -----
    The pickles are read directly rather than through ``torchvision.datasets.CIFAR100``, which
    checks md5 sums and so would refuse the small synthetic copies tests use.
    """
    folder = Path(root) / FOLDER
    if download and not folder.is_dir():
        fetch_with_torchvision(NAME, "CIFAR100", Path(root), folder, "cifar-100-python.tar.gz")
    train = _read_split(folder / "train")
    test = _read_split(folder / "test")
    return image_splits(NAME, train, test, scale=255.0, num_classes=NUM_CLASSES)


def load(source) -> DatasetSplits:
    """CIFAR-100 (Krizhevsky 2009), fine labels, from ``source.root`` (the registry's loader)."""
    return load_cifar100(source.require_root(NAME, "cifar-100-python/"), source.download)
