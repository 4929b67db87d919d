"""Load the benchmark datasets as in-memory tensors, train and test splits apart.

Every loader returns a :class:`DatasetSplits`: float32 inputs and int64 labels, with inputs normalised
using statistics of the training split only, so nothing about the test split leaks into training.

``digits`` (scikit-learn's bundled 8x8 digits) needs no files and is the embedded default. The others
read the layouts torchvision and the UCI archive use under a data root:

- ``mnist``: ``<root>/MNIST/raw/`` (un-gzipped IDX files)
- ``fashion-mnist``: ``<root>/FashionMNIST/raw/`` (un-gzipped IDX files)
- ``cifar10``: ``<root>/cifar-10-batches-py/`` (pickled ``data_batch_1..5`` and ``test_batch``)
- ``adult``: ``<root>/adult/adult.data`` and ``<root>/adult/adult.test``

Only ``download=True`` ever touches the network. :func:`load_dataset` does no caching; callers that
load the same dataset repeatedly cache the result themselves.
"""

from __future__ import annotations

import os
import pickle
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedunlearn.errors import ConfigError, DatasetNotFoundError

DATASET_NAMES = ("digits", "mnist", "fashion-mnist", "cifar10", "adult", "cifar100")

# What each dataset expects under the data root, quoted in error messages.
_EXPECTED_LAYOUT = {
    "mnist": "MNIST/raw/ (the un-gzipped IDX files)",
    "fashion-mnist": "FashionMNIST/raw/ (the un-gzipped IDX files)",
    "cifar10": "cifar-10-batches-py/ (data_batch_1..5 and test_batch)",
    "adult": "adult/adult.data and adult/adult.test",
    "cifar100": "cifar-100-python/ (the pickled train and test files)",  # until the registry
}
_IDX_FOLDERS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_CIFAR_FOLDER = "cifar-10-batches-py"
_CIFAR_BATCHES = tuple(f"data_batch_{number}" for number in range(1, 6))
_ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
_ADULT_FILES = ("adult.data", "adult.test")
_ADULT_COLUMNS = (
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
_ADULT_NUMERIC = frozenset(
    ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
)
_ADULT_LABELS = {"<=50K": 0, ">50K": 1}

# A feature whose training values are all equal has standard deviation 0; dividing by 1 instead
# leaves it centred at 0 rather than producing NaN or infinity.
_MINIMUM_STD = 1e-12


# eq=False: the generated __eq__ would compare tensors element-wise and then fail to truth-test the
# result; identity is the meaningful comparison for these containers.
@dataclass(frozen=True, eq=False)
class TensorSplit:
    """One split of a dataset, held as tensors.

    Attributes
    ----------
    x : torch.Tensor
        Inputs, float32, shape ``(N, *input_shape)``.
    y : torch.Tensor
        Class labels, int64, shape ``(N,)``.
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"TensorSplit needs one label per input: found {self.x.shape[0]} inputs and "
                f"{self.y.shape[0]} labels"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """A dataset's train and test splits with what a model needs to know about them.

    Attributes
    ----------
    name : str
        One of :data:`DATASET_NAMES`.
    train, test : TensorSplit
        The splits; inputs are normalised with training statistics only.
    num_classes : int
        Number of classes; labels lie in ``range(num_classes)``.
    input_shape : tuple of int
        Shape of one input sample, e.g. ``(1, 28, 28)``.
    """

    name: str
    train: TensorSplit
    test: TensorSplit
    num_classes: int
    input_shape: tuple[int, ...]


def load_dataset(
    name: str,
    data_root: str | os.PathLike | None = None,
    *,
    download: bool = False,
    seed: int = 0,
) -> DatasetSplits:
    """Load a dataset's train and test splits as normalised tensors.

    Parameters
    ----------
    name : str
        One of :data:`DATASET_NAMES`.
    data_root : str or os.PathLike, optional
        Folder holding the dataset in the layout described in the module docstring. Ignored for
        ``digits``; required for every other dataset.
    download : bool, default False
        Fetch missing files from the internet into ``data_root`` (created if absent). The only way
        this function touches the network. Ignored for ``digits``.
    seed : int, default 0
        Fixes the stratified train/test split of ``digits``; the other datasets ship fixed splits.

    Returns
    -------
    DatasetSplits
        Image inputs are scaled to [0, 1], then standardised per channel with the training split's
        mean and standard deviation. Adult's numeric columns are standardised with training
        statistics and its categorical columns one-hot encoded with the training categories.

    Raises
    ------
    ConfigError
        ``name`` is unknown, ``data_root`` is missing for a dataset that needs one, or it is not an
        existing directory (and ``download`` is False).
    DatasetNotFoundError
        A file the dataset needs is missing, unreadable, malformed, or could not be downloaded.
    """
    if name not in DATASET_NAMES:
        raise ConfigError("dataset", name, "one of " + ", ".join(DATASET_NAMES))
    if name == "digits":
        return _load_digits(seed)
    root = _resolve_data_root(name, data_root, download)
    if name in _IDX_FOLDERS:
        return _load_idx_dataset(name, root, download)
    if name == "cifar10":
        return _load_cifar10(root, download)
    if name == "cifar100":  # until the dataset registry lands (issue 44)
        # Resolved by name, as a registry's "module:function" is: fedunlearn.data.cifar100 uses
        # this module's helpers, and an import back would close a circle.
        import importlib

        return importlib.import_module("fedunlearn.data.cifar100").load_cifar100(root, download)
    return _load_adult(root, download)


def _resolve_data_root(name: str, data_root: str | os.PathLike | None, download: bool) -> Path:
    """Check that ``data_root`` names a usable directory and return it as a path."""
    if data_root is None:
        raise ConfigError(
            "data-root",
            None,
            f"dataset {name!r} needs a data root holding {_EXPECTED_LAYOUT[name]}; pass the folder "
            "that contains it, or use the embedded 'digits' dataset, which needs none",
        )
    root = Path(data_root).expanduser()
    if download and not root.exists():
        # Downloading into a fresh folder is the usual first run; refusing it would only add a step.
        root.mkdir(parents=True, exist_ok=True)
    if not root.is_dir():
        raise ConfigError(
            "data-root",
            str(root),
            "the directory does not exist; pass an existing folder, or create it with "
            "`fedunlearn data download NAME --root DIR` (or --set download=true)",
        )
    return root


def _is_download_failure(error: Exception) -> bool:
    """Whether ``error`` is a failed fetch (no network, a refused mirror), not a bad file."""
    return isinstance(error, (urllib.error.URLError, ConnectionError, TimeoutError)) or str(
        error
    ).startswith("Error downloading")


def _one_line(error: Exception, limit: int = 400) -> str:
    """``error``'s message on one line, every line of it (torchvision's first line, "Error
    downloading FILE:", holds no reason: each mirror's follows), cut at ``limit`` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _data_root_of(name: str, path: Path) -> Path:
    """The data root a file of dataset ``name``'s layout lies under (``path`` itself when it is
    not under the layout's top folder)."""
    top = _EXPECTED_LAYOUT[name].split("/")[0]
    return next((p.parent for p in [path, *path.parents] if p.name == top), path)


def _missing(name: str, path: Path) -> DatasetNotFoundError:
    """The error for a file or folder that is not where the dataset's layout puts it."""
    hint = (
        f"fetch it with `fedunlearn data download {name} --root {_data_root_of(name, path)}` (or "
        f"--set download=true), or check that the data root holds {_EXPECTED_LAYOUT[name]}"
    )
    return DatasetNotFoundError(name, path, hint=hint)


def _unreadable(name: str, path: Path, expected: str, error: Exception) -> DatasetNotFoundError:
    """The error for a file that exists but cannot be used, keeping the underlying reason."""
    reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    hint = f"found it unusable ({reason}); it should hold {expected}; replace it or fetch it again"
    return DatasetNotFoundError(name, path, hint=hint)


def _standardize_images(train: torch.Tensor, test: torch.Tensor) -> None:
    """Standardise float images ``(N, C, H, W)`` in place, per channel, with training statistics."""
    channels = train.shape[1]
    means = torch.empty(channels, dtype=torch.float64)
    stds = torch.empty(channels, dtype=torch.float64)
    for channel in range(channels):
        values = train[:, channel]
        # Accumulate in float64: tens of millions of float32 pixels lose digits when summed in float32.
        mean = values.mean(dtype=torch.float64)
        std = (values - mean.float()).square().mean(dtype=torch.float64).sqrt()
        means[channel] = mean
        stds[channel] = std if std > _MINIMUM_STD else 1.0
    shape = (1, channels, 1, 1)
    for images in (train, test):
        images.sub_(means.float().view(shape)).div_(stds.float().view(shape))


def _image_splits(name: str, train: tuple, test: tuple, scale: float) -> DatasetSplits:
    """Package ``(images, labels)`` pairs of raw pixels as standardised splits of a 10-class dataset.

    ``scale`` is the largest raw pixel value, which maps to 1 before standardising.
    """
    train_x = torch.as_tensor(train[0]).to(torch.float32, copy=True).div_(scale)
    test_x = torch.as_tensor(test[0]).to(torch.float32, copy=True).div_(scale)
    _standardize_images(train_x, test_x)
    return DatasetSplits(
        name=name,
        train=TensorSplit(train_x, torch.as_tensor(train[1]).to(torch.int64)),
        test=TensorSplit(test_x, torch.as_tensor(test[1]).to(torch.int64)),
        num_classes=10,
        input_shape=tuple(train_x.shape[1:]),
    )


def _load_digits(seed: int) -> DatasetSplits:
    """scikit-learn's bundled 8x8 digits, split 75/25 with stratification on the label."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32)[:, np.newaxis]  # (N, 1, 8, 8), values 0..16
    labels = np.asarray(bunch.target, dtype=np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.25, stratify=labels, random_state=seed
    )
    return _image_splits("digits", (train_x, train_y), (test_x, test_y), scale=16.0)


def _load_idx_dataset(name: str, root: Path, download: bool) -> DatasetSplits:
    """MNIST or Fashion-MNIST through torchvision, which reads the raw IDX files."""
    raw_folder = root / _IDX_FOLDERS[name] / "raw"
    if not download:
        # Checked here so that the error names the exact missing file; torchvision's does not.
        for file_name in _IDX_FILES:
            if not (raw_folder / file_name).is_file():
                raise _missing(name, raw_folder / file_name)
    # Imported here because torchvision is slow to import and only the image downloads need it.
    import torchvision

    dataset_class = (
        torchvision.datasets.MNIST if name == "mnist" else torchvision.datasets.FashionMNIST
    )
    created = download and not (root / _IDX_FOLDERS[name]).exists()
    try:
        train = dataset_class(str(root), train=True, download=download)
        test = dataset_class(str(root), train=False, download=download)
    except (
        Exception
    ) as error:  # torchvision raises RuntimeError, OSError, ValueError...: report one
        if created:  # nothing half-fetched stays behind to be mistaken for the dataset
            shutil.rmtree(root / _IDX_FOLDERS[name], ignore_errors=True)
        if download and _is_download_failure(error):
            raise DatasetNotFoundError(
                name,
                raw_folder,
                hint="the download failed: the network is unreachable or every mirror refused "
                f"({_one_line(error)}); copy {_EXPECTED_LAYOUT[name]} there from a "
                "machine that has them",
            ) from error
        raise _unreadable(
            name, raw_folder, "the four IDX files, readable by torchvision", error
        ) from error
    return _image_splits(
        name,
        (train.data.unsqueeze(1), train.targets),
        (test.data.unsqueeze(1), test.targets),
        scale=255.0,
    )


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled CIFAR-10 batch; returns uint8 images (N, 3, 32, 32) and int64 labels (N,)."""
    if not path.is_file():
        raise _missing("cifar10", path)
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
        raise _unreadable("cifar10", path, expected, error) from error
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar10(root: Path, download: bool) -> DatasetSplits:
    """CIFAR-10 from torchvision's pickled layout, read directly.

    torchvision's own class verifies md5 sums, which would reject anything but the official files;
    reading the pickles here keeps small synthetic copies usable in tests.
    """
    folder = root / _CIFAR_FOLDER
    if download and not folder.is_dir():
        import torchvision

        try:
            torchvision.datasets.CIFAR10(str(root), train=True, download=True)
        except Exception as error:  # network and archive errors alike
            expected = (
                "the batches of cifar-10-python.tar.gz (download failed: check the network, or "
                "extract the archive there by hand)"
            )
            raise _unreadable("cifar10", folder, expected, error) from error
    train_parts = [_read_cifar_batch(folder / batch_name) for batch_name in _CIFAR_BATCHES]
    test = _read_cifar_batch(folder / "test_batch")
    train_images = np.concatenate([images for images, _ in train_parts])
    train_labels = np.concatenate([labels for _, labels in train_parts])
    return _image_splits("cifar10", (train_images, train_labels), test, scale=255.0)


def _download_adult(folder: Path) -> None:
    """Fetch whichever of adult.data and adult.test is missing from the UCI archive."""
    folder.mkdir(parents=True, exist_ok=True)
    for file_name in _ADULT_FILES:
        target = folder / file_name
        if target.is_file():
            continue
        partial = target.with_name(file_name + ".part")
        try:
            urllib.request.urlretrieve(_ADULT_URL + file_name, partial)
            # Renamed only once complete, so an interrupted download never looks like a good file.
            os.replace(partial, target)
        except Exception as error:
            partial.unlink(missing_ok=True)
            expected = (
                f"the file at {_ADULT_URL + file_name} (download failed: check the network, or "
                "copy the file there by hand)"
            )
            raise _unreadable("adult", target, expected, error) from error


def _read_adult_file(path: Path):
    """Parse one Adult file into a DataFrame (numbers as float, categories as text) and 0/1 labels."""
    import pandas as pd

    if not path.is_file():
        raise _missing("adult", path)
    try:
        with path.open("r", encoding="utf-8") as handle:
            first_line = handle.readline()
        # adult.test opens with a non-data line such as "|1x3 Cross validator".
        frame = pd.read_csv(
            path,
            header=None,
            names=list(_ADULT_COLUMNS),
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
        unknown = sorted(set(label_text) - set(_ADULT_LABELS))
        if unknown:
            raise ValueError(f"found income labels {unknown[:5]}")
        labels = label_text.map(_ADULT_LABELS).to_numpy(dtype=np.int64, copy=True)
        for column in _ADULT_NUMERIC:
            try:
                frame[column] = pd.to_numeric(frame[column]).astype(np.float64)
            except ValueError as error:
                raise ValueError(f"column {column!r}: {error}") from error
    except Exception as error:  # parser, encoding and content errors alike: one clear message
        expected = "15 comma-separated columns per row, numeric columns as numbers, income '<=50K' or '>50K'"
        raise _unreadable("adult", path, expected, error) from error
    return frame, labels


def _encode_adult(train_frame, test_frame) -> tuple[np.ndarray, np.ndarray]:
    """Encode both frames with training statistics: numerics standardised, categoricals one-hot.

    Features keep the column order of the files; each categorical column becomes a block with one
    entry per category seen in training, sorted. A test category never seen in training encodes as an
    all-zero block, the honest answer for a value the model never saw.
    """
    import pandas as pd

    train_blocks, test_blocks = [], []
    for column in _ADULT_COLUMNS[:-1]:
        if column in _ADULT_NUMERIC:
            train_values = train_frame[column].to_numpy()
            mean, std = train_values.mean(), train_values.std()
            std = std if std > _MINIMUM_STD else 1.0
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


def _load_adult(root: Path, download: bool) -> DatasetSplits:
    """UCI Adult (Census Income): tabular features, label 1 for income above 50K."""
    folder = root / "adult"
    if download and not all((folder / file_name).is_file() for file_name in _ADULT_FILES):
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
