"""CIFAR-10: torchvision's pickled layout under ``<root>/cifar-10-batches-py/`` (``data_batch_1..5``
and ``test_batch``)."""

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

FOLDER = "cifar-10-batches-py"
BATCHES = tuple(f"data_batch_{number}" for number in range(1, 6))


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled CIFAR-10 batch; returns uint8 images (N, 3, 32, 32) and int64 labels (N,)."""
    if not path.is_file():
        raise missing_file("cifar10", path)
    try:
        with path.open("rb") as handle:
            # The official batches are Python 2 pickles; encoding="bytes" keeps their keys as bytes.
            batch = pickle.load(handle, encoding="bytes")
        data = np.asarray(batch[b"data"] if b"data" in batch else batch["data"], dtype=np.uint8)
        labels = np.asarray(
            batch[b"labels"] if b"labels" in batch else batch["labels"], dtype=np.int64
        )
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (data.shape[0],):
            raise ValueError(f"found data of shape {data.shape} and labels of shape {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise ValueError(f"found labels {labels.min()}..{labels.max()}")
    except Exception as error:  # unpickling fails in many ways; report them as one unreadable file
        expected = "a pickled dict with b'data' of uint8 shape (N, 3072) and N b'labels' in 0..9"
        raise unreadable_file("cifar10", path, expected, error) from error
    return data.reshape(-1, 3, 32, 32), labels


def load(source) -> DatasetSplits:
    """CIFAR-10 (Krizhevsky 2009) from torchvision's pickled layout, read directly.

    torchvision's own class verifies md5 sums, which would reject anything but the official files;
    reading the pickles here keeps small synthetic copies usable in tests.
    """
    root, download = source.require_root("cifar10", FOLDER + "/"), source.download
    folder = root / FOLDER
    if download and not folder.is_dir():
        fetch_with_torchvision("cifar10", "CIFAR10", root, folder, "cifar-10-python.tar.gz")
    train_parts = [_read_cifar_batch(folder / batch_name) for batch_name in BATCHES]
    test = _read_cifar_batch(folder / "test_batch")
    train_images = np.concatenate([images for images, _ in train_parts])
    train_labels = np.concatenate([labels for _, labels in train_parts])
    return image_splits("cifar10", (train_images, train_labels), test, scale=255.0)
