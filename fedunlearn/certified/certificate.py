"""The certificate of a certified removal (Guo et al., *Certified Data Removal from Machine
Learning Models*, ICML 2020): the engine's settings (:class:`CertifiedRemovalParams`), the bounds a
request certifies (Theorem 1/4's worst case, Corollary 1 and the per-point bound, the budget of
Theorem 3 for b's density), the :class:`Certificate` of one request and the ledger that records
them (``certified_removal.jsonl``, one digested line each). The engine that issues them is
:class:`fedunlearn.certified.removal.CertifiedHead`.

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
* ``"cached"`` (fast mode): ``gamma ||X'||_2 max_i (|a_i| + |b_i|/2) ||X'v||`` with each factor an
  upper bound from statistics cached across requests -- the downdated ``K'``, the last
  ``lambda_max``, a rank-k sketch of the rows -- never reading X per request (O(d^2 + nk));
  :mod:`fedunlearn.certified.cached_bound`.

Both assume ``l'' = sigma(1 - sigma)``, i.e. logistic targets in {-1, +1}, and ``||x|| <= 1``: the
data classes refuse anything else (:func:`fedunlearn.certified.losses.check_targets`).

Ledger. Each certificate records its UTC time and ``weights_sha256``, the SHA-256 of the certified
(K, d) weights as float64, little-endian, C order (:func:`weights_sha256`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.certified.losses import LOGISTIC_GAMMA
from fedunlearn.config import ConfigGroup, Interval, validate_group, validate_parameter_constraints
from fedunlearn.errors import ConfigError, FedUnlearnError
from fedunlearn.store.json_lines import append_jsonl, read_jsonl

MODES = ("exact", "fast")
BOUNDS = ("per-point", "corollary", "cached")
GAMMAS = tuple(LOGISTIC_GAMMA)
#: Settings of the engine alone (the others are the run configuration's certified group).
_ENGINE_CONSTRAINTS = {
    "max_rank": Interval(int, 1),
    "step_threads": Interval(int, 0),
    "spectral_every": Interval(int, 1),
    "sketch_rank": Interval(int, 0),
    "cached_refresh_share": Interval(float, 0),
    "max_newton": Interval(int, 1),
    "tol": Interval(float, 0, 1, closed="neither"),
}


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


def corollary_bound(
    gamma: float, spectral_norm: float, step_norm: float, xv_norm: float, drift_norm: float = 0.0
) -> float:
    """``gamma ||X'||_2 (||w - w0|| + ||v||) ||X'v||`` (Guo et al. Corollary 1 when w0 = w)."""
    return gamma * spectral_norm * (drift_norm + step_norm) * xv_norm


def per_point_bound(gamma: float, spectral_norm: float, point_sum: float) -> float:
    """``gamma ||X'||_2 sqrt(sum_i (|a_i| + |b_i|/2)^2 b_i^2)`` (module docstring)."""
    return gamma * spectral_norm * math.sqrt(max(point_sum, 0.0))


def worst_case_bound(lam: float, n_before: int, m: int, *, gamma: float, c: float = 1.0) -> float:
    """Data-independent bound of one request removing m of n samples: ``4 gamma m^2 C^2 /
    (lambda^2 (n - m))`` (Theorem 4; Theorem 1 for m = 1), with ``gamma`` the Lipschitz constant
    of l'' in use and ``C`` the bound on ``||grad l||`` (1 for the logistic loss, ``||x|| <= 1``)."""
    return 4.0 * gamma * m * m * c * c / (lam * lam * (n_before - m))


def weights_sha256(weights: np.ndarray) -> str:
    """SHA-256 (hex) of the weights' canonical bytes: float64, little-endian, C order, shape (K, d).

    From a saved head (``server/certified/head.py``'s file):
    ``weights_sha256(safetensors.numpy.load_file(path)["certified_head.weights"])``.
    """
    canonical = np.ascontiguousarray(np.asarray(weights, dtype="<f8"))
    return hashlib.sha256(canonical.tobytes()).hexdigest()


