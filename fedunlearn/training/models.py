"""The federated models: every one is a ``body`` (feature extractor) and a ``head`` (one linear layer).

Architectures follow Table I of Liu et al., *FedEraser* (IWQoS 2021): Adult 2 FC layers; MNIST and
Fashion-MNIST 2 convolutional + 2 fully connected layers; CIFAR-10 2 convolutional, 2 pooling and 2
fully connected layers; plus a small CNN for scikit-learn's 8x8 digits. The last fully connected layer
is always ``head`` so that the head plug-ins (certified removal, scrubbing) can address it by name on
features ``phi(x) = body(x)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.training.architectures.resnet import resnet18_cifar, resnet18_cifar_gn

#: The model each dataset uses when ``model = "auto"``.
DEFAULT_MODEL = {
    "digits": "digits-cnn",
    "mnist": "mnist-cnn",
    "fashion-mnist": "mnist-cnn",
    "cifar10": "cifar10-cnn",
    "adult": "adult-mlp",
    "cifar100": "resnet18-cifar",  # until the registry lands (issue 44)
}


class BodyHeadNet(nn.Module):
    """``head(body(x))`` with ``head`` a single :class:`torch.nn.Linear`.

    Parameters
    ----------
    body : nn.Module
        Maps an input batch to features of shape ``(batch, feature_dim)``.
    feature_dim : int
        Width of the features, the head's input size.
    num_classes : int
        The head's output size.
    """

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(feature_dim, num_classes)
        self.feature_dim = feature_dim
        self.num_classes = num_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """phi(x): the body's output, the input of the linear head."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _digits_cnn(input_shape: Sequence[int]) -> tuple[nn.Module, int]:
    channels, height, width = input_shape
    body = nn.Sequential(
        nn.Conv2d(channels, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * (height // 2) * (width // 2), 64),
        nn.ReLU(),
    )
    return body, 64


def _two_conv_two_fc(
    input_shape: Sequence[int], conv_channels: tuple[int, int], hidden: int
) -> tuple[nn.Module, int]:
    """conv 5x5, pool, conv 5x5, pool, FC ``hidden``: the body of FedEraser's image networks."""
    channels, height, width = input_shape
    side_h, side_w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    first, second = conv_channels
    body = nn.Sequential(
        nn.Conv2d(channels, first, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(first, second, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(second * side_h * side_w, hidden),
        nn.ReLU(),
    )
    return body, hidden


def _mnist_cnn(input_shape: Sequence[int]) -> tuple[nn.Module, int]:
    # FedEraser's MNIST network: conv 20@5x5, pool, conv 50@5x5, pool, FC 500, FC 10 (the head).
    return _two_conv_two_fc(input_shape, (20, 50), 500)


def _cifar10_cnn(input_shape: Sequence[int]) -> tuple[nn.Module, int]:
    # CIFAR-10: conv 32@5x5, pool, conv 64@5x5, pool, FC 512, FC 10 (the head).
    return _two_conv_two_fc(input_shape, (32, 64), 512)


def _adult_mlp(input_shape: Sequence[int]) -> tuple[nn.Module, int]:
    (num_features,) = input_shape
    body = nn.Sequential(nn.Linear(num_features, 64), nn.ReLU())
    return body, 64


_BUILDERS = {
    "digits-cnn": (_digits_cnn, 3),
    "mnist-cnn": (_mnist_cnn, 3),
    "cifar10-cnn": (_cifar10_cnn, 3),
    "adult-mlp": (_adult_mlp, 1),
    # Temporary, until the model registry lands (issue 44): ResNet-18, CIFAR variant.
    "resnet18-cifar": (resnet18_cifar, 3),
    "resnet18-cifar-gn": (resnet18_cifar_gn, 3),
}
MODEL_NAMES = tuple(_BUILDERS)


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, *, seed: int | None = None
) -> BodyHeadNet:
    """Build a :class:`BodyHeadNet` by name, initialised from ``seed`` when given.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES`.
    input_shape : sequence of int
        Shape of one sample: ``(C, H, W)`` for the CNNs, ``(F,)`` for ``adult-mlp``.
    num_classes : int
        Number of output classes.
    seed : int, optional
        Seeds the initial weights so every party builds the same initial model M^1.
    """
    if name not in _BUILDERS:
        raise ConfigError("model", name, f"one of {', '.join(MODEL_NAMES)}")
    builder, rank = _BUILDERS[name]
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != rank:
        raise ConfigError(
            "model", name, f"a model for inputs of rank {rank}; the data has sample shape {shape}"
        )
    if num_classes < 2:
        raise ConfigError("num_classes", num_classes, "at least 2")
    if seed is None:
        body, feature_dim = builder(shape)
        return BodyHeadNet(body, feature_dim, num_classes)
    # Seed a private generator so building a model never disturbs the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        body, feature_dim = builder(shape)
        return BodyHeadNet(body, feature_dim, num_classes)


def resolve_model_name(model: str, dataset: str) -> str:
    """``model`` itself, or the dataset's default when ``model == "auto"``."""
    if model != "auto":
        return model
    if dataset not in DEFAULT_MODEL:
        raise ConfigError("dataset", dataset, f"one of {', '.join(DEFAULT_MODEL)}")
    return DEFAULT_MODEL[dataset]


def build_dataset_model(
    model: str,
    dataset: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int | None = None,
) -> BodyHeadNet:
    """:func:`build_model` for a run's ``model`` key (``auto`` = the dataset's default)."""
    return build_model(resolve_model_name(model, dataset), input_shape, num_classes, seed=seed)
