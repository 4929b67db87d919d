"""What a dataset is to a run: a :class:`DatasetSpec` (its loader and facts) in a registry of them.

A run's ``dataset`` key names a registered dataset (:mod:`fedunlearn.dataset_registry`) or a
user's own loader as ``"module:function"`` (``dataset = "mypkg.data:load"``), imported at launch
and checked like every key: no file of the package is edited to bring a dataset
(``docs/adding-a-dataset.md``). A loader is called as ``load(source)`` with a :class:`DataSource`
(the run's ``data-root``, ``download``, ``seed``, ``label-column`` and ``test-fraction``) and
returns a :class:`fedunlearn.data.datasets.DatasetSplits`, or the four arrays
``(x_train, y_train, x_test, y_test)``, which :func:`as_splits` checks and packages.

This module imports neither PyTorch nor NumPy until a dataset is loaded, so the run config can be
checked without them.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError
from fedunlearn.spec_registry import SPEC_NAME, SpecRegistry, is_import_reference

__all__ = ["SPEC_NAME", "DataSource", "DatasetRegistry", "DatasetSpec", "is_import_reference"]

#: Models ``auto`` picks for a dataset whose samples are only known once loaded (a file's data):
#: by sample rank, then for images by the smaller side (the 5x5 convolutions of mnist-cnn and
#: cifar10-cnn need sides of at least 16).
_AUTO_BY_RANK = {1: "adult-mlp"}


def imported(key: str, reference: str) -> Callable[..., Any]:
    """The callable ``reference`` (``module:function``) names, imported now; a module that does
    not import or a name it lacks is a :class:`ConfigError` on ``key``."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may raise anything while importing
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError(
            key,
            reference,
            f"an importable module:function; importing {module_name!r} failed ({reason}); name "
            "its folder with code-path (or put it on PYTHONPATH)",
        ) from None
    target = getattr(module, attribute, None)
    if not callable(target):
        raise ConfigError(key, reference, f"a function of module {module_name!r}; it has none")
    return target


def on_python_path(folder: str) -> None:
    """Put ``folder`` (``code-path``) first on ``sys.path`` of this process, once; a folder that
    does not exist is a :class:`ConfigError` on ``code-path``."""
    import sys

    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError("code-path", folder, "an existing folder holding your module(s)")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
        importlib.invalidate_caches()


def check_signature(key: str, reference: str, target: Callable[..., Any], arguments: int) -> None:
    """``target`` accepts ``arguments`` positional arguments, or a :class:`ConfigError` on
    ``key`` quoting its signature."""
    try:
        signature = inspect.signature(target)
        signature.bind(*range(arguments))
    except (TypeError, ValueError):
        try:
            shown = str(inspect.signature(target))
        except (TypeError, ValueError):
            shown = "(unknown)"
        raise ConfigError(
            key, reference, f"a function taking {arguments} argument(s); its signature is {shown}"
        ) from None


