"""The sums over samples that certified removal needs; who holds the samples is
:mod:`fedunlearn.certified.head_data`.

Guo et al.'s Algorithms 1-2 touch the data only through sums over samples at a given head ``W``:
loss, gradient and Hessian sums (Newton training and the exact removal step), ``X^T X`` (for
``||X'||_2``), the removed samples' parts, and the per-sample terms of the bounds. Those sums are
computed here by pure functions on a feature matrix, so that the same code runs

* centrally, on one matrix (:class:`~fedunlearn.certified.head_data.CentralHeadData`), and
* in a federation, where each client computes them on its own features and the server adds them up
  (``server/certified/head_data.py`` implements :class:`~fedunlearn.certified.head_data.HeadData`
  with messages).

Regularisation and the perturbation ``b`` are never here: they belong to the server (which alone
holds ``b``), see :mod:`fedunlearn.certified.removal`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedunlearn.certified.losses import (
    check_targets,
    first_derivative,
    loss_values,
    second_derivative,
)
from fedunlearn.errors import ConfigError

#: Rows per block when forming Hessians: keeps the scaled copy of X in cache-sized pieces.
_BLOCK = 2048


def pack_symmetric(matrices: np.ndarray) -> np.ndarray:
    """The upper triangles of symmetric matrices ``(..., d, d)`` as ``(..., d(d+1)/2)``: half the bytes
    on the wire."""
    d = matrices.shape[-1]
    rows, cols = np.triu_indices(d)
    return matrices[..., rows, cols]


def unpack_symmetric(packed: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`."""
    rows, cols = np.triu_indices(d)
    out = np.zeros(packed.shape[:-1] + (d, d))
    out[..., rows, cols] = packed
    out[..., cols, rows] = packed
    return out


@dataclass
class HeadSums:
    """Sums over a set of samples at a head ``W`` (``K`` heads of dimension ``d``).

    ``loss`` (K,): ``sum_i l(w_k^T x_i, t_ik)``; ``gradient`` (K, d): ``sum_i l'_ik x_i``;
    ``hessian`` (K, d, d) or None: ``sum_i l''_ik x_i x_i^T``; ``count``: number of samples.
    """

    count: int
    loss: np.ndarray
    gradient: np.ndarray
    hessian: np.ndarray | None = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"count": np.array([self.count]), "loss": self.loss, "gradient": self.gradient}
        if self.hessian is not None:
            arrays["hessian"] = pack_symmetric(self.hessian)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> HeadSums:
        gradient = arrays["gradient"]
        hessian = arrays.get("hessian")
        return cls(
            int(arrays["count"][0]),
            arrays["loss"],
            gradient,
            None if hessian is None else unpack_symmetric(hessian, gradient.shape[1]),
        )

    def __add__(self, other: HeadSums) -> HeadSums:
        hessian = None
        if self.hessian is not None and other.hessian is not None:
            hessian = self.hessian + other.hessian
        return HeadSums(
            self.count + other.count,
            self.loss + other.loss,
            self.gradient + other.gradient,
            hessian,
        )


@dataclass
class StepSums:
    """Per-sample terms of one removal step ``v`` (``V``, K x d) at ``W`` with a Hessian from ``W0``.

    With ``a_i = x_i^T (w - w0)`` and ``b_i = x_i^T v`` (per head):
    ``point`` (K,): ``sum_i (|a_i| + |b_i|/2)^2 b_i^2`` (the per-point bound's sum);
    ``xv_squared`` (K,): ``sum_i b_i^2 = ||X'v||^2``;
    ``hessian_vector`` (K, d): ``sum_i l''(x_i^T w) b_i x_i``, the data part of ``H(w) v``.

    With ``stale=True`` (:meth:`fedunlearn.certified.head_data.CentralHeadData.step`;
    :mod:`fedunlearn.certified.staleness`) the terms are at ``w`` itself (``a_i = 0``: ``point``
    bounds ``sum_i b_i^4 / 4``) and ``stale_vector`` (K, d) is ``sum_i (l''(x_i^T w) - l''(x_i^T w0)) b_i x_i``, the anchor's error on ``H(w) v``,
    with ``stale_error`` (K,) bounding the norm of its rounding error; ``point`` and ``xv_squared``
    are then upper bounds that absorb float32 rounding.
    """

    point: np.ndarray
    xv_squared: np.ndarray
    hessian_vector: np.ndarray
    stale_vector: np.ndarray | None = None
    stale_error: np.ndarray | None = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "point": self.point,
            "xv_squared": self.xv_squared,
            "hessian_vector": self.hessian_vector,
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> StepSums:
        return cls(arrays["point"], arrays["xv_squared"], arrays["hessian_vector"])

    def __add__(self, other: StepSums) -> StepSums:
        stale = error = None
        if self.stale_vector is not None and other.stale_vector is not None:
            stale = self.stale_vector + other.stale_vector
            error = self.stale_error + other.stale_error
        return StepSums(
            self.point + other.point,
            self.xv_squared + other.xv_squared,
            self.hessian_vector + other.hessian_vector,
            stale,
            error,
        )


