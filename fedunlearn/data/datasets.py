"""Datasets as in-memory tensors, train and test splits apart, and the helpers their loaders share.

Every loader returns a :class:`DatasetSplits`: float32 inputs and int64 labels. The built-in
loaders (:mod:`fedunlearn.data.sources`, one module each, registered in
:mod:`fedunlearn.dataset_registry`) normalise inputs with statistics of the training split only, so
nothing about the test split leaks into training. :func:`load_dataset` loads a registered dataset
or a user's ``module:function`` loader (:mod:`fedunlearn.dataset_spec`).

``digits`` (scikit-learn's bundled 8x8 digits) needs no files and is the embedded default. The
others read the layouts torchvision and the UCI archive use under a data root, or a file or folder
of a common format (``image-folder``, ``table``, ``npz``, ``hf-disk``): ``fedunlearn data list``
prints each with what it expects.

Only ``download=True`` ever touches the network. :func:`load_dataset` does no caching; callers that
load the same dataset repeatedly cache the result themselves.
"""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path

import torch

from fedunlearn.data.splits import DatasetSplits, TensorSplit
from fedunlearn.errors import ConfigError, DatasetNotFoundError

__all__ = ["DatasetSplits", "TensorSplit", "load_dataset"]

# A feature whose training values are all equal has standard deviation 0; dividing by 1 instead
# leaves it centred at 0 rather than producing NaN or infinity.
MINIMUM_STD = 1e-12


def load_dataset(
    name: str,
    data_root: str | os.PathLike | None = None,
    *,
    download: bool = False,
    seed: int = 0,
    label_column: str = "label",
    test_fraction: float = 0.2,
) -> DatasetSplits:
    """Load a dataset's train and test splits as tensors.

    Parameters
    ----------
    name : str
        A registered dataset (``fedunlearn data list``) or a user's loader as
        ``"module:function"`` (:mod:`fedunlearn.dataset_spec`).
    data_root : str or os.PathLike, optional
        The folder (or, for a file format, the file) holding the dataset. Ignored for ``digits``;
        required for every other registered dataset.
    download : bool, default False
        Fetch missing files from the internet into ``data_root`` (created if absent). The only way
        this function touches the network. Ignored for ``digits``.
    seed : int, default 0
        Fixes any split the loader draws (``digits``' stratified train/test split, a file's
        ``test_fraction``); the other built-in datasets ship fixed splits.
    label_column, test_fraction
        For the file formats: the label's column, and the share held out when the data has no
        test split of its own.

    Returns
    -------
    DatasetSplits
        Checked by :func:`fedunlearn.dataset_spec.as_splits`. The built-in image datasets are
        scaled to [0, 1], then standardised per channel with the training split's mean and
        standard deviation; Adult's numeric columns are standardised with training statistics and
        its categorical columns one-hot encoded with the training categories.

    Raises
    ------
    ConfigError
        ``name`` is unknown, ``data_root`` is missing for a dataset that needs one, or it does not
        exist (and ``download`` is False), or a user's loader returned something unusable.
    DatasetNotFoundError
        A file the dataset needs is missing, unreadable, malformed, or could not be downloaded.
    """
    from fedunlearn.dataset_registry import DATASETS
    from fedunlearn.dataset_spec import DataSource

    spec = DATASETS.spec(name)
    root = None if data_root in (None, "") else Path(data_root).expanduser()
    if spec.needs_root and spec.name in DATASETS:
        root = _resolve_data_root(spec, root, download)
    source = DataSource(root, download, seed, label_column, test_fraction)
    return spec.load(source)


def layout_of(name: str) -> str:
    """What a registered dataset expects under its data root (its spec's ``layout``)."""
    from fedunlearn.dataset_registry import DATASETS

    return DATASETS[name].layout if name in DATASETS else "the files its loader reads"


def _resolve_data_root(spec, root: Path | None, download: bool) -> Path:
    """Check that ``root`` names a usable directory (or file, for a file format) and return it."""
    if root is None:
        raise ConfigError(
            "data-root",
            None,
            f"dataset {spec.name!r} needs a data root holding {spec.layout}; pass the folder "
            "that contains it, or use the embedded 'digits' dataset, which needs none",
        )
    if download and not root.exists():
        # Downloading into a fresh folder is the usual first run; refusing it would only add a step.
        root.mkdir(parents=True, exist_ok=True)
    if spec.root_is_file and root.is_file():
        return root
    if not root.is_dir():
        fix = (
            "pass the file or folder that holds the data"
            if spec.root_is_file
            else "pass an existing folder, or create it with `fedunlearn data download NAME --root "
            "DIR` (or --set download=true)"
        )
        raise ConfigError("data-root", str(root), f"it does not exist; {fix}")
    return root


