"""The small convolutional networks of FedEraser's Table I (Liu et al., IWQoS 2021), and one for
scikit-learn's 8x8 digits: each a body of convolutions and one hidden fully connected layer, whose
output the linear head classifies."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def digits_cnn(input_shape: Sequence[int], num_classes: int) -> tuple[nn.Module, int]:
    """conv 16@3x3, pool, FC 64: small enough for 8x8 digits."""
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


def mnist_cnn(input_shape: Sequence[int], num_classes: int) -> tuple[nn.Module, int]:
    """FedEraser's MNIST network: conv 20@5x5, pool, conv 50@5x5, pool, FC 500 (then the head)."""
    return _two_conv_two_fc(input_shape, (20, 50), 500)


def cifar10_cnn(input_shape: Sequence[int], num_classes: int) -> tuple[nn.Module, int]:
    """FedEraser's CIFAR-10 network: conv 32@5x5, pool, conv 64@5x5, pool, FC 512 (then the head)."""
    return _two_conv_two_fc(input_shape, (32, 64), 512)
