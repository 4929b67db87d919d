"""The softmax head's loss, gradient and exact Hessian as sums a client can send (Golatkar et al.,
eq. 7 on the linear head).

The head is ``softmax(W~ [phi(x), 1])`` with ``W~ = [weight | bias]`` of shape (K, d), flattened
row-major (class k's row first). Its Hessian is ``sum_i (diag(p_i) - p_i p_i^T) (x) x_i x_i^T``: the
(a, b) block is ``sum_i p_ia (delta_ab - p_ib) x_i x_i^T``, a symmetric d x d matrix. A client sends
the K(K+1)/2 blocks a <= b, each packed to its upper triangle; the server adds the clients' blocks and
assembles the (K d, K d) matrix once (:func:`assemble_hessian`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from fedunlearn.certified.statistics import pack_symmetric, unpack_symmetric
from fedunlearn.training.models import BodyHeadNet

_BLOCK = 4096


def head_matrix(state: Mapping[str, torch.Tensor]) -> np.ndarray:
    """``W~ = [head.weight | head.bias]`` (K, d) in float64 from a model's state dict."""
    weight = state["head.weight"].detach().double().cpu().numpy()
    bias = state["head.bias"].detach().double().cpu().numpy()
    return np.hstack([weight, bias[:, None]])


def with_head(state: Mapping[str, torch.Tensor], matrix: np.ndarray) -> dict[str, torch.Tensor]:
    """A copy of ``state`` whose head is ``matrix`` (K, d) = [weight | bias]."""
    out = {k: v.detach().clone() for k, v in state.items()}
    dtype = out["head.weight"].dtype
    out["head.weight"] = torch.as_tensor(matrix[:, :-1], dtype=dtype).clone()
    out["head.bias"] = torch.as_tensor(matrix[:, -1], dtype=dtype).clone()
    return out


@torch.no_grad()
def head_inputs(
    model: BodyHeadNet, inputs: torch.Tensor, *, device="cpu", batch_size: int = 1024
) -> np.ndarray:
    """``[phi(x), 1]`` (n, feature_dim + 1) in float64: the head's input with the bias column."""
    model = model.to(device).eval()
    parts = [
        model.features(inputs[s : s + batch_size].to(device)).double().cpu()
        for s in range(0, len(inputs), batch_size)
    ]
    phi = torch.cat(parts).numpy() if parts else np.zeros((0, model.feature_dim))
    return np.hstack([phi, np.ones((len(phi), 1))])


def block_pairs(num_classes: int) -> list[tuple[int, int]]:
    """The (a, b) blocks a <= b in the order they are sent."""
    return [(a, b) for a in range(num_classes) for b in range(a, num_classes)]


def head_sums(
    features: np.ndarray, labels: np.ndarray, matrix: np.ndarray, *, hessian: bool = True
) -> dict[str, np.ndarray]:
    """Summed cross-entropy of the head over the samples: ``loss`` (1,), ``gradient`` (K, d) and,
    with ``hessian``, ``blocks`` (K(K+1)/2, d(d+1)/2) packed float32 (summed in float64 by the
    server). Zero samples give zeros."""
    x = np.asarray(features, dtype=np.float64)
    w = np.asarray(matrix, dtype=np.float64)
    k, d = w.shape
    y = np.asarray(labels, dtype=np.int64)
    loss, gradient = 0.0, np.zeros((k, d))
    pairs = block_pairs(k)
    blocks = np.zeros((len(pairs), d, d)) if hessian else None
    for start in range(0, len(x), _BLOCK):
        xb, yb = x[start : start + _BLOCK], y[start : start + _BLOCK]
        scores = xb @ w.T
        scores -= scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(len(yb))
        loss -= float(np.sum(np.log(np.maximum(p[rows, yb], 1e-300))))
        residual = p.copy()
        residual[rows, yb] -= 1.0
        gradient += residual.T @ xb
        if hessian:
            for index, (a, b) in enumerate(pairs):
                weight = p[:, a] * ((a == b) - p[:, b])
                blocks[index] += (xb * weight[:, None]).T @ xb
    out = {"loss": np.array([loss]), "gradient": gradient}
    if hessian:
        out["blocks"] = pack_symmetric(blocks).astype(np.float32)
    return out


def assemble_hessian(blocks: np.ndarray, num_classes: int, dim: int) -> np.ndarray:
    """The (K d, K d) Hessian from the packed blocks of :func:`head_sums` (summed over clients)."""
    full = unpack_symmetric(np.asarray(blocks, dtype=np.float64), dim)
    out = np.zeros((num_classes, dim, num_classes, dim))
    for index, (a, b) in enumerate(block_pairs(num_classes)):
        out[a, :, b, :] = full[index]
        out[b, :, a, :] = full[index]
    return out.reshape(num_classes * dim, num_classes * dim)