def is_download_failure(error: Exception) -> bool:
    """Whether ``error`` is a failed fetch (no network, a refused mirror), not a bad file."""
    return isinstance(error, (urllib.error.URLError, ConnectionError, TimeoutError)) or str(
        error
    ).startswith("Error downloading")


def one_line(error: Exception, limit: int = 400) -> str:
    """``error``'s message on one line, every line of it (torchvision's first line, "Error
    downloading FILE:", holds no reason: each mirror's follows), cut at ``limit`` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _data_root_of(name: str, path: Path) -> Path:
    """The data root a file of dataset ``name``'s layout lies under (``path`` itself when it is
    not under the layout's top folder)."""
    top = layout_of(name).split("/")[0]
    return next((p.parent for p in [path, *path.parents] if p.name == top), path)


def missing_file(name: str, path: Path) -> DatasetNotFoundError:
    """The error for a file or folder that is not where the dataset's layout puts it."""
    hint = (
        f"fetch it with `fedunlearn data download {name} --root {_data_root_of(name, path)}` (or "
        f"--set download=true), or check that the data root holds {layout_of(name)}"
    )
    return DatasetNotFoundError(name, path, hint=hint)


def unreadable_file(name: str, path: Path, expected: str, error: Exception) -> DatasetNotFoundError:
    """The error for a file that exists but cannot be used, keeping the underlying reason."""
    reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    hint = f"found it unusable ({reason}); it should hold {expected}; replace it or fetch it again"
    return DatasetNotFoundError(name, path, hint=hint)


def download_failed(name: str, path: Path, error: Exception) -> DatasetNotFoundError:
    """The error for a download that could not reach its source."""
    hint = (
        "the download failed: the network is unreachable or every mirror refused "
        f"({one_line(error)}); copy {layout_of(name)} there from a machine that has them"
    )
    return DatasetNotFoundError(name, path, hint=hint)


def fetch_with_torchvision(name: str, dataset: str, root: Path, folder: Path, archive: str) -> None:
    """Download and extract ``archive`` through ``torchvision.datasets.<dataset>`` into ``root``
    (the only network access of the CIFAR loaders); a failure names ``folder`` and the cause."""
    import torchvision

    try:
        getattr(torchvision.datasets, dataset)(str(root), train=True, download=True)
    except Exception as error:  # network and archive errors alike
        expected = (
            f"the files of {archive} (download failed: check the network, or extract the "
            "archive there by hand)"
        )
        raise unreadable_file(name, folder, expected, error) from error


def standardize_images(train: torch.Tensor, test: torch.Tensor) -> None:
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
        stds[channel] = std if std > MINIMUM_STD else 1.0
    shape = (1, channels, 1, 1)
    for images in (train, test):
        images.sub_(means.float().view(shape)).div_(stds.float().view(shape))


def image_splits(
    name: str, train: tuple, test: tuple, scale: float, num_classes: int = 10
) -> DatasetSplits:
    """Package ``(images, labels)`` pairs of raw pixels as standardised splits.

    ``scale`` is the largest raw pixel value, which maps to 1 before standardising.
    """
    train_x = torch.as_tensor(train[0]).to(torch.float32, copy=True).div_(scale)
    test_x = torch.as_tensor(test[0]).to(torch.float32, copy=True).div_(scale)
    standardize_images(train_x, test_x)
    return DatasetSplits(
        name=name,
        train=TensorSplit(train_x, torch.as_tensor(train[1]).to(torch.int64)),
        test=TensorSplit(test_x, torch.as_tensor(test[1]).to(torch.int64)),
        num_classes=num_classes,
        input_shape=tuple(train_x.shape[1:]),
    )


def __getattr__(name: str):
    # DATASET_NAMES is read from the registry on each access, so a dataset registered later counts.
    if name == "DATASET_NAMES":
        from fedunlearn.dataset_registry import DATASETS

        return DATASETS.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
