"""Certified removal on a linear head (Guo, Goldstein, Hannun, van der Maaten, ICML 2020).

Training (Algorithm 1) minimises the perturbed, L2-regularised loss

    L_b(w; D) = sum_i l(w^T x_i, y_i) + (lambda n / 2) ||w||^2 + b^T w            (Sec. 3, eq. 2)

to its exact minimiser (Newton, gradient norm <= ``tol`` relative to its value at w = 0), with ``b``
Gaussian N(0, sigma^2)^d for (epsilon, delta)-certified removal or with density
``~ exp(-epsilon ||b|| / epsilon')`` for epsilon-CR (Theorem 3; here ``sigma = epsilon'/epsilon``,
the norm is Gamma(d, sigma) and the direction uniform).

Removing a batch B of m samples (Algorithm 2) takes one Newton step

    Delta = m lambda w + sum_{i in B} grad l(w^T x_i, y_i),   w <- w + H^{-1} Delta,

with H the Hessian of L on the remaining data D' (n - m samples, regularisation lambda (n - m)).
The gradient residual ``||grad L_b(w; D')||`` is bounded after every step and the bounds add up in
``beta``; while ``beta <= epsilon' = sigma epsilon / c``, ``c = sqrt(2 log(1.5 / delta))`` (Gaussian;
``sigma epsilon`` for the Gamma density), the model is certified. A request that would exceed the
budget retrains on D' with a fresh ``b`` instead: no model with ``beta`` over budget is returned.

How the residual after a step is bounded (Corollary 1, or the per-point bound, with the solve's
measured error added) is in :mod:`fedunlearn.certified.certificate`, with the bounds themselves.

Two modes (``mode=``): ``"exact"`` builds the Hessian at the current w for every request and solves
by Cholesky (never an explicit inverse); ``"fast"`` keeps the eigendecomposition of the data part of
the Hessian at an anchor w0, ``A = Q Lambda Q^T``, so that ``A + lambda m I`` is solved for any count
m in O(d^2) (a Cholesky factor could not absorb the shift lambda I that each removal brings), and the
removed samples' parts ``U U^T`` by the Woodbury identity (:mod:`fedunlearn.certified.fast_factor`).
A data that measures the anchor's stale vector (``measures_staleness``, the central data:
:mod:`fedunlearn.certified.staleness`) gets the bounds at w0 = w plus the measured
``||S|| = ||(H'(w) - H'(w0)) v||`` in the solve's residual, and the anchor is refreshed when those
stale parts since w0 exceed ``refresh_ratio`` times the rest of those requests' bounds; otherwise
(a federation) the bounds widen with the drift ``w - w0`` as above, and the anchor is refreshed when
``||w - w0||`` exceeds ``refresh_ratio`` times the step. Either way a downdate past ``max_rank``
refreshes. ``||X'||_2^2 = lambda_max(K')`` is computed at training and is an upper bound later,
because ``K' = K - sum x x^T <= K``; it is recomputed once ``spectral_every`` samples were removed
since *and* their rows could have lowered it by more than
:data:`~fedunlearn.certified.removal_step.SPECTRAL_GAIN` (``||x|| <= 1``, so m rows lower
``lambda_max`` by at most m): on MNIST 3 vs 8, every 175 removals rather than 100. Each mode's
step and its bounds are computed by :class:`fedunlearn.certified.removal_step.RemovalStep`.

``bound="cached"`` (fast mode) reads no X per request: Corollary 1,
``gamma ||X'||_2 max_i (|a_i| + |b_i|/2) ||X'v||``, with ``K' = X'^T X'`` downdated by the removed
rows, ``||X'||_2`` recomputed from that cache and ``max_i`` bounded by a sketch of the rows, each
with its rounding bound (:mod:`fedunlearn.certified.cached_bound`); the anchor is refreshed when
the drift parts of those bounds since it exceed ``cached_refresh_share`` of the budget.

Multiclass heads are one-vs-rest: K independent binary problems sharing X, one joint ``b`` (K x d);
the joint residual's norm is bounded by the root of the sum of the heads' squared bounds.

Randomness. b comes from the operating system (:mod:`fedunlearn.certified.perturbation`), never from a seed,
and is never written: the trained head together with the data determines it exactly
(``b = -grad L(w; D) - lambda n w`` at the minimiser), so the engine publishes no weights itself
and a caller should write only the final head. A head rebuilt after a restart is retrained with a
fresh b.

Transactions. :meth:`CertifiedHead.fit` and :meth:`CertifiedHead.remove` compute the new state aside
and commit it only after the certificate is in the ledger: when any step fails (a data query, the
linear algebra, a retrain, the ledger append) the weights, b, the data's removal mask, beta, the
bounds, the request counter, every cache and the ledger's bytes are exactly as before, and the
request can be retried. The ``progress`` callback runs after the commit; if it raises, the request
stays done and :class:`ProgressCallbackError` (carrying the certificate) tells the caller not to
retry it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.certified.cached_bound import GramCache
from fedunlearn.certified.certificate import (
    Certificate,
    CertifiedRemovalParams,
    ProgressCallbackError,
    append_certificate,
    jsonable,
    utc_timestamp,
    weights_sha256,
    worst_case_bound,
)
from fedunlearn.certified.fast_factor import FastFactor
from fedunlearn.certified.head_data import HeadData, id_list
from fedunlearn.certified.losses import NORM_TOLERANCE, lipschitz_gamma
from fedunlearn.certified.perturbation import check_generator, sample_perturbation
from fedunlearn.certified.removal_step import RemovalStep
from fedunlearn.certified.solvers import (
    NotConvergedError,
    check_finite,
    cholesky_solve,
    factorise,
    joint_norm,
    top_eigenvalue,
)
from fedunlearn.certified.statistics import HeadSums
from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.store.durable_io import log_size, truncate_log

#: The engine's state that a request moves, all or nothing (see the module docstring).
_STATE = (
    "weights",
    "perturbation",
    "beta",
    "worst_case",
    "tracked",
    "requests",
    "trained",
    "_gram",
    "_gram_cache",
    "_spectral_sq",
    "_since_spectral",
    "_anchor",
    "_factors",
    "_stale_since",
    "_bound_since",
)


class CertifiedHead(RemovalStep):
    """A linear head trained and unlearned with certificates; the same engine centrally and federated.

    Parameters
    ----------
    data : HeadData
        The training set (:class:`fedunlearn.certified.head_data.CentralHeadData`, or the federation).
    params : CertifiedRemovalParams
    rng : numpy.random.Generator, optional
        Source of b for tests only. ``None`` (the default, and the only choice of the run config)
        draws every b -- at training and at each retrain -- from the operating system's
        cryptographic randomness (:mod:`fedunlearn.certified.perturbation`). There is no seed.
    ledger : path, optional
        Every certificate is appended to it as one JSON line.
    dp_epsilon, dp_delta : float
        The (epsilon, delta) of a differentially private feature extractor; certificates report the
        composition epsilon_DP + epsilon, delta_DP + delta (Guo et al. Theorem 5).
    progress : callable, optional
        Called with each certificate after its request committed; if it raises, the request stays
        done and :class:`ProgressCallbackError` is raised from the callback's error.
    """

    def __init__(
        self,
        data: HeadData,
        params: CertifiedRemovalParams | None = None,
        *,
        rng: np.random.Generator | None = None,
        ledger: str | Path | None = None,
        dp_epsilon: float = 0.0,
        dp_delta: float = 0.0,
        progress: Callable[[Certificate], Any] | None = None,
    ) -> None:
        self.params = params or CertifiedRemovalParams()
        self.params.validate()
        if data.loss != self.params.loss:
            raise ConfigError("loss", self.params.loss, f"the data's loss {data.loss!r}")
        if dp_epsilon < 0 or dp_delta < 0:
            raise ConfigError("dp_epsilon/dp_delta", (dp_epsilon, dp_delta), "numbers >= 0")
        self.data = data
        self._rng = check_generator(rng)
        self.ledger = Path(ledger) if ledger is not None else None
        self.dp_epsilon = float(dp_epsilon)
        self.dp_delta = float(dp_delta)
        self.progress = progress
        self.gamma = lipschitz_gamma(self.params.loss, self.params.gamma)
        shape = (data.num_heads, data.dim)
        self.weights = np.zeros(shape)
        self.perturbation = np.zeros(shape)
        self.beta = 0.0
        self.worst_case: float | None = 0.0 if self.params.worst_case_applies else None
        self.tracked: dict[str, float] = {}
        self.requests = 0
        self.trained = False
        self._gram: np.ndarray | None = None  # X'^T X' when the data ships removed rows' grams
        self._gram_cache: GramCache | None = None  # the "cached" bound's K' (and its error)
        self._spectral_sq = 0.0
        self._since_spectral = 0
        self._anchor = np.zeros(shape)
        self._factors: tuple[FastFactor, ...] = ()
        self._stale_since = 0.0  # measured stale parts of the bounds since the anchor (fast mode)
        self._bound_since = 0.0  # the chosen bounds since the anchor (fast mode)

    # ------------------------------------------------------------------ properties
    @property
    def budget(self) -> float:
        return self.params.budget

    def scores(self, features: np.ndarray) -> np.ndarray:
        return features @ self.weights.T

    def residual(self) -> float:
        """The true ``||grad L_b(w; D')||`` on the current data (one pass; for tests and readouts)."""
        sums = self.data.sums(self.weights, hessian=False)
        return float(np.linalg.norm(self._gradient(sums, self.weights, self.perturbation)))

    def _gradient(self, sums: HeadSums, weights: np.ndarray, b: np.ndarray) -> np.ndarray:
        return sums.gradient + self.params.lam * sums.count * weights + b

    # ------------------------------------------------------------------ transactions
    def _capture(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in _STATE}
        state["tracked"] = dict(self.tracked)
        return state

    def _reinstate(self, state: dict[str, Any]) -> None:
        for name in _STATE:
            setattr(self, name, state[name])

    def _transaction(self, work: Callable[[], tuple[dict[str, Any], dict[str, Any]]]):
        """Run ``work`` (which returns the new state and the certificate's fields without changing
        the engine), append its certificate, then commit; on any failure undo the data's changes
        and the ledger's bytes and re-raise (module docstring, "Transactions")."""
        saved = self._capture()
        data_state = self.data.snapshot()
        mark = log_size(self.ledger) if self.ledger is not None else None
        try:
            updates, record = work()
            certificate = self._certificate({**saved, **updates}, record)
            if self.ledger is not None:
                append_certificate(self.ledger, certificate)
        except BaseException:
            self.data.restore(data_state)
            self._reinstate(saved)
            if self.ledger is not None:
                truncate_log(self.ledger, mark)
            raise
        self._reinstate({**saved, **updates, "requests": certificate.request})
        if self.progress is not None:
            try:
                self.progress(certificate)
            except Exception as error:
                raise ProgressCallbackError(certificate) from error
        return certificate

    # ------------------------------------------------------------------ Algorithm 1
    def fit(self, perturbation: np.ndarray | None = None) -> Certificate:
        """Train on the current data to the exact minimiser of L_b (Algorithm 1) with a fresh b.

        ``perturbation``: use this b instead of a fresh draw -- only to rebuild, in memory, a head
        whose b is held in memory (the federated-vs-central check); never a b read from anywhere.
        """
        if perturbation is None:
            b = self._draw()
        else:
            b = np.array(perturbation, dtype=np.float64, copy=True)
            if b.shape != self.weights.shape or not np.all(np.isfinite(b)):
                raise ConfigError(
                    "perturbation",
                    f"array of shape {b.shape}",
                    f"a finite array of shape {self.weights.shape}",
                )

        def work():
            start = time.perf_counter()
            n = self.data.count()
            updates = self._trained_state(b, self.tracked)
            record = {
                "kind": "train",
                "ids": [],
                "removed": 0,
                "n_before": n,
                "beta_before": self.beta,
                "step_bound": 0.0,
                "solve_residual": 0.0,
                "retrained": True,
                "refreshed": True,
                "start": start,
            }
            return updates, record

        return self._transaction(work)

    def _draw(self) -> np.ndarray:
        return sample_perturbation(
            self.params.noise, self.params.sigma, self.weights.shape, self._rng
        )

    def _trained_state(self, b: np.ndarray, tracked: dict[str, float]) -> dict[str, Any]:
        """The engine's state after training on the current data with perturbation ``b``."""
        weights, sums = self._newton(b)
        beta = float(np.linalg.norm(self._gradient(sums, weights, b)))
        gram = self.data.gram()
        check_finite("the Gram matrix X'^T X'", gram)
        state = {
            "weights": weights,
            "perturbation": b,
            "beta": beta,
            "worst_case": 0.0 if self.params.worst_case_applies else None,
            "tracked": dict.fromkeys(tracked, beta),
            "trained": True,
            "_gram": gram,
            "_spectral_sq": top_eigenvalue(gram),
            "_since_spectral": 0,
        }
        if self.params.mode == "fast":
            state.update(self._anchored(weights, sums))
        if self.params.bound == "cached":
            state.update(self._cached_statistics(gram))
        return state

    def _cached_statistics(self, gram: np.ndarray) -> dict[str, Any]:
        """The ``"cached"`` bound's statistics after training: K' with its rounding bound (formed
        from ``gram_rows`` rows, or the count), the upper bound of ``||X'||_2^2`` from it, and the
        data's row sketch when it keeps one (:mod:`fedunlearn.certified.cached_bound`)."""
        summed = int(getattr(self.data, "gram_rows", self.data.count()))
        mass = summed * (1.0 + NORM_TOLERANCE) ** 2
        cache = GramCache.from_gram(gram, summed, mass)
        prepare = getattr(self.data, "prepare_sketch", None)
        if prepare is not None and self.params.sketch_rank:
            prepare(self.params.sketch_rank)
        return {"_gram": None, "_gram_cache": cache, "_spectral_sq": cache.top_eigenvalue_upper()}

    def _anchored(self, weights: np.ndarray, sums: HeadSums) -> dict[str, Any]:
        """The fast mode's state anchored at ``weights``, whose sums (with Hessian) are ``sums``."""
        return {
            "_anchor": weights.copy(),
            "_factors": factorise(sums, self.params.lam * sums.count),
            "_stale_since": 0.0,
            "_bound_since": 0.0,
        }

    def _sums(self, weights: np.ndarray, **options) -> HeadSums:
        sums = self.data.sums(weights, **options)
        check_finite("the loss/gradient/Hessian sums", sums.loss, sums.gradient, sums.hessian)
        return sums

    def _newton(self, b: np.ndarray) -> tuple[np.ndarray, HeadSums]:
        lam = self.params.lam
        weights = np.zeros_like(b)
        reference = None
        for _ in range(self.params.max_newton + 1):
            sums = self._sums(weights, hessian=True)
            n = sums.count
            grad = sums.gradient + lam * n * weights + b
            norm = float(np.linalg.norm(grad))
            if reference is None:
                reference = max(norm, 1e-300)
            if norm <= self.params.tol * reference:
                return weights, sums
            objective = (
                sums.loss + 0.5 * lam * n * np.sum(weights**2, axis=1) + np.sum(b * weights, axis=1)
            )
            direction = np.stack(
                [
                    cholesky_solve(sums.hessian[k] + lam * n * np.eye(len(grad[k])), grad[k])
                    for k in range(len(grad))
                ]
            )
            decrement = np.sum(grad * direction, axis=1)
            t = np.ones(len(grad))
            for _ in range(60):
                trial = weights - t[:, None] * direction
                trial_loss = self._sums(trial, hessian=False).loss
                trial_obj = (
                    trial_loss
                    + 0.5 * lam * n * np.sum(trial**2, axis=1)
                    + np.sum(b * trial, axis=1)
                )
                # Armijo, per head; a decrement below rounding of the objective is accepted as is.
                ok = (trial_obj <= objective - 1e-4 * t * decrement) | (
                    decrement <= 1e-12 * np.maximum(np.abs(objective), 1.0)
                )
                if ok.all():
                    break
                t = np.where(ok, t, 0.5 * t)
            weights = trial
        raise NotConvergedError(
            f"Newton stopped after {self.params.max_newton} iterations with gradient norm "
            f"{norm:.3g} > tol * {reference:.3g}; raise max_newton or tol, or check the features"
        )

    # ------------------------------------------------------------------ Algorithm 2
    def remove(self, ids: Sequence[Hashable]) -> Certificate:
        """Remove samples ``ids`` with one Newton step and certify it, or retrain (Algorithm 2).

        ``ids``: a list of integer ids (row indices centrally; (partition id, local index) pairs in
        a federation); bool, float and str are refused, never coerced. The request is a
        transaction (module docstring): if it fails, nothing changed and it can be retried.
        """
        if not self.trained:
            raise FedUnlearnError("fit() the certified head before removing samples")
        ids = id_list(ids)
        return self._transaction(lambda: self._removal(ids))

    def _removal(self, ids: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        start = time.perf_counter()
        p = self.params
        weights = self.weights
        n_before = self.data.count()
        # Only the fast mode downdates a cached factor; the exact mode needs no factor shipped.
        parts = self.data.removed(ids, weights, self._anchor if p.mode == "fast" else None)
        check_finite("the removed samples' parts", parts.gradient, parts.factor, parts.gram)
        m = parts.count
        if m != len(ids):
            raise FedUnlearnError(f"the data returned the parts of {m} samples for {len(ids)} ids")
        if m >= n_before:
            raise ConfigError("ids", f"{m} samples", f"fewer than all {n_before} training samples")
        delta = p.lam * m * weights + parts.gradient
        self.data.drop(ids)
        n = n_before - m
        if self.data.count() != n:
            raise FedUnlearnError(f"dropping {m} of {n_before} samples left {self.data.count()}")
        if p.bound == "cached":  # no read of X (fedunlearn.certified.cached_bound)
            state = self._cached_state(parts, m)
            step, solve, stale, per_head, refreshed = self._cached_step(
                weights, delta, p.lam * n, parts, state
            )
            bounds = {(p.bound, "chosen"): joint_norm(per_head + solve)}
            measured = solve  # the drift parts are bounded, not measured
        else:
            state = self._spectral_state(parts, m)
            step, solve, stale, bounds, refreshed = self._step_and_bounds(
                weights, delta, p.lam * n, parts, state
            )
            measured = solve + stale
        chosen = bounds[(p.bound, "chosen")]
        if p.mode == "fast":
            since = (0.0, 0.0) if refreshed else (self._stale_since, self._bound_since)
            state["_stale_since"] = since[0] + joint_norm(stale)
            state["_bound_since"] = since[1] + chosen
        tracked = dict(self.tracked)
        if p.track_bounds:
            for name in ("corollary-1", "per-point-paper-gamma", "per-point-exact-gamma"):
                if name in bounds:  # the cached bound tracks none (they would read X)
                    tracked[name] = tracked.get(name, self.beta) + bounds[name]
        candidate = self.beta + chosen
        retrained = p.noise != "none" and candidate > self.budget
        if retrained:
            # No model over budget is ever returned: retrain on D' with a fresh b instead.
            state = self._trained_state(self._draw(), tracked)
        else:
            state["weights"] = weights + step
            state["beta"] = candidate
            state["tracked"] = tracked
            if self.worst_case is not None:
                worst = worst_case_bound(p.lam, n_before, m, gamma=self.gamma)
                state["worst_case"] = self.worst_case + math.sqrt(len(step)) * worst
        record = {
            "kind": "remove",
            "ids": ids,
            "removed": m,
            "n_before": n_before,
            "beta_before": self.beta,
            "step_bound": chosen,
            "solve_residual": joint_norm(measured),
            "retrained": retrained,
            "refreshed": refreshed or retrained,
            "start": start,
        }
        return state, record

    def _step_and_bounds(self, weights, delta, mu: float, parts, state: dict[str, Any]):
        """The step of the exact or fast mode and its bounds (all but the ``"cached"`` bound):
        the step, the solve's residual, the measured stale parts, the bounds, and whether the
        fast mode's factor was refreshed."""
        p = self.params
        spectral = math.sqrt(state.get("_spectral_sq", self._spectral_sq))
        stale = np.zeros(len(weights))
        if p.mode == "exact":
            step, solve, drift, terms = self._exact_step(weights, delta, mu)
            refreshed = False
        elif getattr(self.data, "measures_staleness", False):
            step, solve, stale, terms, refreshed = self._measured_step(
                weights, delta, mu, parts.factor, state
            )
            drift = np.zeros(len(step))
        else:
            step, solve, drift, terms, refreshed = self._fast_step(
                weights, delta, mu, parts.factor, state
            )
        bounds = self._bounds(spectral, state["_gram"], step, drift, terms, solve + stale)
        return step, solve, stale, bounds, refreshed

    # ------------------------------------------------------------------ ledger
    def _certificate(self, state: dict[str, Any], record: dict[str, Any]) -> Certificate:
        """The certificate of a request whose new engine state is ``state``."""
        p = self.params
        start = record.pop("start")
        beta = state["beta"]
        return Certificate(
            request=state["requests"] + 1,
            ids=[jsonable(i) for i in record.pop("ids")],
            n_after=self.data.count(),
            loss=p.loss,
            lam=p.lam,
            sigma=p.sigma,
            epsilon=p.epsilon,
            delta=p.delta if p.noise == "gaussian" else 0.0,
            noise=p.noise,
            mode=p.mode,
            bound=p.bound,
            gamma=self.gamma,
            budget=self.budget,
            beta_after=beta,
            spectral_norm=math.sqrt(state["_spectral_sq"]),
            worst_case=state["worst_case"],
            certified=p.noise == "none" or beta <= self.budget,
            seconds=time.perf_counter() - start,
            timestamp=utc_timestamp(),
            weights_sha256=weights_sha256(state["weights"]),
            weights_shape=list(state["weights"].shape),
            dp_epsilon=self.dp_epsilon,
            dp_delta=self.dp_delta,
            total_epsilon=self.dp_epsilon + (0.0 if p.noise == "none" else p.epsilon),
            total_delta=self.dp_delta + (p.delta if p.noise == "gaussian" else 0.0),
            tracked=dict(state["tracked"]),
            **record,
        )
