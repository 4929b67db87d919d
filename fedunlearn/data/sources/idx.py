"""MNIST and Fashion-MNIST: torchvision's raw IDX layout under ``<root>/MNIST/raw/`` and
``<root>/FashionMNIST/raw/`` (un-gzipped IDX files)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fedunlearn.data.datasets import (
    DatasetSplits,
    download_failed,
    image_splits,
    is_download_failure,
    missing_file,
    unreadable_file,
)

FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def load_mnist(source) -> DatasetSplits:
    """MNIST (LeCun et al. 1998), 28x28 grey digits."""
    return _load("mnist", source.require_root("mnist", "MNIST/raw/"), source.download)


def load_fashion_mnist(source) -> DatasetSplits:
    """Fashion-MNIST (Xiao et al. 2017), 28x28 grey clothing images."""
    root = source.require_root("fashion-mnist", "FashionMNIST/raw/")
    return _load("fashion-mnist", root, source.download)


def _load(name: str, root: Path, download: bool) -> DatasetSplits:
    """MNIST or Fashion-MNIST through torchvision, which reads the raw IDX files."""
    raw_folder = root / FOLDERS[name] / "raw"
    if not download:
        # Checked here so that the error names the exact missing file; torchvision's does not.
        for file_name in FILES:
            if not (raw_folder / file_name).is_file():
                raise missing_file(name, raw_folder / file_name)
    # Imported here because torchvision is slow to import and only the image downloads need it.
    import torchvision

    dataset_class = (
        torchvision.datasets.MNIST if name == "mnist" else torchvision.datasets.FashionMNIST
    )
    created = download and not (root / FOLDERS[name]).exists()
    try:
        train = dataset_class(str(root), train=True, download=download)
        test = dataset_class(str(root), train=False, download=download)
    except (
        Exception
    ) as error:  # torchvision raises RuntimeError, OSError, ValueError...: report one
        if created:  # nothing half-fetched stays behind to be mistaken for the dataset
            shutil.rmtree(root / FOLDERS[name], ignore_errors=True)
        if download and is_download_failure(error):
            raise download_failed(name, raw_folder, error) from error
        raise unreadable_file(
            name, raw_folder, "the four IDX files, readable by torchvision", error
        ) from error
    return image_splits(
        name,
        (train.data.unsqueeze(1), train.targets),
        (test.data.unsqueeze(1), test.targets),
        scale=255.0,
    )
