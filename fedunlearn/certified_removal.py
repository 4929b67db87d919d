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

The residual after a step v from w, with the step's Hessian taken at an anchor w0, is exactly

    grad L'(w + v) = r_prev + [H'(w0) v - Delta] + int_0^1 (H'(w + t v) - H'(w0)) v dt,

where r_prev is the residual before the request. The bracket is the linear solve's own error; this
module measures its norm in float64 and adds it to the bound (zero up to rounding in exact arithmetic),
so a rounding or a stale factor can never make the certificate lie. The integral is
``X'^T diag(e) X' v`` with ``|e_i| <= gamma (|a_i| + |b_i| / 2)``, ``a_i = x_i^T (w - w0)``,
``b_i = x_i^T v`` (``gamma`` the Lipschitz constant of l''). Hence two bounds (``bound=``):

* ``"corollary"``: ``gamma ||X'||_2 (||w - w0|| + ||v||) ||X' v||`` -- Guo et al.'s Corollary 1
  (``gamma ||X'|| ||v|| ||X'v||``) when w0 = w, widened for a stale anchor; O(d^2) from K = X'^T X'.
* ``"per-point"``: ``gamma ||X'||_2 sqrt(sum_i (|a_i| + |b_i|/2)^2 b_i^2)``; with w0 = w it is
  ``gamma ||X'|| sqrt(sum b_i^4) / 2``, never more than half of Corollary 1's since ``|b_i| <= ||v||``.
  O(nd) per request (one scalar sum per client in a federation). The default, with the exact
  ``gamma = 1/(6 sqrt 3)`` of the logistic l''.

Two modes (``mode=``): ``"exact"`` builds the Hessian at the current w for every request and solves
by Cholesky (never an explicit inverse); ``"fast"`` keeps the eigendecomposition of the data part of
the Hessian at an anchor w0, ``A = Q Lambda Q^T``, so that ``A + lambda m I`` is solved for any count
m in O(d^2) (a Cholesky factor could not absorb the shift lambda I that each removal brings), and the
removed samples' parts ``U U^T`` by the Woodbury identity; it refreshes the anchor when the drift
``||w - w0||`` exceeds ``refresh_ratio`` times the step or the downdate rank exceeds ``max_rank``.
``||X'||_2^2 = lambda_max(K')`` is computed at training and refreshes and is an upper bound in between,
because ``K' = K - sum x x^T <= K``.

Multiclass heads are one-vs-rest: K independent binary problems sharing X, one joint ``b`` (K x d);
the joint residual's norm is bounded by the root of the sum of the heads' squared bounds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg

from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.head_statistics import HeadData, HeadSums
from fedunlearn.linear_losses import LOGISTIC_GAMMA, check_loss, lipschitz_gamma

NOISES = ("gaussian", "gamma", "none")
MODES = ("exact", "fast")
BOUNDS = ("per-point", "corollary")
GAMMAS = tuple(LOGISTIC_GAMMA)


class NotConvergedError(FedUnlearnError, RuntimeError):
    """Newton's method did not reach the requested gradient tolerance."""


def gaussian_c(delta: float) -> float:
    """``c = sqrt(2 log(1.5 / delta))`` of Theorem 3 (delta = 1.5 exp(-c^2 / 2))."""
    return math.sqrt(2.0 * math.log(1.5 / delta))


def removal_budget(noise: str, sigma: float, epsilon: float, delta: float) -> float:
    """epsilon', the largest certified gradient residual: ``sigma epsilon / c`` (Gaussian b),
    ``sigma epsilon`` (Gamma-norm b, epsilon-CR), 0 without perturbation."""
    if noise == "gaussian":
        return sigma * epsilon / gaussian_c(delta)
    if noise == "gamma":
        return sigma * epsilon
    return 0.0


