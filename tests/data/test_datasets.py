"""Tests of fedunlearn.data.datasets on the bundled digits, synthetic files in tmp_path and, when present,
the real copies under $FEDUNLEARN_DATA_ROOT. Nothing here touches the network."""

from __future__ import annotations

import os
import pickle
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from fedunlearn.data.datasets import DATASET_NAMES, DatasetSplits, TensorSplit, load_dataset
from fedunlearn.errors import ConfigError, DatasetNotFoundError

SHARED_DATA = Path(os.environ.get("FEDUNLEARN_DATA_ROOT") or "/nonexistent")
needs_shared = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason="FEDUNLEARN_DATA_ROOT does not name a local copy of the datasets",
)

ADULT_TRAIN_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, >50K",
    "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, Black, Female, 0, 0, 40, ?, <=50K",
    "53, Private, 234721, 11th, 7, Married-civ-spouse, Handlers-cleaners, Husband, Black, Male, 0, 0, 40, Cuba, >50K",
]
ADULT_TEST_ROWS = [
    "25, Private, 226802, 11th, 7, Never-married, Adm-clerical, Husband, Black, Male, 0, 0, 40, United-States, <=50K.",
    "38, ?, 89814, HS-grad, 9, Divorced, ?, Not-in-family, White, Female, 0, 0, 50, ?, >50K.",
    "28, Never-worked, 336951, Bachelors, 13, Divorced, Exec-managerial, Husband, White, Male, 0, 0, 40, Atlantis, >50K.",
]
# Train categories per categorical column: workclass 4, education 3, marital-status 3, occupation 4,
# relationship 2, race 2, sex 2, native-country 3; plus the 6 numeric columns.
ADULT_SYNTHETIC_WIDTH = 6 + 4 + 3 + 3 + 4 + 2 + 2 + 2 + 3
ADULT_NUMERIC_POSITIONS = [
    0,
    5,
    9,
    23,
    24,
    25,
]  # age, fnlwgt, education-num, capital-gain/loss, hours
WORKCLASS_BLOCK = slice(
    1, 5
)  # sorted training categories: '?', Private, Self-emp-not-inc, State-gov


def write_adult(root: Path, train_rows=ADULT_TRAIN_ROWS, test_rows=ADULT_TEST_ROWS) -> Path:
    """Write adult.data and adult.test in the UCI format (test with its header line, blank tails)."""
    folder = root / "adult"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adult.data").write_text("\n".join(train_rows) + "\n\n")
    (folder / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(test_rows) + "\n\n")
    return folder


