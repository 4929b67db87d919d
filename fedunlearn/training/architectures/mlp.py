"""FedEraser's Adult network (Liu et al., IWQoS 2021, Table I): two fully connected layers, the
first the body, the second the linear head."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def adult_mlp(input_shape: Sequence[int], num_classes: int) -> tuple[nn.Module, int]:
    """FC 64 + ReLU on feature vectors of any width (then the head)."""
    (num_features,) = input_shape
    return nn.Sequential(nn.Linear(num_features, 64), nn.ReLU()), 64