def sample_perturbation(
    noise: str, sigma: float, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """The loss perturbation b of Algorithm 1 (Theorem 3's two densities), shape ``shape``."""
    if noise == "gaussian":
        return rng.normal(0.0, sigma, size=shape)
    if noise == "gamma":
        size = int(np.prod(shape))
        direction = rng.normal(size=size)
        direction /= np.linalg.norm(direction)
        return (rng.gamma(shape=size, scale=sigma) * direction).reshape(shape)
    return np.zeros(shape)


def corollary_bound(
    gamma: float, spectral_norm: float, step_norm: float, xv_norm: float, drift_norm: float = 0.0
) -> float:
    """``gamma ||X'||_2 (||w - w0|| + ||v||) ||X'v||`` (Guo et al. Corollary 1 when w0 = w)."""
    return gamma * spectral_norm * (drift_norm + step_norm) * xv_norm


def per_point_bound(gamma: float, spectral_norm: float, point_sum: float) -> float:
    """``gamma ||X'||_2 sqrt(sum_i (|a_i| + |b_i|/2)^2 b_i^2)`` (module docstring)."""
    return gamma * spectral_norm * math.sqrt(max(point_sum, 0.0))


def worst_case_bound(
    lam: float, n_before: int, m: int, *, gamma: float = 0.25, c: float = 1.0
) -> float:
    """Data-independent bound of one request removing m of n samples: ``4 gamma m^2 C^2 /
    (lambda^2 (n - m))`` (Theorem 4; Theorem 1 for m = 1)."""
    return 4.0 * gamma * m * m * c * c / (lam * lam * (n_before - m))


def _joint(per_head: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(per_head))))