def write_cifar(root: Path, per_batch: int = 4, test_size: int = 6, seed: int = 0) -> dict:
    """Write a tiny cifar-10-batches-py folder; returns the raw train and test arrays written."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    raw = {"train_data": [], "train_labels": []}
    for number in range(1, 6):
        # Channels get different ranges, so a wrong reshape would show up as wrong per-channel stats.
        data = np.concatenate(
            [rng.integers(low, low + 100, size=(per_batch, 1024)) for low in (0, 60, 120)], axis=1
        ).astype(np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        raw["train_data"].append(data)
        raw["train_labels"].extend(labels)
        with (folder / f"data_batch_{number}").open("wb") as handle:
            pickle.dump({b"data": data, b"labels": labels}, handle)
    # The test split is much brighter than training, so normalising with test statistics would show.
    raw["test_data"] = rng.integers(150, 256, size=(test_size, 3072)).astype(np.uint8)
    raw["test_labels"] = rng.integers(0, 10, size=test_size).tolist()
    with (folder / "test_batch").open("wb") as handle:
        pickle.dump({b"data": raw["test_data"], b"labels": raw["test_labels"]}, handle)
    raw["train_data"] = np.concatenate(raw["train_data"])
    return raw


def assert_splits_well_formed(splits: DatasetSplits, num_classes: int, input_shape: tuple) -> None:
    assert splits.num_classes == num_classes
    assert splits.input_shape == input_shape
    for split in (splits.train, splits.test):
        assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
        assert tuple(split.x.shape) == (len(split), *input_shape)
        assert tuple(split.y.shape) == (len(split),)
        assert int(split.y.min()) >= 0 and int(split.y.max()) < num_classes
        assert torch.isfinite(split.x).all()


def assert_train_standardized_per_channel(x: torch.Tensor) -> None:
    channel_values = x.transpose(0, 1).reshape(x.shape[1], -1).double()
    means, stds = channel_values.mean(dim=1), channel_values.std(dim=1)
    assert torch.allclose(means, torch.zeros_like(means), atol=1e-4)
    assert torch.allclose(stds, torch.ones_like(stds), atol=1e-3)


# --- digits -------------------------------------------------------------------------------------


def test_digits_shapes_dtypes_and_classes():
    splits = load_dataset("digits")

    assert splits.name == "digits"
    assert_splits_well_formed(splits, num_classes=10, input_shape=(1, 8, 8))
    assert len(splits.train) + len(splits.test) == 1797
    assert len(splits.test) == 450  # 25 % of 1,797, rounded up as scikit-learn does
    assert set(splits.train.y.tolist()) == set(range(10)) == set(splits.test.y.tolist())


def test_digits_split_is_stratified():
    from sklearn.datasets import load_digits

    splits = load_dataset("digits", seed=1)
    totals = np.bincount(load_digits().target, minlength=10)
    test_counts = np.bincount(splits.test.y.numpy(), minlength=10)

    assert np.all(np.abs(test_counts - 0.25 * totals) <= 1)


def test_digits_train_and_test_partition_the_original_samples():
    from sklearn.datasets import load_digits

    splits = load_dataset("digits")
    standardized = (
        torch.cat([splits.train.x, splits.test.x]).reshape(-1, 64).numpy().astype(np.float64)
    )
    # Standardising is affine and increasing, and raw pixels span 0..16, so min and max map back.
    low, high = standardized.min(), standardized.max()
    recovered = np.rint((standardized - low) / (high - low) * 16).astype(np.int64)
    labels = torch.cat([splits.train.y, splits.test.y]).numpy()
    bunch = load_digits()

    def as_sorted_rows(pixels, targets):
        return sorted(map(bytes, np.column_stack([pixels, targets]).astype(np.int64)))

    # Equal multisets: every original sample is in exactly one of the splits.
    assert as_sorted_rows(recovered, labels) == as_sorted_rows(bunch.data, bunch.target)


def test_digits_seed_fixes_the_split():
    first, again = load_dataset("digits", seed=3), load_dataset("digits", seed=3)
    other = load_dataset("digits", seed=4)

    assert torch.equal(first.test.x, again.test.x) and torch.equal(first.test.y, again.test.y)
    assert not torch.equal(first.test.x, other.test.x)


def test_digits_train_split_is_standardized_and_data_root_is_ignored(tmp_path):
    splits = load_dataset("digits", tmp_path / "does-not-exist")

    assert_train_standardized_per_channel(splits.train.x)


# --- errors -------------------------------------------------------------------------------------


def test_unknown_dataset_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        load_dataset("mnist-3d")
    assert caught.value.parameter == "dataset"
    assert "one of " + ", ".join(DATASET_NAMES) in str(caught.value)


@pytest.mark.parametrize(
    "name, layout",
    [
        ("mnist", "MNIST/raw"),
        ("fashion-mnist", "FashionMNIST/raw"),
        ("cifar10", "cifar-10-batches-py"),
        ("adult", "adult/adult.data"),
    ],
)
def test_missing_data_root_says_what_it_must_hold(name, layout):
    with pytest.raises(ConfigError) as caught:
        load_dataset(name)
    assert caught.value.parameter == "data-root" and caught.value.value is None
    assert layout in str(caught.value)


@pytest.mark.parametrize("name", ["mnist", "cifar10", "adult"])
def test_data_root_that_is_not_a_directory_is_a_config_error(name, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    for root in (tmp_path / "missing", a_file):
        with pytest.raises(ConfigError) as caught:
            load_dataset(name, root)
        assert caught.value.parameter == "data-root"
        assert str(root) in str(caught.value) and "does not exist" in str(caught.value)


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_missing_idx_file_is_named_exactly(name, folder, tmp_path):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte").write_bytes(b"")

    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset(name, tmp_path)
    assert caught.value.expected_path == str(raw / "train-labels-idx1-ubyte")
    # the command-line spelling, with the root the user gave, not Python's download=True
    assert f"`fedunlearn data download {name} --root {tmp_path}`" in str(caught.value)
    assert "download=True" not in str(caught.value)


def test_corrupt_idx_files_give_one_clear_error(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for file_name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (raw / file_name).write_bytes(b"definitely not an IDX file")

    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("mnist", tmp_path)
    assert caught.value.expected_path == str(raw)
    assert caught.value.__cause__ is not None  # the underlying reason stays reachable


# --- cifar10 ------------------------------------------------------------------------------------


def test_cifar_synthetic_layout_loads_and_normalises_with_train_statistics(tmp_path):
    raw = write_cifar(tmp_path)
    splits = load_dataset("cifar10", tmp_path)

    assert_splits_well_formed(splits, num_classes=10, input_shape=(3, 32, 32))
    assert (len(splits.train), len(splits.test)) == (20, 6)
    assert splits.train.y.tolist() == raw["train_labels"]
    assert splits.test.y.tolist() == raw["test_labels"]
    assert_train_standardized_per_channel(splits.train.x)

    train_pixels = raw["train_data"].reshape(-1, 3, 32, 32) / 255.0
    mean = train_pixels.mean(axis=(0, 2, 3), keepdims=True)
    std = train_pixels.std(axis=(0, 2, 3), keepdims=True)
    expected_test = (raw["test_data"].reshape(-1, 3, 32, 32) / 255.0 - mean) / std
    assert np.allclose(splits.test.x.numpy(), expected_test, atol=1e-4)
    assert (
        splits.test.x.mean() > 1.0
    )  # the brighter test split stays visibly shifted, not re-centred


def test_cifar_download_is_skipped_when_the_folder_exists(tmp_path, monkeypatch):
    import torchvision

    write_cifar(tmp_path)

    def no_network(*args, **kwargs):
        raise AssertionError("CIFAR10 download attempted although the folder exists")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", no_network)
    assert len(load_dataset("cifar10", tmp_path, download=True).train) == 20


def test_cifar_missing_batch_is_named(tmp_path):
    write_cifar(tmp_path)
    missing = tmp_path / "cifar-10-batches-py" / "data_batch_5"
    missing.unlink()

    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("cifar10", tmp_path)
    assert caught.value.expected_path == str(missing)
    assert f"`fedunlearn data download cifar10 --root {tmp_path}`" in str(caught.value)


@pytest.mark.parametrize(
    "content",
    [
        b"not a pickle",
        pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}),
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}),
        pickle.dumps({b"images": np.zeros((2, 3072), np.uint8)}),
    ],
    ids=["garbage", "wrong-width", "label-out-of-range", "wrong-keys"],
)
def test_cifar_malformed_batch_is_reported_with_its_path(content, tmp_path):
    write_cifar(tmp_path)
    broken = tmp_path / "cifar-10-batches-py" / "test_batch"
    broken.write_bytes(content)

    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("cifar10", tmp_path)
    assert caught.value.expected_path == str(broken)
    assert "b'data'" in str(caught.value)


# --- adult --------------------------------------------------------------------------------------


def test_adult_synthetic_files_parse_and_encode(tmp_path):
    write_adult(tmp_path)
    splits = load_dataset("adult", tmp_path)

    assert_splits_well_formed(splits, num_classes=2, input_shape=(ADULT_SYNTHETIC_WIDTH,))
    assert splits.train.y.tolist() == [0, 1, 0, 1]
    assert splits.test.y.tolist() == [0, 1, 1]  # the trailing '.' of adult.test is understood

    one_hot_positions = [
        i for i in range(ADULT_SYNTHETIC_WIDTH) if i not in ADULT_NUMERIC_POSITIONS
    ]
    train_one_hot = splits.train.x[:, one_hot_positions]
    assert set(train_one_hot.unique().tolist()) == {0.0, 1.0}
    assert train_one_hot.sum(dim=1).tolist() == [8.0] * 4  # one category per categorical column
    test_one_hot = splits.test.x[:, one_hot_positions]
    # Row 2 has two categories unseen in training (Never-worked, Atlantis): two all-zero blocks.
    assert test_one_hot.sum(dim=1).tolist() == [8.0, 8.0, 6.0]
    assert splits.test.x[1, WORKCLASS_BLOCK].tolist() == [1.0, 0.0, 0.0, 0.0]  # '?' is a category
    assert splits.test.x[2, WORKCLASS_BLOCK].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_adult_numeric_columns_use_training_statistics(tmp_path):
    write_adult(tmp_path)
    splits = load_dataset("adult", tmp_path)
    train_ages = np.array([39, 50, 38, 53], dtype=np.float64)

    expected_train_ages = (train_ages - train_ages.mean()) / train_ages.std()  # population std
    assert np.allclose(splits.train.x[:, 0].numpy(), expected_train_ages, atol=1e-5)
    expected_test_ages = (np.array([25, 38, 28]) - train_ages.mean()) / train_ages.std()
    assert np.allclose(splits.test.x[:, 0].numpy(), expected_test_ages, atol=1e-5)


def test_adult_missing_test_file_is_named(tmp_path):
    folder = write_adult(tmp_path)
    (folder / "adult.test").unlink()

    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("adult", tmp_path)
    assert caught.value.expected_path == str(folder / "adult.test")
    assert f"`fedunlearn data download adult --root {tmp_path}`" in str(caught.value)


@pytest.mark.parametrize(
    "bad_row, complaint",
    [
        ("39, State-gov, 77516", "missing fields"),
        (ADULT_TRAIN_ROWS[0].replace("<=50K", "maybe"), "income labels"),
        (ADULT_TRAIN_ROWS[0].replace("39,", "old,", 1), "age"),
        (ADULT_TRAIN_ROWS[0] + ", extra", "15 comma-separated"),
    ],
    ids=["short-row", "unknown-label", "non-numeric-age", "long-row"],
)
def test_adult_malformed_rows_are_reported_with_the_file(bad_row, complaint, tmp_path):
    folder = write_adult(tmp_path, train_rows=ADULT_TRAIN_ROWS + [bad_row])

    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("adult", tmp_path)
    assert caught.value.expected_path == str(folder / "adult.data")
    assert complaint in str(caught.value)


def test_adult_download_fetches_only_missing_files_into_the_root(tmp_path, monkeypatch):
    requested = []

    def fake_retrieve(url, destination):
        requested.append(url)
        rows = ADULT_TEST_ROWS if url.endswith("adult.test") else ADULT_TRAIN_ROWS
        header = "|1x3 Cross validator\n" if url.endswith("adult.test") else ""
        Path(destination).write_text(header + "\n".join(rows) + "\n")

    monkeypatch.setattr(urllib.request, "urlretrieve", fake_retrieve)
    root = tmp_path / "fresh" / "root"  # created because download=True
    splits = load_dataset("adult", root, download=True)

    assert [url.rsplit("/", 1)[1] for url in requested] == ["adult.data", "adult.test"]
    assert (len(splits.train), len(splits.test)) == (4, 3)
    assert load_dataset("adult", root, download=True).input_shape == splits.input_shape
    assert len(requested) == 2  # the second load found both files and fetched nothing


def test_adult_download_failure_names_the_file_and_leaves_no_partial(tmp_path, monkeypatch):
    def failing_retrieve(url, destination):
        Path(destination).write_text("half a fi")
        raise OSError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlretrieve", failing_retrieve)
    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("adult", tmp_path, download=True)
    assert caught.value.expected_path == str(tmp_path / "adult" / "adult.data")
    assert "archive.ics.uci.edu" in str(caught.value) and "network is unreachable" in str(
        caught.value
    )
    assert list((tmp_path / "adult").iterdir()) == []


# --- containers and package boundary ------------------------------------------------------------


def test_tensor_split_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="3 inputs and 2 labels"):
        TensorSplit(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64))


# --- real copies (skipped unless FEDUNLEARN_DATA_ROOT names them) ------------------------------------


@needs_shared
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_idx_datasets(name):
    splits = load_dataset(name, SHARED_DATA)

    assert_splits_well_formed(splits, num_classes=10, input_shape=(1, 28, 28))
    assert (len(splits.train), len(splits.test)) == (60_000, 10_000)
    assert set(splits.train.y.tolist()) == set(range(10)) == set(splits.test.y.tolist())
    assert_train_standardized_per_channel(splits.train.x)


@needs_shared
def test_real_adult():
    splits = load_dataset("adult", SHARED_DATA)

    assert_splits_well_formed(splits, num_classes=2, input_shape=splits.input_shape)
    assert (len(splits.train), len(splits.test)) == (32_561, 16_281)
    assert set(splits.train.y.tolist()) == {0, 1} == set(splits.test.y.tolist())
    # About a quarter of adults earn more than 50K in both files.
    assert 0.2 < splits.train.y.float().mean() < 0.3 and 0.2 < splits.test.y.float().mean() < 0.3


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_a_download_without_network_says_so_and_leaves_nothing_behind(tmp_path, monkeypatch, name):
    import urllib.error

    import torchvision.datasets.mnist as torchvision_mnist

    def unreachable(url, **kwargs):
        raise urllib.error.URLError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(torchvision_mnist, "download_and_extract_archive", unreachable)
    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset(name, tmp_path, download=True)
    said = str(caught.value)
    assert "the network is unreachable" in said
    # the cause, which torchvision puts below its first line ("Error downloading FILE:"), on one line
    assert "[Errno 101] Network is unreachable" in said and "\n" not in said, said
    assert list(tmp_path.iterdir()) == []  # no empty MNIST/raw/ to be mistaken for the data
