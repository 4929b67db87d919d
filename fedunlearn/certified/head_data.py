"""Who holds the samples of a certified head: the :class:`HeadData` interface, its central
implementation :class:`CentralHeadData` on one feature matrix, and the sample ids both accept.

Guo et al.'s Algorithms 1-2 touch the data only through the sums of
:mod:`fedunlearn.certified.statistics`; a :class:`HeadData` computes them over the current data D'
wherever it lives: centrally here, or in a federation, where each client computes them on its own
features and the server adds them up (``server/certified/head_data.py`` implements
:class:`HeadData` with messages).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from fedunlearn.certified.cached_bound import RowSketch, reach_bounds, row_sketch
from fedunlearn.certified.losses import (
    check_features,
    check_loss,
    check_targets,
    second_derivative,
)
from fedunlearn.certified.staleness import stale_terms
from fedunlearn.certified.statistics import (
    HeadSums,
    RemovedParts,
    StepSums,
    head_scores,
    head_sums,
    removed_parts,
    step_sums,
    weighted_grams,
)
from fedunlearn.errors import ConfigError, FedUnlearnError


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
        self._sketch: RowSketch | None = None  # the cached bound's sketch of X's rows

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

    @property
    def gram_rows(self) -> int:
        """How many rows :meth:`gram` sums (all of X's, removed ones subtracted): its rounding
        bound's length (:class:`fedunlearn.certified.cached_bound.GramCache`)."""
        return len(self.features)

    def prepare_sketch(self, rank: int) -> None:
        """Build, once, the rank-``rank`` sketch of X's rows on the top eigenvectors of ``X^T X``
        (:func:`fedunlearn.certified.cached_bound.row_sketch`; O(n d k + d^3)). A pure cache of
        X, never part of a snapshot: any basis keeps the bounds sound, removals only mask rows."""
        if self._sketch is not None and self._sketch.basis.shape[1] == min(rank, self.dim):
            return
        if self._full_gram is None:
            self._full_gram = weighted_grams(self.features, np.ones((len(self.features), 1)))[0]
        basis = np.linalg.eigh(self._full_gram)[1][:, ::-1][:, : min(rank, self.dim)]
        self._sketch = row_sketch(self.features, basis)

    def reach_bounds(self, drift: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`fedunlearn.certified.cached_bound.reach_bounds` over the rows present, O(nk)."""
        if self._sketch is None:
            raise FedUnlearnError("prepare_sketch() before reach_bounds()")
        return reach_bounds(self._sketch, self.present, drift, step)

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
        # No X^T X of the removed rows: the engine asks gram() when it needs ||X'||; their rows
        # (m x d) downdate the cached bound's K' (fedunlearn.certified.cached_bound).
        return removed_parts(
            self.loss,
            self.features[index],
            self.targets[index],
            weights,
            anchor,
            gram=False,
            rows=True,
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