@dataclass
class RemovedParts:
    """What a removal needs from the samples being removed (Guo et al. Algorithm 2).

    ``gradient`` (K, d): their loss-gradient sum at the current ``W`` (Delta's data part);
    ``factor`` (K, m, d): rows ``sqrt(l''(x_i^T w0)) x_i``, their Hessian part at ``W0`` in factored
    form (the fast mode downdates its cached factor with it); ``gram`` (d, d): ``sum_i x_i x_i^T``,
    or None when the data forms ``X'^T X'`` itself on request
    (:meth:`fedunlearn.certified.head_data.CentralHeadData.gram`);
    ``count``: m; ``rows`` (m, d): their features, shipped by central data only (the cached bound
    downdates ``X'^T X'`` with them, :mod:`fedunlearn.certified.cached_bound`), never by a client.
    """

    count: int
    gradient: np.ndarray
    factor: np.ndarray
    gram: np.ndarray | None
    rows: np.ndarray | None = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "count": np.array([self.count]),
            "gradient": self.gradient,
            "factor": self.factor,
            "gram": pack_symmetric(self.gram),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> RemovedParts:
        d = arrays["gradient"].shape[1]
        return cls(
            int(arrays["count"][0]),
            arrays["gradient"],
            arrays["factor"],
            unpack_symmetric(arrays["gram"], d),
        )

    def __add__(self, other: RemovedParts) -> RemovedParts:
        gram = None
        if self.gram is not None and other.gram is not None:
            gram = self.gram + other.gram
        return RemovedParts(
            self.count + other.count,
            self.gradient + other.gradient,
            np.concatenate([self.factor, other.factor], axis=1),
            gram,
            None if self.rows is None or other.rows is None else np.vstack([self.rows, other.rows]),
        )


def _checked(loss: str, features: np.ndarray, targets: np.ndarray, weights: np.ndarray):
    """``targets`` validated (:func:`check_targets`) and shaped like ``(len(features), K)``."""
    targets = check_targets(loss, targets)
    if targets.shape != (len(features), weights.shape[0]):
        raise ConfigError(
            "targets",
            f"array of shape {targets.shape}",
            f"shape ({len(features)}, {weights.shape[0]}): one row per sample, one column per head",
        )
    return targets


