"""The sums over samples that certified removal needs, and who holds the samples.

Guo et al.'s Algorithms 1-2 touch the data only through sums over samples at a given head ``W``:
loss, gradient and Hessian sums (Newton training and the exact removal step), ``X^T X`` (for
``||X'||_2``), the removed samples' parts, and the per-sample terms of the bounds. Those sums are
computed here by pure functions on a feature matrix, so that the same code runs

* centrally, on one matrix (:class:`CentralHeadData`), and
* in a federation, where each client computes them on its own features and the server adds them up
  (``server/certified/head.py`` implements :class:`HeadData` with messages).

Regularisation and the perturbation ``b`` are never here: they belong to the server (which alone
holds ``b``), see :mod:`fedunlearn.certified.removal`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fedunlearn.certified.losses import (
    check_features,
    check_loss,
    check_targets,
    first_derivative,
    loss_values,
    second_derivative,
)
from fedunlearn.certified.staleness import stale_terms
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

    With ``stale=True`` (:meth:`CentralHeadData.step`; :mod:`fedunlearn.certified.staleness`) the
    terms are at ``w`` itself (``a_i = 0``: ``point`` bounds ``sum_i b_i^4 / 4``) and ``stale_vector``
    (K, d) is ``sum_i (l''(x_i^T w) - l''(x_i^T w0)) b_i x_i``, the anchor's error on ``H(w) v``,
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
    or None when the data forms ``X'^T X'`` itself on request (:meth:`CentralHeadData.gram`);
    ``count``: m.
    """

    count: int
    gradient: np.ndarray
    factor: np.ndarray
    gram: np.ndarray | None

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
        )


def is_integer_id(value: object) -> bool:
    """True for a Python or NumPy integer; False for bool (an int subclass), floats, str and all else.

    Request ids are never coerced: ``7.9`` must not remove row 7, ``True`` row 1, ``"12"`` rows 1, 2.
    """
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def id_list(ids: object) -> list[Any]:
    """``ids`` as a list, refused unless it is a sequence of ids (a str or a mapping is not)."""
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, (Iterable, np.ndarray)):
        raise ConfigError("ids", ids, "a list of sample ids (a str is not a list of ids)")
    if isinstance(ids, np.ndarray) and ids.ndim != 1 and not (ids.ndim == 2 and ids.shape[1] == 2):
        raise ConfigError("ids", f"array of shape {ids.shape}", "a 1-D list of sample ids")
    return list(ids)


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
) -> RemovedParts:
    """:class:`RemovedParts` of the samples ``features`` being removed; without an ``anchor`` (the
    exact mode needs no cached factor) the factor is empty, shape (K, 0, d); without ``gram`` their
    ``X^T X`` is not formed (None)."""
    targets = _checked(loss, features, targets, weights)
    grad = head_sums(loss, features, targets, weights, hessian=False).gradient
    if anchor is None:
        factor = np.zeros((weights.shape[0], 0, features.shape[1]))
    else:
        curvature = second_derivative(loss, head_scores(features, anchor), targets)  # (m, K)
        factor = np.sqrt(curvature).T[:, :, None] * features[None, :, :]
    return RemovedParts(len(features), grad, factor, features.T @ features if gram else None)


