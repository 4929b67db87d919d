"""CIFAR-100 from torchvision's cifar-100-python/ layout: 100 fine labels, images standardised with
training statistics only; tiny synthetic pickles, no network."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.datasets import load_dataset
from fedunlearn.data.sources.cifar100 import load_cifar100
from fedunlearn.errors import DatasetNotFoundError


def write_cifar100(root: Path, train_size: int = 12, test_size: int = 5, seed: int = 0) -> dict:
    """A tiny cifar-100-python folder; returns the raw arrays written."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    # Channels get different ranges (a wrong reshape shows in the per-channel statistics), and the
    # test split is brighter (normalising with test statistics would re-centre it).
    raw = {
        "train": np.concatenate(
            [rng.integers(low, low + 100, size=(train_size, 1024)) for low in (0, 60, 120)], axis=1
        ).astype(np.uint8),
        "test": rng.integers(150, 256, size=(test_size, 3072)).astype(np.uint8),
    }
    for split in ("train", "test"):
        n = len(raw[split])
        fine = rng.integers(0, 100, size=n)
        fine[:2] = (0, 99)  # both ends of the label range
        raw[split + "_labels"] = fine.tolist()
        content = {
            b"data": raw[split],
            b"fine_labels": raw[split + "_labels"],
            b"coarse_labels": (fine // 5).tolist(),
        }
        (folder / split).write_bytes(pickle.dumps(content))
    return raw


def test_fine_labels_and_train_statistics(tmp_path):
    raw = write_cifar100(tmp_path)
    splits = load_cifar100(tmp_path, download=False)
    assert splits.name == "cifar100" and splits.num_classes == 100
    assert splits.input_shape == (3, 32, 32)
    assert splits.train.y.tolist() == raw["train_labels"]
    assert splits.test.y.tolist() == raw["test_labels"]
    train = raw["train"].reshape(-1, 3, 32, 32) / 255.0
    mean = train.mean(axis=(0, 2, 3), keepdims=True)
    std = train.std(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(splits.train.x.numpy(), (train - mean) / std, atol=1e-4)
    expected_test = (raw["test"].reshape(-1, 3, 32, 32) / 255.0 - mean) / std
    np.testing.assert_allclose(splits.test.x.numpy(), expected_test, atol=1e-4)


def test_load_dataset_and_the_run_config_know_cifar100(tmp_path, monkeypatch):
    import torchvision

    write_cifar100(tmp_path)

    def no_network(*args, **kwargs):
        raise AssertionError("CIFAR100 download attempted although the folder exists")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", no_network)
    assert len(load_dataset("cifar100", tmp_path, download=True).train) == 12
    config = ExperimentConfig.from_run_config(
        {"dataset": "cifar100", "data-root": str(tmp_path), "model": "resnet18-cifar-gn"}
    )
    assert config.dataset == "cifar100"


def test_missing_split_is_named_with_the_download_command(tmp_path):
    write_cifar100(tmp_path)
    missing = tmp_path / "cifar-100-python" / "test"
    missing.unlink()
    with pytest.raises(DatasetNotFoundError) as caught:
        load_cifar100(tmp_path, download=False)
    assert caught.value.expected_path == str(missing)
    assert f"`fedunlearn data download cifar100 --root {tmp_path}`" in str(caught.value)


def test_a_failed_download_is_reported_without_the_network(tmp_path, monkeypatch):
    import torchvision

    def offline(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", offline)
    with pytest.raises(DatasetNotFoundError, match="download failed") as caught:
        load_cifar100(tmp_path, download=True)
    assert caught.value.expected_path == str(tmp_path / "cifar-100-python")


@pytest.mark.parametrize(
    "content",
    [
        b"not a pickle",
        pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"fine_labels": [0, 1]}),
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": [0, 100]}),
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}),
    ],
    ids=["garbage", "wrong-width", "label-out-of-range", "cifar10-keys"],
)
def test_malformed_split_is_reported_with_its_path(content, tmp_path):
    write_cifar100(tmp_path)
    broken = tmp_path / "cifar-100-python" / "train"
    broken.write_bytes(content)
    with pytest.raises(DatasetNotFoundError) as caught:
        load_cifar100(tmp_path, download=False)
    assert caught.value.expected_path == str(broken)
    assert "b'fine_labels'" in str(caught.value)
