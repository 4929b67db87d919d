"""The certified head's features: the federated body's output, with a constant, on the unit sphere.

Guo et al. need ``||x|| <= 1``. Each sample's features are ``[phi(x), 1] / ||[phi(x), 1]||`` with
``phi`` the trained body (:meth:`fedunlearn.training.models.BodyHeadNet.features`): per-sample normalisation
needs no statistics from other clients, and the constant lets each one-vs-rest head learn an offset.
"""

from __future__ import annotations

import numpy as np
import torch

from fedunlearn.certified.losses import normalize_features
from fedunlearn.training.models import BodyHeadNet


@torch.no_grad()
def head_features(
    model: BodyHeadNet,
    inputs: torch.Tensor,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 1024,
) -> np.ndarray:
    """``(n, feature_dim + 1)`` float64 rows of unit norm for ``inputs`` (n samples)."""
    model = model.to(device).eval()
    parts = [
        model.features(inputs[start : start + batch_size].to(device)).double().cpu()
        for start in range(0, len(inputs), batch_size)
    ]
    phi = torch.cat(parts).numpy() if parts else np.zeros((0, model.feature_dim))
    return normalize_features(np.hstack([phi, np.ones((len(phi), 1))]))