class HeadData(Protocol):
    """The training set of a certified head, wherever it lives. Sums are over the *current* data D'.

    Sample ids are integers, never coerced (:func:`is_integer_id`): a row index centrally, a
    (partition id, local index) pair in a federation; they are recorded in the certificates as given.

    A removal request is a transaction (:meth:`fedunlearn.certified.removal.CertifiedHead.remove`):
    the engine takes a :meth:`snapshot` before it asks anything and :meth:`restore`-s it when any
    later step fails, so that a failed request leaves D' (and every cache) exactly as it was.
    """

    loss: str
    num_heads: int
    dim: int

    def count(self) -> int: ...

    def sums(
        self, weights: np.ndarray, *, hessian: bool, single_precision: bool = False
    ) -> HeadSums:
        """Loss/gradient(/Hessian) sums over D'; ``single_precision`` allows a float32 Hessian."""
        ...

    def gram(self) -> np.ndarray: ...

    def removed(
        self, ids: Sequence[Hashable], weights: np.ndarray, anchor: np.ndarray | None
    ) -> RemovedParts:
        """The parts of samples ``ids`` (which must be present) at ``weights``/``anchor``
        (``anchor=None``: no Hessian factor)."""
        ...

    def drop(self, ids: Sequence[Hashable]) -> None:
        """Remove samples ``ids`` from D' (undone only by :meth:`restore`)."""
        ...

    def snapshot(self) -> object:
        """An opaque copy of the removal mask and caches, for :meth:`restore`; never fails midway."""
        ...

    def restore(self, state: object) -> None:
        """Put back the state of :meth:`snapshot` (in memory only: it must not fail)."""
        ...

    def step(
        self,
        weights: np.ndarray,
        anchor: np.ndarray,
        step: np.ndarray,
        *,
        hessian_vector: bool = True,
    ) -> StepSums:
        """:class:`StepSums` of step ``step`` at ``weights`` with the Hessian's anchor ``anchor``.

        A HeadData whose ``measures_staleness`` attribute is true also accepts ``stale=True``
        (terms at ``weights`` plus the anchor's stale vector, see :class:`StepSums`); the fast
        removal mode asks for it only then, and bounds the anchor's drift otherwise.
        """
        ...