def cholesky_solve(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``matrix^{-1} rhs`` for a symmetric positive definite matrix, by Cholesky (no inverse formed).

    The factor comes from NumPy's LAPACK, the two triangular solves (O(d^2)) from SciPy: keeping the
    O(d^3) work in the BLAS that also forms the Hessians avoids two BLAS thread pools fighting over
    the cores (SciPy and NumPy each ship an OpenBLAS).
    """
    lower = np.linalg.cholesky(matrix)
    return scipy.linalg.solve_triangular(
        lower.T,
        scipy.linalg.solve_triangular(lower, rhs, lower=True, check_finite=False),
        lower=False,
        check_finite=False,
    )


def _top_eigenvalue(matrix: np.ndarray) -> float:
    return max(float(np.linalg.eigvalsh(matrix)[-1]), 0.0)


@dataclass(frozen=True)
class CertifiedRemovalParams:
    """Settings of a certified head. ``sigma`` is b's standard deviation (Gaussian) or its norm's
    Gamma scale epsilon'/epsilon; ``lam`` the lambda of ``(lambda n / 2) ||w||^2``.

    ``refresh_ratio`` (fast mode): refresh the cached Hessian when ``||w - w0|| > ratio ||v||``. On
    MNIST 3 vs 8 (100 removals) ratio 2 refreshed 35 times and ended with beta 1.3x exact mode's,
    ratio 5 refreshed 18 times at 1.6x, ratio 20 four times at 2.9x; 5 is the default.
    ``single_precision_hessian`` (exact mode): form the per-request Hessian in float32 (twice as
    fast); the solve's residual is measured in float64 and added to beta, so the certificate holds.
    Least squares always uses float64 (its step is exact).
    """

    loss: str = "logistic"
    lam: float = 1e-3
    sigma: float = 10.0
    epsilon: float = 1.0
    delta: float = 1e-4
    noise: str = "gaussian"
    mode: str = "exact"
    bound: str = "per-point"
    gamma: str = "exact"
    refresh_ratio: float = 5.0
    max_rank: int = 64
    spectral_every: int = 100
    tol: float = 1e-10
    max_newton: int = 100
    track_bounds: bool = False
    single_precision_hessian: bool = True

    def validate(self) -> None:
        check_loss(self.loss)
        for name, allowed in (
            ("noise", NOISES),
            ("mode", MODES),
            ("bound", BOUNDS),
            ("gamma", GAMMAS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(name, getattr(self, name), f"one of {', '.join(allowed)}")
        if not self.lam > 0:
            raise ConfigError(
                "lam", self.lam, "a number > 0 (the regulariser makes L strongly convex)"
            )
        if self.noise == "none":
            if self.loss != "least-squares":
                raise ConfigError(
                    "noise",
                    self.noise,
                    "gaussian or gamma for the logistic loss (only least squares "
                    "removes exactly without a perturbation)",
                )
        elif not self.sigma > 0:
            raise ConfigError("sigma", self.sigma, "a number > 0 (the perturbation's scale)")
        if not self.epsilon > 0:
            raise ConfigError("epsilon", self.epsilon, "a number > 0")
        if self.noise == "gaussian" and not 0 < self.delta < 1.5:
            raise ConfigError("delta", self.delta, "a number in (0, 1.5)")
        if not self.refresh_ratio > 0:
            raise ConfigError("refresh_ratio", self.refresh_ratio, "a number > 0")
        for name in ("max_rank", "spectral_every", "max_newton"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(name, getattr(self, name), "an integer >= 1")
        if not 0 < self.tol < 1:
            raise ConfigError("tol", self.tol, "a number in (0, 1)")

    @property
    def budget(self) -> float:
        return removal_budget(self.noise, self.sigma, self.epsilon, self.delta)


@dataclass
class Certificate:
    """What one training or removal request certifies; one line of the ledger."""

    request: int
    kind: str  # "train" or "remove"
    ids: list[Any]
    removed: int
    n_before: int
    n_after: int
    loss: str
    lam: float
    sigma: float
    epsilon: float
    delta: float
    noise: str
    mode: str
    bound: str
    gamma: float
    budget: float
    beta_before: float
    beta_after: float
    step_bound: float
    solve_residual: float
    spectral_norm: float
    worst_case: float
    retrained: bool
    refreshed: bool
    certified: bool
    seconds: float
    dp_epsilon: float = 0.0
    dp_delta: float = 0.0
    total_epsilon: float = 0.0
    total_delta: float = 0.0
    tracked: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _FastFactor:
    """Eigendecomposition ``A = Q diag(eig) Q^T`` of one head's data Hessian at the anchor, and
    ``P = Q^T U`` for the removed samples' factor rows U since then."""

    q: np.ndarray
    eig: np.ndarray
    p: np.ndarray

    def solve(self, rhs: np.ndarray, mu: float) -> tuple[np.ndarray, float]:
        """v with ``(A + mu I - U U^T) v = rhs`` (Woodbury) and the solve's residual norm."""
        y = self.q.T @ rhs
        inv = 1.0 / (self.eig + mu)
        if self.p.shape[1]:
            small = np.eye(self.p.shape[1]) - self.p.T @ (inv[:, None] * self.p)
            z = np.linalg.solve(small, self.p.T @ (inv * y))
            coef = inv * (y + self.p @ z)
        else:
            coef = inv * y
        residual = (self.eig + mu) * coef - self.p @ (self.p.T @ coef) - y
        return self.q @ coef, float(np.linalg.norm(residual))


class CertifiedHead:
    """A linear head trained and unlearned with certificates; the same engine centrally and federated.

    Parameters
    ----------
    data : HeadData
        The training set (:class:`fedunlearn.head_statistics.CentralHeadData`, or the federation).
    params : CertifiedRemovalParams
    seed : int
        Seeds the perturbation b (fresh draws on every retrain come from the same generator).
    ledger : path, optional
        Every certificate is appended to it as one JSON line.
    dp_epsilon, dp_delta : float
        The (epsilon, delta) of a differentially private feature extractor; certificates report the
        composition epsilon_DP + epsilon, delta_DP + delta (Guo et al. Theorem 5).
    progress : callable, optional
        Called with each certificate.
    """

    def __init__(
        self,
        data: HeadData,
        params: CertifiedRemovalParams | None = None,
        *,
        seed: int = 0,
        ledger: str | Path | None = None,
        dp_epsilon: float = 0.0,
        dp_delta: float = 0.0,
        progress=None,
    ) -> None:
        self.params = params or CertifiedRemovalParams()
        self.params.validate()
        if data.loss != self.params.loss:
            raise ConfigError("loss", self.params.loss, f"the data's loss {data.loss!r}")
        if dp_epsilon < 0 or dp_delta < 0:
            raise ConfigError("dp_epsilon/dp_delta", (dp_epsilon, dp_delta), "numbers >= 0")
        self.data = data
        self.rng = np.random.default_rng(seed)
        self.ledger = Path(ledger) if ledger is not None else None
        self.dp_epsilon = float(dp_epsilon)
        self.dp_delta = float(dp_delta)
        self.progress = progress
        self.gamma = lipschitz_gamma(self.params.loss, self.params.gamma)
        shape = (data.num_heads, data.dim)
        self.weights = np.zeros(shape)
        self.perturbation = np.zeros(shape)
        self.beta = 0.0
        self.worst_case = 0.0
        self.tracked: dict[str, float] = {}
        self.requests = 0
        self.trained = False
        self._gram = np.zeros((data.dim, data.dim))
        self._spectral_sq = 0.0
        self._since_spectral = 0
        self._anchor = np.zeros(shape)
        self._factors: list[_FastFactor] = []

    # ------------------------------------------------------------------ properties
    @property
    def budget(self) -> float:
        return self.params.budget

    def scores(self, features: np.ndarray) -> np.ndarray:
        return features @ self.weights.T

    def residual(self) -> float:
        """The true ``||grad L_b(w; D')||`` on the current data (one pass; for tests and readouts)."""
        return float(np.linalg.norm(self._gradient(self.data.sums(self.weights, hessian=False))))

    # ------------------------------------------------------------------ Algorithm 1
    def fit(self) -> Certificate:
        """Train on the current data with a fresh b to the exact minimiser (Algorithm 1)."""
        start = time.perf_counter()
        n = self.data.count()
        beta_before = self.beta
        self._train()
        return self._record(
            kind="train",
            ids=[],
            removed=0,
            n_before=n,
            beta_before=beta_before,
            step_bound=0.0,
            solve_residual=0.0,
            retrained=True,
            refreshed=True,
            start=start,
        )

    def _train(self) -> HeadSums:
        self.perturbation = sample_perturbation(
            self.params.noise, self.params.sigma, self.weights.shape, self.rng
        )
        self.weights, sums = self._newton(self.perturbation)
        self.beta = float(np.linalg.norm(self._gradient(sums)))
        self.worst_case = 0.0
        self.tracked = dict.fromkeys(self.tracked, self.beta)
        self._gram = self.data.gram()
        self._refresh_spectral()
        if self.params.mode == "fast":
            self._refresh_factor(sums)
        self.trained = True
        return sums

    def _gradient(self, sums: HeadSums) -> np.ndarray:
        n = sums.count
        return sums.gradient + self.params.lam * n * self.weights + self.perturbation

    def _newton(self, b: np.ndarray) -> tuple[np.ndarray, HeadSums]:
        lam = self.params.lam
        weights = np.zeros_like(b)
        reference = None
        for _ in range(self.params.max_newton + 1):
            sums = self.data.sums(weights, hessian=True)
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
                trial_loss = self.data.sums(trial, hessian=False).loss
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
        """Remove samples ``ids`` with one Newton step and certify it, or retrain (Algorithm 2)."""
        if not self.trained:
            raise FedUnlearnError("fit() the certified head before removing samples")
        start = time.perf_counter()
        p = self.params
        ids = list(ids)
        weights = self.weights
        n_before = self.data.count()
        # Only the fast mode downdates a cached factor; the exact mode needs no factor shipped.
        parts = self.data.removed(ids, weights, self._anchor if p.mode == "fast" else None)
        m = parts.count
        if m >= n_before:
            raise ConfigError("ids", f"{m} samples", f"fewer than all {n_before} training samples")
        delta = p.lam * m * weights + parts.gradient
        self.data.drop(ids)
        n = n_before - m
        mu = p.lam * n
        self._gram -= parts.gram
        self._since_spectral += m
        if self._since_spectral >= p.spectral_every:
            self._refresh_spectral()
        refreshed = False
        if p.mode == "exact":
            # The step's own error H'(w) v - Delta is measured in float64 below, so a float32
            # Hessian (single_precision_hessian) is safe here; the fast mode's factor must be exact.
            # Least squares keeps float64: its Newton step is exact and should stay so.
            single = p.single_precision_hessian and p.loss == "logistic"
            sums = self.data.sums(weights, hessian=True, single_precision=single)
            step = np.stack(
                [
                    cholesky_solve(sums.hessian[k] + mu * np.eye(self.data.dim), delta[k])
                    for k in range(len(delta))
                ]
            )
            terms = self.data.step(weights, weights, step, hessian_vector=True)
            solve = np.linalg.norm(terms.hessian_vector + mu * step - delta, axis=1)
            drift = np.zeros(len(delta))
        else:
            for k, factor in enumerate(self._factors):
                factor.p = np.concatenate([factor.p, factor.q.T @ parts.factor[k].T], axis=1)
            step, solve = self._fast_solve(delta, mu)
            drift = np.linalg.norm(weights - self._anchor, axis=1)
            too_stale = np.any(drift > p.refresh_ratio * np.linalg.norm(step, axis=1))
            if too_stale or self._factors[0].p.shape[1] > p.max_rank:
                self._refresh_factor(self.data.sums(weights, hessian=True))
                step, solve = self._fast_solve(delta, mu)
                drift = np.zeros(len(delta))
                refreshed = True
            need_points = p.bound == "per-point" or p.track_bounds
            terms = (
                self.data.step(weights, self._anchor, step, hessian_vector=False)
                if need_points
                else None
            )
        spectral = math.sqrt(self._spectral_sq)
        step_norms = np.linalg.norm(step, axis=1)
        if terms is not None:
            xv = np.sqrt(terms.xv_squared)
        else:
            xv = np.sqrt(np.maximum(np.einsum("kd,de,ke->k", step, self._gram, step), 0.0))
        bounds = {
            "corollary": lambda g: [
                corollary_bound(g, spectral, step_norms[k], xv[k], drift[k])
                for k in range(len(step))
            ],
            "per-point": lambda g: [
                per_point_bound(g, spectral, terms.point[k]) for k in range(len(step))
            ],
        }
        chosen = _joint(np.asarray(bounds[p.bound](self.gamma)) + solve)
        worst = math.sqrt(len(step)) * worst_case_bound(p.lam, n_before, m)
        beta_before = self.beta
        candidate = self.beta + chosen
        if p.track_bounds:
            gammas = {
                "paper": lipschitz_gamma(p.loss, "paper"),
                "exact": lipschitz_gamma(p.loss, "exact"),
            }
            for name, bound, gamma in (
                ("corollary-1", "corollary", gammas["paper"]),
                ("per-point-paper-gamma", "per-point", gammas["paper"]),
                ("per-point-exact-gamma", "per-point", gammas["exact"]),
            ):
                self.tracked[name] = self.tracked.get(name, beta_before) + _joint(
                    np.asarray(bounds[bound](gamma)) + solve
                )
        retrained = p.noise != "none" and candidate > self.budget
        if retrained:
            # No model over budget is ever returned: retrain on D' with a fresh b instead.
            self._train()
        else:
            self.weights = weights + step
            self.beta = candidate
            self.worst_case += worst
        return self._record(
            kind="remove",
            ids=ids,
            removed=m,
            n_before=n_before,
            beta_before=beta_before,
            step_bound=chosen,
            solve_residual=_joint(solve),
            retrained=retrained,
            refreshed=refreshed or retrained,
            start=start,
        )

    def _fast_solve(self, delta: np.ndarray, mu: float) -> tuple[np.ndarray, np.ndarray]:
        solved = [factor.solve(delta[k], mu) for k, factor in enumerate(self._factors)]
        return np.stack([v for v, _ in solved]), np.asarray([r for _, r in solved])

    def _refresh_factor(self, sums: HeadSums) -> None:
        self._anchor = self.weights.copy()
        self._factors = []
        for k in range(self.data.num_heads):
            eig, q = np.linalg.eigh(sums.hessian[k])
            self._factors.append(_FastFactor(q, eig, np.zeros((self.data.dim, 0))))

    def _refresh_spectral(self) -> None:
        self._spectral_sq = _top_eigenvalue(self._gram)
        self._since_spectral = 0

    # ------------------------------------------------------------------ ledger
    def _record(
        self,
        *,
        kind,
        ids,
        removed,
        n_before,
        beta_before,
        step_bound,
        solve_residual,
        retrained,
        refreshed,
        start,
    ) -> Certificate:
        p = self.params
        self.requests += 1
        certificate = Certificate(
            request=self.requests,
            kind=kind,
            ids=[_jsonable(i) for i in ids],
            removed=removed,
            n_before=n_before,
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
            beta_before=beta_before,
            beta_after=self.beta,
            step_bound=step_bound,
            solve_residual=solve_residual,
            spectral_norm=math.sqrt(self._spectral_sq),
            worst_case=self.worst_case,
            retrained=retrained,
            refreshed=refreshed,
            certified=p.noise == "none" or self.beta <= self.budget,
            seconds=time.perf_counter() - start,
            dp_epsilon=self.dp_epsilon,
            dp_delta=self.dp_delta,
            total_epsilon=self.dp_epsilon + (0.0 if p.noise == "none" else p.epsilon),
            total_delta=self.dp_delta + (p.delta if p.noise == "gaussian" else 0.0),
            tracked=dict(self.tracked),
        )
        if self.ledger is not None:
            append_certificate(self.ledger, certificate)
        if self.progress is not None:
            self.progress(certificate)
        return certificate


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def append_certificate(path: str | Path, certificate: Certificate) -> None:
    """Append one certificate as a JSON line (file 0600) and make it durable (the ledger is
    append-only; a torn last line left by a crash is cut off first, see
    :func:`fedunlearn.durable_io.append_jsonl`)."""
    from fedunlearn.durable_io import append_jsonl

    append_jsonl(path, certificate.to_record())


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The ledger's certificates, in order ([] if absent); a torn last line is skipped with a
    :class:`fedunlearn.durable_io.TornLineWarning`, a damaged earlier one raises
    :class:`fedunlearn.durable_io.LogCorruptionError` naming the file and line."""
    from fedunlearn.durable_io import read_jsonl

    return read_jsonl(path)