def utc_timestamp() -> str:
    """Now, in UTC, ISO 8601 with a ``Z`` (microseconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class CertifiedRemovalParams:
    """Settings of a certified head. ``sigma`` is b's standard deviation (Gaussian) or its norm's
    Gamma scale epsilon'/epsilon; ``lam`` the lambda of ``(lambda n / 2) ||w||^2``.

    ``refresh_ratio`` (fast mode): how stale the cached Hessian may get. With a data that measures
    the stale vector (central), refresh when the stale parts of the bounds since the anchor exceed
    ``ratio`` times the rest of those bounds; on MNIST 3 vs 8 the default 5 refreshes nothing in
    100 removals and ends with beta 1.5x exact mode's. Otherwise (a federation), refresh when
    ``||w - w0|| > ratio ||v||``: on MNIST 3 vs 8 (100 removals) ratio 2 refreshed 35 times and
    ended with beta 1.3x exact mode's, ratio 5 refreshed 18 times at 1.6x, ratio 20 four times at
    2.9x. ``max_rank``: the most removed samples the Woodbury downdate holds before a refresh.
    ``step_threads`` (fast mode on central data): BLAS threads for a request's memory-bound
    products (one read of X, a few with Q; refreshes keep the BLAS default); 0 keeps the default.
    One thread: on 2 shared cores a second BLAS thread that waits for a core costs ten times what
    it saves.
    ``single_precision_hessian`` (exact mode): form the per-request Hessian in float32 (twice as
    fast); the solve's residual is measured in float64 and added to beta, so the certificate holds.
    Least squares always uses float64 (its step is exact).
    ``sketch_rank`` (``bound="cached"``): the rank k of the rows' sketch that bounds
    ``max_i |x_i^T u|`` in O(nk) (:mod:`fedunlearn.certified.cached_bound`); 0, or a data without
    a sketch (a federation), uses ``||x_i|| <= 1`` instead. ``cached_refresh_share``
    (``bound="cached"``, instead of ``refresh_ratio``): refresh the cached Hessian when the drift
    parts of the bounds since its anchor exceed this share of the budget. A refresh (O(n d^2 +
    d^3)) resets the drift, whose parts grow with every removal; on MNIST 3 vs 8 the default
    refreshes nothing in 100 removals (beta 1.5 of the budget 2.28).
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
    max_rank: int = 128
    step_threads: int = 1
    spectral_every: int = 100
    sketch_rank: int = 64
    cached_refresh_share: float = 0.75
    tol: float = 1e-10
    max_newton: int = 100
    track_bounds: bool = False
    single_precision_hessian: bool = True

    @classmethod
    def from_group(cls, certified: Mapping[str, Any]) -> CertifiedRemovalParams:
        """The settings a run configuration's certified group holds (``config.certified``); the
        engine's own (``max_rank``, ``tol``, ...) keep their defaults."""
        names = {item.name for item in fields(cls)}
        return cls(**{name: value for name, value in certified.items() if name in names})

    def validate(self) -> None:
        """The run configuration's certified-group constraints and rules on the settings shared with
        it (:func:`fedunlearn.config.validate_group`, errors name these parameters), then the
        engine's own."""
        values = asdict(self)
        validate_group(ConfigGroup("certified", values))
        validate_parameter_constraints(values, _ENGINE_CONSTRAINTS)
        if self.bound == "cached" and self.mode != "fast":
            raise ConfigError("bound", self.bound, "per-point or corollary in exact mode")

    @property
    def budget(self) -> float:
        return removal_budget(self.noise, self.sigma, self.epsilon, self.delta)

    @property
    def worst_case_applies(self) -> bool:
        """Theorems 1/4 hold for the logistic loss with the Hessian at the current w (exact mode);
        least squares needs no bound (its step is exact) and the fast mode's Hessian is stale."""
        return self.loss == "logistic" and self.mode == "exact"


@dataclass
class Certificate:
    """What one training or removal request certifies; one line of the ledger.

    ``timestamp``: when it was issued (UTC, ISO 8601, ``Z``); ``weights_sha256``: the certified
    weights (:func:`weights_sha256`) of shape ``weights_shape``; ``worst_case``: the accumulated
    data-independent bound of Theorems 1/4 since the last training, ``None`` where they do not
    apply (:attr:`CertifiedRemovalParams.worst_case_applies`).
    """

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
    worst_case: float | None
    retrained: bool
    refreshed: bool
    certified: bool
    seconds: float
    timestamp: str
    weights_sha256: str
    weights_shape: list[int]
    dp_epsilon: float = 0.0
    dp_delta: float = 0.0
    total_epsilon: float = 0.0
    total_delta: float = 0.0
    tracked: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


class ProgressCallbackError(FedUnlearnError, RuntimeError):
    """The ``progress`` callback raised after a request was committed (certificate in the ledger).

    ``certificate`` is the committed request's certificate: the request is done; do not retry it.
    """

    def __init__(self, certificate: Certificate) -> None:
        self.certificate = certificate
        super().__init__(
            f"request {certificate.request} ({certificate.kind}) was committed and its certificate "
            "recorded, but the progress callback failed (see the cause); do not retry the request"
        )


def jsonable(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list, np.ndarray)):
        return [jsonable(v) for v in value]
    return value


def append_certificate(path: str | Path, certificate: Certificate) -> None:
    """Append one certificate as a JSON line (file 0600) and make it durable (the ledger is
    append-only; a torn last line left by a crash is cut off first, see
    :func:`fedunlearn.store.durable_io.append_jsonl`)."""
    append_jsonl(path, certificate.to_record())


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The ledger's certificates, in order ([] if absent); a torn last line is skipped with a
    :class:`fedunlearn.store.durable_io.TornLineWarning`, a damaged earlier one raises
    :class:`fedunlearn.store.durable_io.LogCorruptionError` naming the file and line."""
    return read_jsonl(path)