class CentralHeadData:
    """:class:`HeadData` on one feature matrix ``X`` (n, d) and targets ``T`` (n, K); ids are row indices.

    Removed rows are masked out, never copied around: sums are over the rows still present.
    """

    def __init__(self, loss: str, features: np.ndarray, targets: np.ndarray) -> None:
        self.loss = check_loss(loss)
        # A private copy: removals only mask rows, so a caller editing X later must not change D.
        self.features = np.array(check_features(features), order="C", copy=True)
        self.targets = np.array(check_targets(self.loss, targets), copy=True)
        if len(self.targets) != len(self.features):
            raise ConfigError(
                "targets",
                f"array of shape {self.targets.shape}",
                f"shape (n, K) with n = {len(self.features)} rows, like the features",
            )
        self.num_heads = self.targets.shape[1]
        self.dim = self.features.shape[1]
        self.present = np.ones(len(self.features), dtype=bool)
        self._step_cache: tuple | None = None
        # float32 copy (half the bytes): the fast mode's per-request read of X and the exact mode's
        # float32 Hessians; made here, with the data, rather than inside the first request.
        self._features_single: np.ndarray | None = self.features.astype(np.float32)
        self._row_norms = np.linalg.norm(self.features, axis=1)
        # Pure caches keyed by their inputs (never part of a snapshot): X^T X over all rows, and
        # X w0^T and l'' there for the last anchor w0 asked about.
        self._full_gram: np.ndarray | None = None
        self._anchor_scores: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._drift_cache: tuple | None = None  # (w0, w, (X (w - w0)^T, its error bound))

    #: :meth:`step` measures the anchor's stale vector in float32 (``stale=True``).
    measures_staleness = True

    def count(self) -> int:
        return int(self.present.sum())

    def _mask(self) -> np.ndarray | None:
        return None if self.present.all() else self.present

    def sums(
        self, weights: np.ndarray, *, hessian: bool, single_precision: bool = False
    ) -> HeadSums:
        return head_sums(
            self.loss,
            self.features,
            self.targets,
            weights,
            hessian=hessian,
            mask=self._mask(),
            single_precision=single_precision,
            features_single=self._single() if single_precision and hessian else None,
        )

    def _single(self) -> np.ndarray:
        if self._features_single is None:
            self._features_single = self.features.astype(np.float32)
        return self._features_single

    def gram(self) -> np.ndarray:
        """``X'^T X'``: all rows' Gram matrix (formed once) less the removed rows', or formed
        afresh when more rows are gone than are left (fewer flops either way)."""
        removed = np.flatnonzero(~self.present)
        if len(removed) >= len(self.features) // 2:
            return weighted_grams(self.features, self.present[:, None].astype(np.float64))[0]
        if self._full_gram is None:
            self._full_gram = weighted_grams(self.features, np.ones((len(self.features), 1)))[0]
        rows = self.features[removed]
        return self._full_gram - rows.T @ rows

    def _indices(self, ids: Sequence[Hashable]) -> np.ndarray:
        values = id_list(ids)
        if not values:
            raise ConfigError("ids", values, "a non-empty list of row indices")
        n = len(self.features)
        for value in values:
            if not is_integer_id(value):
                raise ConfigError(
                    "ids", value, "integer row indices (bool, float and str are not coerced)"
                )
            if not 0 <= value < n:
                raise ConfigError("ids", int(value), f"row indices in [0, {n})")
        index = np.array([int(v) for v in values], dtype=np.int64)
        if len(np.unique(index)) != len(index):
            raise ConfigError("ids", index.tolist(), "each sample at most once per request")
        gone = index[~self.present[index]]
        if len(gone):
            raise ConfigError(
                "ids", gone.tolist(), "samples still in the training set (these were removed)"
            )
        return index

    def removed(
        self, ids: Sequence[Hashable], weights: np.ndarray, anchor: np.ndarray | None
    ) -> RemovedParts:
        index = self._indices(ids)
        # No X^T X of the removed rows: the engine asks gram() when it needs ||X'||.
        return removed_parts(
            self.loss, self.features[index], self.targets[index], weights, anchor, gram=False
        )

    def drop(self, ids: Sequence[Hashable]) -> None:
        index = self._indices(ids)
        present = self.present.copy()
        present[index] = False
        self.present = present  # a new array: a snapshot holding the old one stays valid

    def snapshot(self) -> object:
        return (self.present, self._step_cache)

    def restore(self, state: object) -> None:
        self.present, self._step_cache = state  # type: ignore[misc]

    def step(
        self,
        weights: np.ndarray,
        anchor: np.ndarray,
        step: np.ndarray,
        *,
        hessian_vector: bool = True,
        stale: bool = False,
    ) -> StepSums:
        if stale:
            return self._stale_step(weights, anchor, step)
        # When the caller moved W by exactly the previous step (W = W_prev + V_prev, same anchor),
        # X (W - W0) and X W follow from the previous pass: one or two passes over X per removal.
        projections = self.features @ step.T
        drift = scores = None
        cache = self._step_cache
        if cache is not None:
            c_anchor, c_weights, c_step, c_proj, c_drift, c_scores = cache
            if np.array_equal(c_anchor, anchor) and np.array_equal(c_weights + c_step, weights):
                drift = c_drift + c_proj
                scores = None if c_scores is None else c_scores + c_proj
        if drift is None:
            drift = self.features @ (weights - anchor).T
        if hessian_vector and scores is None:
            scores = head_scores(self.features, weights)
        sums = step_sums(
            self.loss,
            self.features,
            self.targets,
            weights,
            anchor,
            step,
            hessian_vector=hessian_vector,
            projections=projections,
            drift=drift,
            scores=scores,
            mask=self._mask(),
        )
        self._step_cache = (anchor.copy(), weights.copy(), step.copy(), projections, drift, scores)
        return sums

    def _stale_step(self, weights: np.ndarray, anchor: np.ndarray, step: np.ndarray) -> StepSums:
        """Terms at ``weights`` and the anchor's stale vector from one float32 read of X
        (:func:`fedunlearn.certified.staleness.stale_terms`). ``X (w - w0)`` is carried from the
        previous call when ``weights`` is that call's ``weights + step`` on the same anchor."""
        cached = self._anchor_scores
        if cached is None or not np.array_equal(cached[0], anchor):
            scores = head_scores(self.features, anchor)
            curvature = second_derivative(self.loss, scores, self.targets)
            cached = (anchor.copy(), scores, curvature)
            self._anchor_scores = cached
        drift = None
        carried = self._drift_cache
        if np.array_equal(weights, anchor):
            drift = (np.zeros((len(self.features), len(step))), np.zeros(len(step)))
        elif carried is not None and np.array_equal(carried[0], anchor):
            if np.array_equal(carried[1], weights):
                drift = carried[2]
        terms = stale_terms(
            self.loss,
            self._single(),
            self._row_norms,
            self.targets,
            self.present,
            cached[1],
            weights,
            anchor,
            step,
            anchor_curvature=cached[2],
            drift=drift,
        )
        # Keyed by value: a request that fails after this call finds no match and recomputes.
        self._drift_cache = (anchor.copy(), weights + step, terms["next_drift"])
        return StepSums(
            point=terms["b4"] / 4.0,
            xv_squared=terms["b2"],
            hessian_vector=np.zeros_like(step),
            stale_vector=terms["stale"],
            stale_error=terms["stale_error"],
        )