def head_scores(features: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``S = X W^T`` (n, K)."""
    return features @ weights.T


def head_sums(
    loss: str,
    features: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    *,
    hessian: bool = True,
    mask: np.ndarray | None = None,
    single_precision: bool = False,
    features_single: np.ndarray | None = None,
) -> HeadSums:
    """Loss, gradient and (optionally) Hessian sums of ``l`` over ``features`` at ``weights``.

    ``mask`` (n,) bool, when given, leaves out the rows where it is false (without copying X);
    ``single_precision`` is passed to :func:`weighted_grams` for the Hessian. Targets outside the
    loss's domain (:func:`fedunlearn.certified.losses.check_targets`) are refused.
    """
    targets = _checked(loss, features, targets, weights)
    scores = head_scores(features, weights)
    keep = np.ones((len(features), 1)) if mask is None else mask[:, None].astype(np.float64)
    d1 = first_derivative(loss, scores, targets) * keep
    sums = HeadSums(
        count=int(keep.sum()),
        loss=(loss_values(loss, scores, targets) * keep).sum(axis=0),
        gradient=d1.T @ features,
    )
    if hessian:
        sums.hessian = weighted_grams(
            features,
            second_derivative(loss, scores, targets) * keep,
            single_precision=single_precision,
            features_single=features_single,
        )
    return sums


def weighted_grams(
    features: np.ndarray,
    weights: np.ndarray,
    *,
    single_precision: bool = False,
    features_single: np.ndarray | None = None,
) -> np.ndarray:
    """``sum_i weights_ik x_i x_i^T`` for every column k of ``weights`` (n, K) -> (K, d, d).

    Formed as ``(sqrt(w) X)^T (sqrt(w) X)`` block by block, which BLAS computes as a symmetric rank-k
    update (half the flops of a general product). Weights must be non-negative (``l'' >= 0``).
    ``single_precision`` forms each block's product in float32 (twice as fast; blocks are summed in
    float64), from ``features_single`` (a float32 copy of X) when given: only for a caller that
    measures the resulting solve's residual in float64.
    """
    n, d = features.shape
    out = np.zeros((weights.shape[1], d, d))
    roots = np.sqrt(np.maximum(weights, 0.0))
    source = features
    if single_precision:
        source = features.astype(np.float32) if features_single is None else features_single
        roots = roots.astype(np.float32)
    for start in range(0, n, _BLOCK):
        block = source[start : start + _BLOCK]
        for k in range(weights.shape[1]):
            scaled = block * roots[start : start + _BLOCK, k, None]
            out[k] += scaled.T @ scaled
    return out


def step_sums(
    loss: str,
    features: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    anchor: np.ndarray,
    step: np.ndarray,
    *,
    hessian_vector: bool = True,
    projections: np.ndarray | None = None,
    drift: np.ndarray | None = None,
    scores: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> StepSums:
    """:class:`StepSums` of step ``V`` at ``W`` (``weights``) with anchor ``W0`` (``anchor``).

    ``projections`` (``X V^T``), ``drift`` (``X (W - W0)^T``) and ``scores`` (``X W^T``) may be
    passed when already known; ``mask`` (n,) bool leaves out rows that are not in D'. Without
    ``hessian_vector`` the result's ``hessian_vector`` is zeros and X is read once.
    """
    targets = _checked(loss, features, targets, weights)
    b = features @ step.T if projections is None else projections
    if mask is not None:
        b = b * mask[:, None]
    a = features @ (weights - anchor).T if drift is None else drift
    point = np.square(np.abs(a) + 0.5 * np.abs(b)) * np.square(b)
    hv = np.zeros_like(step)
    if hessian_vector:
        s = head_scores(features, weights) if scores is None else scores
        hv = (second_derivative(loss, s, targets) * b).T @ features
    return StepSums(point=point.sum(axis=0), xv_squared=np.square(b).sum(axis=0), hessian_vector=hv)


def removed_parts(
    loss: str,
    features: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    anchor: np.ndarray | None,
    *,
    gram: bool = True,
    rows: bool = False,
) -> RemovedParts:
    """:class:`RemovedParts` of the samples ``features`` being removed; without an ``anchor`` (the
    exact mode needs no cached factor) the factor is empty, shape (K, 0, d); without ``gram`` their
    ``X^T X`` is not formed (None); with ``rows`` their features are shipped as they are."""
    targets = _checked(loss, features, targets, weights)
    grad = head_sums(loss, features, targets, weights, hessian=False).gradient
    if anchor is None:
        factor = np.zeros((weights.shape[0], 0, features.shape[1]))
    else:
        curvature = second_derivative(loss, head_scores(features, anchor), targets)  # (m, K)
        factor = np.sqrt(curvature).T[:, :, None] * features[None, :, :]
    gram_matrix = features.T @ features if gram else None
    return RemovedParts(len(features), grad, factor, gram_matrix, features.copy() if rows else None)
