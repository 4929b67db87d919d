"""The Newton step of one removal request (Guo et al. Algorithm 2) in each mode, and the bounds
of its gradient residual: :class:`RemovalStep`, the part of
:class:`fedunlearn.certified.removal.CertifiedHead` that computes them.

``"exact"`` solves with the Hessian at w (Cholesky); ``"fast"`` with the cached factor of the
anchor w0, downdated by the removed rows and refreshed when stale, and, for a data that measures
the anchor's stale vector (:mod:`fedunlearn.certified.staleness`), with that vector in the solve's
residual. The modes, the refresh rules and ``||X'||_2`` are described in
:mod:`fedunlearn.certified.removal`; the bounds themselves are in
:mod:`fedunlearn.certified.certificate`. Nothing here changes the engine: the new factors,
anchor and spectral norm go into the ``state`` a request commits (or drops) as a whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedunlearn.certified.cached_bound import GramCache, cached_bound
from fedunlearn.certified.certificate import (
    CertifiedRemovalParams,
    corollary_bound,
    per_point_bound,
)
from fedunlearn.certified.fast_factor import FastFactor
from fedunlearn.certified.head_data import HeadData
from fedunlearn.certified.losses import NORM_TOLERANCE, lipschitz_gamma
from fedunlearn.certified.solvers import (
    blas_threads,
    check_finite,
    cholesky_solve,
    fast_solve,
    joint_norm,
    top_eigenvalue,
)
from fedunlearn.errors import FedUnlearnError

#: ``||X'||_2`` is recomputed only when that could tighten it by more than this fraction.
SPECTRAL_GAIN = 0.01


class RemovalStep:
    """The step and bounds of a removal request, from the engine's state (``params``, ``data``, the
    cached factors, anchor and ``||X'||_2^2``); :class:`~fedunlearn.certified.removal.CertifiedHead`
    is one, and provides ``_sums`` and ``_anchored``."""

    params: CertifiedRemovalParams
    data: HeadData
    gamma: float
    _gram: np.ndarray | None
    _spectral_sq: float
    _since_spectral: int
    _anchor: np.ndarray
    _factors: tuple[FastFactor, ...]
    _stale_since: float
    _bound_since: float
    _gram_cache: GramCache | None

    def _spectral_due(self, since: int) -> bool:
        """Whether ``||X'||_2`` is recomputed after ``since`` removals: at least ``spectral_every``
        of them, and m rows of norm <= 1 could have lowered ``lambda_max`` by more than
        :data:`SPECTRAL_GAIN` (they lower it by at most m)."""
        floor = max(self._spectral_sq - since, 0.0)
        could_gain = floor < (1.0 - SPECTRAL_GAIN) ** 2 * self._spectral_sq
        return since >= self.params.spectral_every and could_gain

    def _spectral_state(self, parts, m: int) -> dict[str, Any]:
        """``X'^T X'`` (when the data ships the removed rows' grams) and ``||X'||_2^2``, recomputed
        when ``spectral_every`` samples were removed since and could have lowered it by more than
        :data:`SPECTRAL_GAIN` (:mod:`fedunlearn.certified.removal`'s docstring); in between the
        last value bounds it from above (``K' <= K``). A data that ships no grams forms
        ``X'^T X'`` itself when asked."""
        gram = None
        if self._gram is not None and parts.gram is not None:
            gram = self._gram - parts.gram
        state: dict[str, Any] = {"_gram": gram, "_since_spectral": self._since_spectral + m}
        if self._spectral_due(state["_since_spectral"]):
            current = gram if gram is not None else self.data.gram()
            check_finite("the Gram matrix X'^T X'", current)
            state["_spectral_sq"] = top_eigenvalue(current)
            state["_since_spectral"] = 0
        return state

    def _exact_step(self, weights: np.ndarray, delta: np.ndarray, mu: float):
        """Newton step with the Hessian at w (Cholesky) and the step's per-sample terms."""
        p = self.params
        # The step's own error H'(w) v - Delta is measured in float64 below, so a float32
        # Hessian (single_precision_hessian) is safe here; the fast mode's factor must be exact.
        # Least squares keeps float64: its Newton step is exact and should stay so.
        single = p.single_precision_hessian and p.loss == "logistic"
        sums = self._sums(weights, hessian=True, single_precision=single)
        step = np.stack(
            [
                cholesky_solve(sums.hessian[k] + mu * np.eye(self.data.dim), delta[k])
                for k in range(len(delta))
            ]
        )
        terms = self.data.step(weights, weights, step, hessian_vector=True)
        check_finite("the step's sums", terms.point, terms.xv_squared, terms.hessian_vector)
        solve = np.linalg.norm(terms.hessian_vector + mu * step - delta, axis=1)
        return step, solve, np.zeros(len(delta)), terms

    def _fast_step(self, weights, delta, mu: float, rows: np.ndarray, state: dict[str, Any]):
        """Newton step with the cached factor, downdated by ``rows`` (the removed samples' factor
        rows) and refreshed at w when stale; the new factors and anchor go into ``state``."""
        p = self.params
        anchor = self._anchor
        try:
            factors = tuple(f.with_rows(rows[k], mu) for k, f in enumerate(self._factors))
            step, solve = fast_solve(factors, delta, mu)
            drift = np.linalg.norm(weights - anchor, axis=1)
            too_stale = np.any(drift > p.refresh_ratio * np.linalg.norm(step, axis=1))
            refreshed = bool(too_stale or factors[0].rank > p.max_rank)
        except np.linalg.LinAlgError:  # rounding made the downdated capacitance indefinite
            refreshed = True
        if refreshed:
            fresh = self._anchored(weights, self._sums(weights, hessian=True))
            state.update(fresh)
            factors, anchor = fresh["_factors"], fresh["_anchor"]
            step, solve = fast_solve(factors, delta, mu)
            drift = np.zeros(len(delta))
        state["_factors"], state["_anchor"] = factors, anchor
        terms = None
        if p.bound == "per-point" or p.track_bounds or state["_gram"] is None:
            terms = self.data.step(weights, anchor, step, hessian_vector=False)
            check_finite("the step's sums", terms.point, terms.xv_squared)
        return step, solve, drift, terms, refreshed

    def _downdated(self, weights, rows: np.ndarray, mu: float, refreshed: bool, state: dict):
        """The cached factors downdated by ``rows`` (Woodbury), or, when ``refreshed`` or rounding
        made the downdated capacitance indefinite, refreshed at ``weights`` (O(n d^2 + d^3), the
        BLAS's own threads); records them in ``state``. Returns (factors, anchor, refreshed)."""
        factors, anchor = self._factors, self._anchor
        with blas_threads(self.params.step_threads):
            if not refreshed:
                try:
                    factors = tuple(f.with_rows(rows[k], mu) for k, f in enumerate(factors))
                except np.linalg.LinAlgError:  # rounding made the downdated capacitance indefinite
                    refreshed = True
        if refreshed:
            fresh = self._anchored(weights, self._sums(weights, hessian=True))
            state.update(fresh)
            factors, anchor = fresh["_factors"], fresh["_anchor"]
        state["_factors"], state["_anchor"] = factors, anchor
        return factors, anchor, refreshed

    def _measured_step(self, weights, delta, mu: float, rows: np.ndarray, state: dict[str, Any]):
        """Newton step with the cached factor, for a data that measures the anchor's stale vector
        (:mod:`fedunlearn.certified.staleness`): the step's terms are taken at w (no drift), and
        ``||S|| + its rounding bound`` joins the solve's residual. The factor is refreshed at w
        *before* the step when the stale parts since the anchor exceed ``refresh_ratio`` times the
        rest of those requests' bounds, or the downdate would pass ``max_rank``."""
        p = self.params
        factors = self._factors
        refreshed = (
            self._stale_since > p.refresh_ratio * (self._bound_since - self._stale_since)
            or factors[0].rank + rows.shape[1] > p.max_rank
        )
        factors, anchor, refreshed = self._downdated(weights, rows, mu, refreshed, state)
        with blas_threads(p.step_threads):
            step, solve = fast_solve(factors, delta, mu)
            terms = self.data.step(weights, anchor, step, hessian_vector=False, stale=True)
        check_finite("the step's sums", terms.point, terms.xv_squared, terms.stale_vector)
        check_finite("the step's sums", terms.stale_error)
        stale = np.linalg.norm(terms.stale_vector, axis=1) + terms.stale_error
        return step, solve, stale, terms, refreshed

    def _cached_state(self, parts, m: int) -> dict[str, Any]:
        """The Gram cache downdated by the removed samples (their rows, or their Gram matrix from a
        federation) and an upper bound of ``||X'||_2^2`` from it, recomputed as in
        :meth:`_spectral_state` but never from X (:mod:`fedunlearn.certified.cached_bound`)."""
        cache = self._gram_cache
        if cache is None:
            raise FedUnlearnError("the cached bound has no Gram cache: fit() the head first")
        if parts.rows is not None:
            cache = cache.with_rows(parts.rows)
        elif parts.gram is not None:
            cache = cache.with_gram(parts.gram, m)
        else:
            raise FedUnlearnError("the cached bound needs the removed samples' rows or Gram matrix")
        state: dict[str, Any] = {
            "_gram": None,
            "_gram_cache": cache,
            "_since_spectral": self._since_spectral + m,
        }
        if self._spectral_due(state["_since_spectral"]):
            state["_spectral_sq"] = cache.top_eigenvalue_upper()
            state["_since_spectral"] = 0
        return state

    def _reach(self, drift: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Upper bounds of ``max_i (|a_i| + |b_i|/2)`` and ``max_i |b_i|/2`` per head: from the
        data's row sketch when it has one, else from ``||x_i|| <= 1`` (+ the features' tolerance)."""
        reach = getattr(self.data, "reach_bounds", None)
        if reach is not None and self.params.sketch_rank:
            return reach(drift, step)
        row_max = 1.0 + NORM_TOLERANCE
        half = 0.5 * np.linalg.norm(step, axis=1)
        return row_max * (np.linalg.norm(drift, axis=1) + half), row_max * half

    def _cached_step(self, weights, delta, mu: float, parts, state: dict[str, Any]):
        """Newton step with the cached factor and its ``"cached"`` bound: no read of X. The factor
        is refreshed at w before the step when the bounds' drift parts since the anchor exceed
        ``cached_refresh_share`` of the budget, or the downdate would pass ``max_rank``. Returns
        the step, the solve's residual norms, the bounds' drift parts (the stale parts the refresh
        rule weighs, as in :meth:`_measured_step`), the per-head bounds without the solve's
        residual, and whether it refreshed (per head throughout)."""
        p = self.params
        factors = self._factors
        rows = parts.factor
        refreshed = (
            self._stale_since > p.cached_refresh_share * p.budget
            or factors[0].rank + rows.shape[1] > p.max_rank
        )
        factors, anchor, refreshed = self._downdated(weights, rows, mu, refreshed, state)
        with blas_threads(p.step_threads):
            step, solve = fast_solve(factors, delta, mu)
            xv = state["_gram_cache"].norm_upper(step)
            reach, own = self._reach(weights - anchor, step)
        check_finite("the cached bound's factors", xv, reach, own, solve)
        spectral = float(np.sqrt(state.get("_spectral_sq", self._spectral_sq)))
        full = np.array([cached_bound(self.gamma, spectral, r, x) for r, x in zip(reach, xv)])
        rest = np.array([cached_bound(self.gamma, spectral, r, x) for r, x in zip(own, xv)])
        return step, solve, np.maximum(full - rest, 0.0), full, refreshed

    def _bounds(self, spectral, gram, step, drift, terms, solve) -> dict[Any, float]:
        """Each bound of the step's residual (joint over heads, plus the solve's residual): the
        chosen one under ``(bound, "chosen")``, and the tracked ones by name. ``gram`` is
        ``X'^T X'`` on D' (for ``||X'v||`` when no per-sample terms were asked)."""
        p = self.params
        step_norms = np.linalg.norm(step, axis=1)
        if terms is not None:
            xv = np.sqrt(np.maximum(terms.xv_squared, 0.0))
        else:
            xv = np.sqrt(np.maximum(np.einsum("kd,de,ke->k", step, gram, step), 0.0))

        def joint(bound: str, gamma: float) -> float:
            if bound == "corollary":
                per_head = [
                    corollary_bound(gamma, spectral, step_norms[k], xv[k], drift[k])
                    for k in range(len(step))
                ]
            else:
                per_head = [
                    per_point_bound(gamma, spectral, terms.point[k]) for k in range(len(step))
                ]
            return joint_norm(np.asarray(per_head) + solve)

        out: dict[Any, float] = {(p.bound, "chosen"): joint(p.bound, self.gamma)}
        if p.track_bounds:
            paper, exact = (lipschitz_gamma(p.loss, g) for g in ("paper", "exact"))
            out["corollary-1"] = joint("corollary", paper)
            out["per-point-paper-gamma"] = joint("per-point", paper)
            out["per-point-exact-gamma"] = joint("per-point", exact)
        return out