@dataclass(frozen=True)
class DataSource:
    """Where and how a loader finds its data: the run's data keys, as a loader receives them.

    Attributes
    ----------
    root : pathlib.Path or None
        ``data-root``: the folder (or, for a file format, the file) holding the data; None when
        the run sets none (the embedded digits need none).
    download : bool
        ``download``: fetch missing files; the only way a loader may touch the network.
    seed : int
        ``seed``: fixes any split the loader draws (digits' train/test split, ``test-fraction``).
    label_column : str
        ``label-column``: the label's column in a table or a Hugging Face dataset.
    test_fraction : float
        ``test-fraction``: the share held out as the test split when the data has none of its own.
    """

    root: Path | None = None
    download: bool = False
    seed: int = 0
    label_column: str = "label"
    test_fraction: float = 0.2

    def require_root(self, dataset: str, layout: str) -> Path:
        """``root``, or a :class:`ConfigError` on ``data-root`` saying what it must hold."""
        if self.root is None:
            raise ConfigError(
                "data-root",
                None,
                f"dataset {dataset!r} needs a data root holding {layout}; pass it, or use the "
                "embedded 'digits' dataset, which needs none",
            )
        return self.root


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: how to load it and what a run may know of it before it is loaded.

    Parameters
    ----------
    name : str
        What ``dataset`` says: a registered name, or a user's ``module:function``.
    loader : str or callable
        ``load(source: DataSource) -> DatasetSplits`` (or the four arrays, see :func:`as_splits`),
        as ``"module:function"`` (imported on use) or the function itself.
    description : str
        One line for ``fedunlearn data list`` and the documentation.
    default_model : str
        The model ``model = "auto"`` picks; "" to pick by the loaded samples' shape
        (:func:`auto_model_for`).
    num_classes, sample_shape : int and tuple of int, optional
        Known before loading (the built-in datasets): the run config's class keys and the model
        are checked against them at launch; None: checked once the data is loaded.
    needs_root : bool
        Whether ``data-root`` must be set (everything but the embedded digits).
    layout : str
        What ``data-root`` holds, quoted in errors.
    downloads : str
        What ``download = true`` fetches ("": nothing; the data must be on disk).
    root_is_file : bool
        ``data-root`` may name a file (a table, an ``.npz``) rather than a folder.
    """

    name: str
    loader: str | Callable[..., Any]
    description: str = ""
    default_model: str = ""
    num_classes: int | None = None
    sample_shape: tuple[int, ...] | None = None
    needs_root: bool = True
    layout: str = ""
    downloads: str = ""
    root_is_file: bool = False

    def resolve(self) -> Callable[..., Any]:
        """The loader as a callable."""
        if callable(self.loader):
            return self.loader
        return imported("dataset", self.loader)

    def load(self, source: DataSource):
        """Load the splits (:func:`as_splits` checks what the loader returned)."""
        return as_splits(self.name, self.resolve()(source))


class DatasetRegistry(SpecRegistry[DatasetSpec]):
    """Name -> :class:`DatasetSpec`, in registration order (the ``dataset`` key's choices)."""

    key, spec_class, user_description = "dataset", DatasetSpec, "a user's loader"
    entry_point_group, installed_facts = "fedunlearn.datasets", {"needs_root": False}

    def allowed(self) -> str:
        return allowed_datasets(self)


def allowed_datasets(registry: DatasetRegistry) -> str:
    """What ``dataset`` accepts, for error messages and the configuration page."""
    return (
        f"one of {', '.join(registry.names())}, or your own loader as 'module:function' "
        "(docs/adding-a-dataset.md)"
    )


def check_loader(reference: str, value: str | None = None) -> None:
    """A user's loader (``reference``: ``module:function``) imports and takes one argument (the
    source); errors name ``dataset = value`` (the entry's name when a package installed it)."""
    check_signature("dataset", value or reference, imported("dataset", reference), 1)


def auto_model_for(sample_shape: Sequence[int]) -> str:
    """The built-in model ``auto`` picks for samples of ``sample_shape`` when the dataset names
    none: an MLP for feature vectors; for images, the digits CNN when a side is under 16 pixels,
    else the MNIST CNN (one channel) or the CIFAR-10 CNN (several)."""
    shape = tuple(int(side) for side in sample_shape)
    if len(shape) in _AUTO_BY_RANK:
        return _AUTO_BY_RANK[len(shape)]
    if len(shape) != 3:
        raise ConfigError(
            "model",
            "auto",
            f"a model of your own for samples of shape {shape} (auto knows (F,) and (C, H, W))",
        )
    channels, height, width = shape
    if min(height, width) < 16:
        return "digits-cnn"
    return "mnist-cnn" if channels == 1 else "cifar10-cnn"


# ---------------------------------------------------------------------- what a loader returns
def as_splits(name: str, result: Any):
    """A loader's result as checked :class:`~fedunlearn.data.datasets.DatasetSplits`.

    A loader may return ``DatasetSplits`` or ``(x_train, y_train, x_test, y_test)`` (NumPy arrays
    or tensors; inputs are used as given, so a user's loader normalises its own data). Either is
    checked: float inputs that are all finite, integer labels in ``range(num_classes)`` with at
    least two classes, one label per input, the same sample shape in both splits, and samples in
    both. Anything else is a :class:`ConfigError` on ``dataset`` naming what is wrong.
    """
    from fedunlearn.data.splits import DatasetSplits

    if isinstance(result, DatasetSplits):
        splits = result
    elif isinstance(result, tuple | list) and len(result) == 4:
        train = _tensor_split(name, "train", result[0], result[1])
        test = _tensor_split(name, "test", result[2], result[3])
        classes = int(max(train.y.max(), test.y.max())) + 1
        splits = DatasetSplits(name, train, test, classes, tuple(train.x.shape[1:]))
    else:
        raise ConfigError(
            "dataset",
            name,
            "a loader returning DatasetSplits or (x_train, y_train, x_test, y_test); it returned "
            f"{type(result).__name__}",
        )
    _check_splits(name, splits)
    return splits


def _tensor_split(name: str, which: str, x: Any, y: Any):
    import numpy as np
    import torch

    from fedunlearn.data.splits import TensorSplit

    try:
        inputs = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
        labels = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ConfigError(
            "dataset", name, f"numeric arrays for x_{which} and y_{which} ({error})"
        ) from None
    if inputs.is_floating_point() is False and inputs.dtype not in (
        torch.uint8,
        torch.int64,
        torch.int32,
    ):
        raise ConfigError("dataset", name, f"numeric x_{which}; it holds {inputs.dtype}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ConfigError(
            "dataset", name, f"integer class labels in y_{which}; they are {labels.dtype}"
        )
    if labels.dim() != 1 or inputs.dim() < 2 or inputs.shape[0] != labels.shape[0]:
        raise ConfigError(
            "dataset",
            name,
            f"x_{which} of shape (N, ...) and y_{which} of shape (N,); they are "
            f"{tuple(inputs.shape)} and {tuple(labels.shape)}",
        )
    return TensorSplit(inputs.to(torch.float32), labels.to(torch.int64))


def _check_splits(name: str, splits) -> None:
    import torch

    for which, split in (("train", splits.train), ("test", splits.test)):
        if len(split) == 0:
            raise ConfigError("dataset", name, f"a {which} split with samples; it has none")
        if tuple(split.x.shape[1:]) != tuple(splits.input_shape):
            raise ConfigError(
                "dataset",
                name,
                f"{which} samples of shape {tuple(splits.input_shape)}; they are {tuple(split.x.shape[1:])}",
            )
        if split.x.dtype != torch.float32 or not bool(torch.isfinite(split.x).all()):
            raise ConfigError("dataset", name, f"finite float32 {which} inputs")
        low, high = int(split.y.min()), int(split.y.max())
        if split.y.dtype != torch.int64 or low < 0 or high >= splits.num_classes:
            raise ConfigError(
                "dataset",
                name,
                f"int64 {which} labels in [0, {splits.num_classes - 1}]; they span [{low}, {high}]",
            )
    if splits.num_classes < 2 or len(torch.unique(splits.train.y)) < 2:
        raise ConfigError("dataset", name, "training labels of at least 2 classes")
    if math.prod(splits.input_shape) == 0:
        raise ConfigError(
            "dataset", name, f"samples with values; their shape is {splits.input_shape}"
        )
