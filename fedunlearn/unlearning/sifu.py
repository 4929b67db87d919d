"""SIFU: certified client unlearning for FedAvg by rollback, Gaussian noise and retraining.

Fraboni, Van Waerebeke, Scaman, Vidal, Kameni, Lorenzi, *Sequential Informed Federated
Unlearning: Efficient and Provable Client Unlearning in Federated Optimization*, AISTATS 2024
(arXiv 2211.11656; code: Accenture/Labs-Federated-Learning, branch SIFU). Names follow the paper:
eta (``learning_rate``), K (local steps), L (``smoothness``), the sensitivity bound Psi(n, I), the
per-round contribution omega(I, theta^n), the expansion factor of local SGD, the budget Psi* and the
noise sigma.

**Training (what is coupled).** Round n of FedAvg sends theta^n to its participants S_n; client k
runs K_k SGD steps of its own batch sequence (map h_k^n) and returns U_k = h_k^n(theta^n) - theta^n;
with p_k = N_k / sum_{S_n} N, theta^{n+1} = theta^n + sum_k p_k U_k (server learning rate 1). The
reference is FedAvg *without* the clients I with the same randomness: the same initial model
theta^1, participants S_n \\ I re-weighted q_k = p_k / (1 - P_I), P_I = sum_{i in I} p_i, the same
batches; a round whose participants are all in I leaves it unchanged.

**The bound (the paper's bounded-sensitivity theorem).** With F_C(theta) the FedAvg step of the
clients C, theta^{n+1} - theta_{-I}^{n+1} = [F_S(theta^n) - F_{S\\I}(theta^n)] +
[F_{S\\I}(theta^n) - F_{S\\I}(theta_{-I}^n)]. The first bracket is the round's contribution

    omega(I, theta^n) = (1 / (1 - P_I)) sum_{i in I} p_i (U_i - Ubar),   Ubar = sum_k p_k U_k,

(Ubar itself when S_n is inside I), computed from the round's updates alone. The second is at most
rho_n ||theta^n - theta_{-I}^n|| with rho_n the largest Lipschitz constant of a participant's local
work (a convex combination of rho-Lipschitz maps is rho-Lipschitz; the identity is 1-Lipschitz).
Hence, for every round n (Psi(1, I) = 0: same initial model),

    ||theta^n - theta_{-I}^n|| <= Psi(n, I),   Psi(n + 1, I) = rho_n Psi(n, I) + ||omega(I, theta^n)||.

The local work's constant (the paper's expansion factor B(f, eta) to the power K) is, for losses
whose every mini-batch mean has an L-Lipschitz gradient, SGD with momentum beta and weight decay
lambda (PyTorch's update: buf = beta buf + g, theta -= eta buf, g = grad + lambda theta), the first
entry of A^K e_1 with A = [[1 + eta L', eta beta], [L', beta]], L' = L + lambda ((1 + eta L')^K
without momentum: the non-convex case, > 1). With ``strong_convexity`` mu (twice differentiable,
every mini-batch Hessian's eigenvalues in [mu, L], no momentum) it is
max(|1 - eta mu'|, |1 - eta L'|)^K, mu' = mu + lambda, at most 1 for eta <= 2 / L'.

``expansion = "non-expansive"`` takes instead rho_n = |1 - eta lambda|^K whatever L, momentum and
K: the factor of the authors' code (``FL/server.py``, ``Server.compute_metric``: ``coef_regu``;
1 in all their experiments, lambda = 0). It *assumes* every client's local work is non-expansive,
which is proven for plain gradient descent on convex losses with eta <= 2 / L (the strongly convex
case above with mu = 0) and for nothing else: not with momentum, not for a network, not when
eta L > 2. The certificate then holds only under that assumption (``assumptions()["regime"]``);
``simulations/benchmarks/sifu_reference.py`` measures how it fares against the true sensitivity.
Everything else stays ours: the round's real aggregation weights p_k (the authors' code uses 1/M
with M the whole federation, though only the sampled clients are averaged) and the combined bound
of the set I (their rollback takes the largest single-client bound of I).

**Budget, rollback, noise.** The Gaussian mechanism (Dwork & Roth 2014, Theorem A.1): if
||theta^T - theta_{-I}^T|| <= Psi* and xi ~ N(0, sigma^2 I) with Psi* = epsilon sigma / c,
c = sqrt(2 ln(1.25 / delta)), epsilon < 1, then theta^T + xi and theta_{-I}^T + xi are
(epsilon, delta)-indistinguishable, and training on without I from there is post-processing. SIFU
rolls back to T = the last round with Psi(T, I) <= Psi* (Psi(1, I) = 0, so T exists), adds xi and
retrains without I from T. For epsilon >= 1 the classical constant is not proven; the analytic
Gaussian mechanism (Balle & Wang, ICML 2018, Theorem 8) is exact for every epsilon > 0
(``mechanism="analytic"``); both, and the noise from the operating system's entropy (never from a
seed), are in :mod:`fedunlearn.unlearning.gaussian_mechanism`.

**Several clients, sequential requests.** Psi(n, I) is the combined sensitivity of the set I, exact
from each round's Gram matrix of the deviations U_i - Ubar. After a request, the server rolls back,
calls :meth:`SensitivityAccumulator.delete_rounds_after` (T - 1) and :meth:`~SensitivityAccumulator.
forget`, which folds the forgotten clients into one anonymous cohort (their summed weighted
deviation; no id, no per-client number kept). Every later bound includes that cohort: it is the
distance to FedAvg without *every* client removed so far, with the same noises added at the same
rounds (the noise at an earlier rollback is common to both and cancels), so each certificate is
one Gaussian mechanism and needs no composition.

**Stacks.** A judge stack's members are independent models (``groups``); each has its own bound,
and the stack's rollback round is the last round where *every* member is within budget. In the
non-convex case rho_n >= 1, so each member's bound is non-decreasing in n (a sum of non-negative
terms that only grow), the rounds within budget form a prefix, and that round is the minimum over
members of their own rollback rounds; in the contracting case it remains a round where all bounds
hold, which is all the certificate needs. Each member is certified as one run of the procedure
(the members are the judge's independent replicates, not one joint release).

Assumptions the certificate rests on: L bounds the smoothness of every mini-batch loss wherever
the two runs go (globally for the linear and logistic models of the tests; for a neural network L
is not known in general, and the certificate holds only under the stated L) or, with
``expansion = "non-expansive"``, the local work is non-expansive; the local optimizer is
(momentum) SGD with the stated eta, beta, lambda and steps, FedAvg with server learning rate 1,
and the rollback rounds are taken as given, as in the paper. The bound's own float64 arithmetic carries a rounding allowance; the rounding of
training itself (both runs, float32) is outside the theorem, as for every certificate here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fedunlearn.certified.certificate import utc_timestamp
from fedunlearn.config import coerce
from fedunlearn.errors import ConfigError
from fedunlearn.store.retention import RetentionPolicy, Selection
from fedunlearn.training.stacked import member_groups
from fedunlearn.unlearning.gaussian_mechanism import unlearning_budget
from fedunlearn.unlearning.sensitivity import SensitivityAccumulator, client_set


# ------------------------------------------------------------------ rollback and certificate
def rollback_round(
    accumulator: SensitivityAccumulator,
    clients: int | Iterable[int],
    budget: float,
    *,
    latest: int | None = None,
) -> int:
    """T: the last round n <= ``latest`` with Psi(n, I) <= Psi* for every group (a stack's
    members), I = ``clients`` together (with the forgotten cohort). ``latest`` defaults to the
    last observed round + 1 (the current model); Psi(1, I) = 0, so T >= 1 always exists."""
    budget = coerce("sifu-budget", budget, float)
    if budget < 0:
        raise ConfigError("sifu-budget", budget, "a number >= 0")
    newest = accumulator.last_round + 1
    latest = newest if latest is None else latest
    if isinstance(latest, bool) or not isinstance(latest, int) or not 1 <= latest <= newest:
        raise ConfigError("latest", latest, f"a round in [1, {newest}]")
    history = accumulator.bounds(clients)[:latest]
    return max(n for n, per_group in enumerate(history, start=1) if max(per_group) <= budget)


@dataclass
class SifuCertificate:
    """What one SIFU request certifies; one ledger line, in the certified head's vocabulary.

    ``ids``: the clients removed; ``n_after``: clients left in the federation; ``beta_after``:
    Psi(T, I) at the rollback round T (largest over a stack's members, each in
    ``member_bounds``); ``budget``: Psi*; ``cohort``: earlier forgotten clients included in the
    bound; ``assumptions``: the constants the bound rests on (L above all); ``retrained``: T = 1
    (the initial model: retraining from scratch). ``weights_sha256`` is left for the server to
    fill with the noised model's digest.
    """

    request: int
    ids: list[int]
    removed: int
    n_after: int
    epsilon: float
    delta: float
    sigma: float
    mechanism: str
    budget: float
    rollback_round: int
    last_round: int
    beta_after: float
    member_bounds: list[float]
    cohort: int
    assumptions: dict[str, Any]
    retrained: bool
    certified: bool
    lam: float
    seconds: float
    timestamp: str
    weights_sha256: str | None = None
    method: str = "sifu"
    kind: str = "remove"
    noise: str = "gaussian"
    noise_source: str = "os-entropy"
    loss: str = "L-smooth"
    mode: str = "rollback"
    bound: str = "sifu-psi"
    total_epsilon: float = field(init=False)
    total_delta: float = field(init=False)

    def __post_init__(self) -> None:
        # One Gaussian mechanism per request (module docstring): nothing to compose.
        self.total_epsilon, self.total_delta = self.epsilon, self.delta

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def issue(
        cls,
        accumulator: SensitivityAccumulator,
        clients: int | Iterable[int],
        *,
        request: int,
        n_after: int,
        epsilon: float,
        delta: float,
        sigma: float,
        mechanism: str = "classical",
        latest: int | None = None,
    ) -> SifuCertificate:
        """Budget Psi* from (epsilon, delta, sigma), T by :func:`rollback_round`, the bounds at
        T: the certificate and the rollback come from one computation, so they cannot disagree."""
        started = time.perf_counter()
        request, n_after = coerce("request", request, int), coerce("n_after", n_after, int)
        removed = sorted(client_set(clients))
        budget = unlearning_budget(epsilon, delta, sigma, mechanism=mechanism)
        rollback = rollback_round(accumulator, removed, budget, latest=latest)
        members = accumulator.member_bounds(removed, rollback)
        return cls(
            request=request,
            ids=removed,
            removed=len(removed),
            n_after=n_after,
            epsilon=float(epsilon),
            delta=float(delta),
            sigma=float(sigma),
            mechanism=mechanism,
            budget=budget,
            rollback_round=rollback,
            last_round=accumulator.last_round,
            beta_after=max(members),
            member_bounds=members,
            cohort=accumulator.forgotten,
            assumptions=accumulator.assumptions(),
            retrained=rollback == 1,
            certified=max(members) <= budget,
            lam=accumulator.parameters["weight_decay"],
            seconds=time.perf_counter() - started,
            timestamp=utc_timestamp(),
        )


class SensitivityRetention(RetentionPolicy):
    """SIFU's retention policy (:mod:`fedunlearn.store.retention`): every round's global model
    θ^n (the rollback candidates) and no update; the accumulator observes every round's updates
    and keeps the bounds Psi(n, i) (its JSON is the policy's state, saved with each round)."""

    name = "sensitivity-bounds"
    keeps_updates = False

    def __init__(self, accumulator: SensitivityAccumulator) -> None:
        self.accumulator = accumulator

    @classmethod
    def from_config(cls, config) -> SensitivityRetention:
        """The bounds Psi(n, i) under the run's client SGD (lr, momentum, weight decay, E_loc
        epochs of ceil(N_k / B) steps) and the assumed smoothness L (``sifu-smoothness``), or
        non-expansive local work (``sifu-expansion``)."""
        return cls(
            SensitivityAccumulator(
                learning_rate=config.lr,
                smoothness=config.sifu_smoothness,
                local_epochs=config.local_epochs,
                batch_size=config.batch_size,
                momentum=config.momentum,
                weight_decay=config.weight_decay,
                expansion=config.sifu_expansion,
            )
        )

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SensitivityRetention:
        return cls(SensitivityAccumulator.from_json(state))

    def select(self, server_round, global_state, updates, num_examples, *, loss=None) -> Selection:
        if self.accumulator.last_round == 0 and self.accumulator.groups is None:
            # a judge run's stack: each member's bound on its own (never one mixed norm)
            self.accumulator.groups = member_groups(global_state)
        self.accumulator.observe(server_round, global_state, updates, num_examples)
        return Selection(True, frozenset())

    def state_dict(self) -> dict[str, Any]:
        return self.accumulator.to_json()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.accumulator = SensitivityAccumulator.from_json(state)

    def forget(self, clients: Iterable[int]) -> None:
        """The clients folded into the anonymous forgotten cohort (:meth:`SensitivityAccumulator.forget`)."""
        self.accumulator.forget(clients)
