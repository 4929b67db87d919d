"""SIFU's certificate (Fraboni et al., AISTATS 2024): the sensitivity bound Psi(n, I) never falls
below the true distance between FedAvg with and without the clients I, at any round.

The ground truth is computed by simulating FedAvg in pure torch (float64) twice with the same
randomness: the same initial model, the same batch orders, the same participants minus I. The
problems have smoothness constants known exactly (least squares, logistic and softmax regression
with ``L`` from the data, a concave-convex quadratic), and the adversarial cases (an outlier
client, a one-sample client, tiny and large learning rates, momentum, partial participation,
rounds where only removed clients train) try to break the bound.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.unlearning.gaussian_mechanism import (
    add_noise,
    entropy_generator,
    noise_sigma,
    unlearning_budget,
)
from fedunlearn.unlearning.sensitivity import SensitivityAccumulator, local_lipschitz
from fedunlearn.unlearning.sifu import SifuCertificate, rollback_round

D = torch.float64
Gradient = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------ problems with a known L
@dataclass
class Problem:
    """Clients' data, the gradient of a mini-batch mean loss, and its smoothness L (exact or an
    upper bound valid for every batch); ``convexity``: a lower bound mu on every batch Hessian."""

    xs: dict[int, torch.Tensor]
    ys: dict[int, torch.Tensor]
    gradient: Gradient
    smoothness: float
    dim: int
    convexity: float | None = None

    def sizes(self) -> dict[int, int]:
        return {k: len(x) for k, x in self.xs.items()}


def _least_squares(theta, x, y):
    return x.T @ (x @ theta - y) / len(x)


def _logistic(theta, x, y):  # y in {-1, +1}
    return -x.T @ (y * torch.sigmoid(-y * (x @ theta))) / len(x)


def _softmax(classes: int) -> Gradient:
    def gradient(theta, x, y):
        weights = theta.reshape(x.shape[1], classes)
        probabilities = torch.softmax(x @ weights, dim=1)
        target = torch.nn.functional.one_hot(y, classes).to(D)
        return (x.T @ (probabilities - target) / len(x)).reshape(-1)

    return gradient


def _concave_convex(curvature: float) -> Gradient:
    """Least squares minus (a/2)||theta||^2: Hessian X^T X / m - a I, indefinite (non-convex)."""
    return lambda theta, x, y: _least_squares(theta, x, y) - curvature * theta


def _hessian_extremes(xs) -> tuple[float, float]:
    eigen = [torch.linalg.eigvalsh(x.T @ x / len(x)) for x in xs.values()]
    return max(float(e[-1]) for e in eigen), min(float(e[0]) for e in eigen)


def least_squares(sizes, dim=4, seed=0, scale=None, full_batch=True) -> Problem:
    """Full batch: L and mu are the exact extremes of the clients' Hessians; mini-batch: the
    per-sample bound L = max ||x_i||^2 (a batch Hessian is a mean of x_i x_i^T)."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = {}, {}
    for k, m in enumerate(sizes):
        factor = (scale or {}).get(k, (1.0, 1.0))
        xs[k] = torch.randn(m, dim, generator=g, dtype=D) * factor[0] + 0.3 * k
        ys[k] = (xs[k] @ torch.randn(dim, generator=g, dtype=D) + k) * factor[1]
    top, bottom = _hessian_extremes(xs)
    if not full_batch:
        top, bottom = max(float((x * x).sum(1).max()) for x in xs.values()), 0.0
    return Problem(xs, ys, _least_squares, top, dim, max(bottom, 0.0))


def logistic(sizes, dim=3, seed=1) -> Problem:
    g = torch.Generator().manual_seed(seed)
    xs = {k: torch.randn(m, dim, generator=g, dtype=D) + 0.5 * k for k, m in enumerate(sizes)}
    ys = {k: torch.where(x[:, 0] + 0.3 * x[:, 1] > 0.4 * k, 1.0, -1.0) for k, x in xs.items()}
    top = max(float((x * x).sum(1).max()) for x in xs.values()) / 4  # l'' <= 1/4
    return Problem(xs, ys, _logistic, top, dim)


def softmax(sizes, dim=3, classes=3, seed=2) -> Problem:
    g = torch.Generator().manual_seed(seed)
    xs = {k: torch.randn(m, dim, generator=g, dtype=D) * (1 + k) for k, m in enumerate(sizes)}
    ys = {k: torch.randint(0, classes, (m,), generator=g) for k, m in enumerate(sizes)}
    top = max(float((x * x).sum(1).max()) for x in xs.values()) / 2  # diag(p) - pp^T <= 1/2
    return Problem(xs, ys, _softmax(classes), top, dim * classes)


def concave_convex(sizes, curvature=0.8, seed=3) -> Problem:
    base = least_squares(sizes, seed=seed)
    top, bottom = _hessian_extremes(base.xs)
    exact = max(abs(top - curvature), abs(bottom - curvature))
    return Problem(base.xs, base.ys, _concave_convex(curvature), exact, base.dim)


# ------------------------------------------------------------------ FedAvg with the same randomness
@dataclass
class Training:
    lr: float
    epochs: int = 1
    batch_size: int = 10**9  # full batch
    momentum: float = 0.0
    weight_decay: float = 0.0
    rounds: int = 6
    participation: Callable[[int], list[int]] | None = None
    seed: int = 7

    def accumulator(self, problem: Problem, **extra) -> SensitivityAccumulator:
        return SensitivityAccumulator(
            learning_rate=self.lr,
            smoothness=problem.smoothness,
            local_epochs=self.epochs,
            batch_size=self.batch_size,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            **extra,
        )


def local_sgd(problem: Problem, training: Training, theta, client: int, round: int):
    """PyTorch's SGD (momentum buffer, weight decay) over a batch order fixed by (round, client)."""
    x, y = problem.xs[client], problem.ys[client]
    generator = torch.Generator().manual_seed(training.seed * 10**6 + round * 1000 + client)
    buffer = None
    for _ in range(training.epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), training.batch_size):
            batch = order[start : start + training.batch_size]
            g = problem.gradient(theta, x[batch], y[batch]) + training.weight_decay * theta
            buffer = g if buffer is None else training.momentum * buffer + g
            theta = theta - training.lr * buffer
    return theta


@dataclass
class Run:
    models: dict[int, torch.Tensor] = field(default_factory=dict)  # theta^n, n = 1 .. R + 1
    observations: list = field(default_factory=list)


def fedavg(problem, training, theta, excluded=frozenset(), first=1, last=None, key="w") -> Run:
    """FedAvg from theta^first; rounds whose participants are all excluded leave theta as is."""
    last = training.rounds if last is None else last
    everyone = sorted(problem.xs)
    run = Run(models={first: theta})
    for n in range(first, last + 1):
        chosen = training.participation(n) if training.participation else everyone
        kept = [k for k in chosen if k not in excluded]
        updates = {k: local_sgd(problem, training, theta, k, n) - theta for k in kept}
        counts = {k: len(problem.xs[k]) for k in kept}
        run.observations.append(
            (n, {key: theta}, {k: {key: u} for k, u in updates.items()}, counts)
        )
        if kept:  # a round without participants leaves the model as it is
            total = sum(counts.values())
            theta = theta + sum(counts[k] / total * updates[k] for k in kept)
        run.models[n + 1] = theta
    return run


def initial(problem: Problem, seed=11) -> torch.Tensor:
    return torch.randn(problem.dim, generator=torch.Generator().manual_seed(seed), dtype=D)


def observed(problem, training, **extra) -> tuple[SensitivityAccumulator, Run]:
    run = fedavg(problem, training, initial(problem))
    accumulator = training.accumulator(problem, **extra)
    for observation in run.observations:
        accumulator.observe(*observation)
    return accumulator, run


def worst_ratio(problem, training, removals, **extra) -> float:
    """The largest true distance / Psi(n, I) over every round and removal set (<= 1: sound)."""
    accumulator, run = observed(problem, training, **extra)
    worst = 0.0
    for removed in removals:
        reference = fedavg(problem, training, initial(problem), excluded=set(removed))
        for n, theta in run.models.items():
            distance = float(torch.linalg.norm(theta - reference.models[n]))
            bound = accumulator.bound(removed, n)
            assert distance <= bound * (1 + 1e-9) + 1e-12, (removed, n, distance, bound)
            if bound > 0:
                worst = max(worst, distance / bound)
    return worst


SINGLE_AND_PAIRS = [(0,), (1,), (3,), (0, 1), (1, 3), (0, 2, 3)]


def _schedule(n: int) -> list[int]:
    """Partial participation: client 0 absent some rounds, alone in round 3 (its removal leaves
    the reference without any participant then)."""
    return {1: [0, 1, 2, 3], 2: [1, 2], 3: [0], 4: [0, 3], 5: [1, 2, 3], 6: [0, 2]}[n]


# ------------------------------------------------------------------ THE key test
def test_the_bound_is_never_below_the_true_sensitivity_on_ridge_regression_with_exact_l():
    problem = least_squares([12, 20, 8, 15])
    training = Training(lr=1 / problem.smoothness, epochs=3, weight_decay=0.1)
    worst = worst_ratio(problem, training, SINGLE_AND_PAIRS)
    assert 0 < worst <= 1 + 1e-9


@pytest.mark.parametrize(
    ("name", "problem", "training"),
    [
        (
            "outlier client (features x30, targets x1000)",
            least_squares([10, 14, 9, 11], scale={2: (30.0, 1000.0)}),
            dict(epochs=2, lr_times_l=1.0),
        ),
        ("one-sample client", least_squares([1, 30, 12, 9]), dict(epochs=2, lr_times_l=1.0)),
        ("tiny learning rate", least_squares([12, 20, 8, 15]), dict(epochs=4, lr_times_l=1e-4)),
        (
            "large learning rate (eta L = 1.9, the convex range's edge)",
            least_squares([12, 20, 8, 15]),
            dict(epochs=2, lr_times_l=1.9),
        ),
    ],
)
def test_adversarial_data_sets_and_learning_rates_do_not_break_the_bound(name, problem, training):
    lr = training.pop("lr_times_l") / problem.smoothness
    worst = worst_ratio(problem, Training(lr=lr, **training), SINGLE_AND_PAIRS)
    assert worst <= 1 + 1e-9  # float64 rounding of the simulated distance


def test_a_client_identical_to_the_others_has_zero_sensitivity():
    problem = least_squares([10, 10, 10, 10])
    for k in problem.xs:
        problem.xs[k], problem.ys[k] = problem.xs[0], problem.ys[0]
    training = Training(lr=0.5 / problem.smoothness, epochs=2)
    worst_ratio(problem, training, SINGLE_AND_PAIRS)  # the distances are rounding too
    accumulator, _ = observed(problem, training)
    assert max(accumulator.bound(k, 7) for k in range(4)) < 1e-12


def test_the_strongly_convex_bound_holds_and_is_tighter_than_the_non_convex_one():
    problem = least_squares([12, 20, 8, 15])
    training = Training(lr=1.5 / problem.smoothness, epochs=3, rounds=8)
    convex = worst_ratio(problem, training, SINGLE_AND_PAIRS, strong_convexity=problem.convexity)
    accumulator, _ = observed(problem, training)
    tight, _ = observed(problem, training, strong_convexity=problem.convexity)
    assert convex <= 1 + 1e-9
    assert tight.bound(1, 9) < accumulator.bound(1, 9) / 10


def test_mini_batch_sgd_with_momentum_weight_decay_and_unequal_clients_logistic():
    problem = logistic([7, 23, 4, 16])
    training = Training(lr=0.5 / problem.smoothness, epochs=2, batch_size=5, momentum=0.9)
    training.weight_decay = 0.01
    assert worst_ratio(problem, training, SINGLE_AND_PAIRS) <= 1 + 1e-9


def test_softmax_regression_mini_batches_and_partial_participation():
    problem = softmax([9, 17, 6, 12])
    training = Training(lr=0.8 / problem.smoothness, epochs=2, batch_size=4, momentum=0.5)
    training.participation = _schedule
    assert worst_ratio(problem, training, SINGLE_AND_PAIRS) <= 1 + 1e-9


def test_non_convex_objective_and_rounds_where_only_removed_clients_train():
    problem = concave_convex([12, 20, 8, 15])
    training = Training(lr=0.7 / problem.smoothness, epochs=2, participation=_schedule)
    assert worst_ratio(problem, training, SINGLE_AND_PAIRS) <= 1 + 1e-9


def test_least_squares_mini_batches_with_the_per_sample_smoothness():
    problem = least_squares([13, 21, 5, 9], full_batch=False)
    training = Training(lr=0.9 / problem.smoothness, epochs=3, batch_size=4, momentum=0.3)
    assert worst_ratio(problem, training, SINGLE_AND_PAIRS) <= 1 + 1e-9


def test_the_bound_is_tight_when_every_step_expands_by_exactly_one_plus_eta_l():
    """1-D concave objective -(a/2) theta^2 - b_k theta: each step is exactly (1 + eta a)-expanding
    and each round's contribution has one sign, so Psi(n, I) is the true distance."""
    curvature = 0.5
    xs = {k: torch.zeros(1, 1, dtype=D) for k in range(3)}
    ys = {k: torch.full((1,), float(k + 1), dtype=D) for k in range(3)}
    problem = Problem(xs, ys, lambda th, x, y: -curvature * th - y, curvature, 1)
    training = Training(lr=0.3, epochs=3, rounds=5)
    accumulator, run = observed(problem, training)
    reference = fedavg(problem, training, initial(problem), excluded={2})
    for n in range(2, 7):
        distance = float(torch.linalg.norm(run.models[n] - reference.models[n]))
        assert accumulator.bound(2, n) == pytest.approx(distance, rel=1e-6)


def test_an_understated_smoothness_is_caught_by_the_same_check():
    """The check has teeth: claiming L = 0 for a non-convex objective makes it fail."""
    problem = concave_convex([12, 20, 8, 15], curvature=2.0)
    training = Training(lr=0.9 / problem.smoothness, epochs=3)
    problem.smoothness = 0.0
    with pytest.raises(AssertionError):
        worst_ratio(problem, training, [(0,), (1,)])


def test_momentum_expansion_is_exact_on_a_concave_quadratic():
    smoothness, lr, momentum = 1.3, 0.2, 0.9
    theta, other = torch.tensor([1.0], dtype=D), torch.tensor([0.0], dtype=D)
    problem = Problem({0: torch.zeros(1, 1, dtype=D)}, {0: torch.zeros(1, dtype=D)},
                      lambda th, x, y: -smoothness * th, smoothness, 1)  # fmt: skip
    training = Training(lr=lr, epochs=6, momentum=momentum)
    ratio = float(
        local_sgd(problem, training, theta, 0, 1) - local_sgd(problem, training, other, 0, 1)
    )
    assert local_lipschitz(lr, smoothness, 6, momentum=momentum) == pytest.approx(ratio, rel=1e-12)
    assert local_lipschitz(lr, smoothness, 6) == pytest.approx((1 + lr * smoothness) ** 6)


# ------------------------------------------------------------------ the authors' factor, as an option
def test_the_non_expansive_option_holds_where_it_is_proven_gradient_descent_on_a_convex_loss():
    """rho = 1 (the authors' code with lambda = 0) is a theorem for plain gradient descent on a
    convex loss with eta <= 2 / L: ridge at the range's edge, logistic, softmax with partial
    participation."""
    cases = [
        (least_squares([12, 20, 8, 15]), Training(lr=1.9, epochs=3)),
        (logistic([7, 23, 4, 16]), Training(lr=1.5, epochs=2)),
        (softmax([9, 17, 6, 12]), Training(lr=1.0, epochs=2, participation=_schedule)),
    ]
    for problem, training in cases:
        training.lr /= problem.smoothness
        worst = worst_ratio(problem, training, SINGLE_AND_PAIRS, expansion="non-expansive")
        assert 0 < worst <= 1 + 1e-9


def test_the_non_expansive_option_is_an_assumption_a_non_convex_loss_breaks_it():
    """Outside convex gradient descent it is an assumption (``regime`` says so): on a
    concave-convex objective the same check fails, while the smoothness bound holds."""
    problem = concave_convex([12, 20, 8, 15], curvature=2.0)
    training = Training(lr=0.5 / problem.smoothness, epochs=3)
    assert worst_ratio(problem, training, [(0,), (1,)]) <= 1 + 1e-9
    with pytest.raises(AssertionError):
        worst_ratio(problem, training, [(0,), (1,)], expansion="non-expansive")
    accumulator, _ = observed(problem, training, expansion="non-expansive")
    assert accumulator.assumptions()["regime"] == "non-expansive (assumed)"


def test_the_non_expansive_factor_is_the_authors_one_minus_eta_lambda_to_the_k():
    """Psi(n + 1) = |1 - eta lambda|^K Psi(n) + ||omega_n|| whatever L (FL/server.py's coef_regu)."""
    problem = least_squares([12, 20, 8, 15])
    training = Training(lr=0.3 / problem.smoothness, epochs=2, weight_decay=0.5, rounds=4)
    accumulator, _ = observed(problem, training, expansion="non-expansive")
    saved = accumulator.to_json()
    contributions = json.loads(json.dumps(saved))  # eta lambda = 1: rho = 0, Psi(n + 1) = omega_n
    contributions["parameters"].update(learning_rate=1.0, weight_decay=1.0, smoothness=1e9)
    omega = [b[0] for b in SensitivityAccumulator.from_json(contributions).bounds(0)]
    rho = (1 - training.lr * training.weight_decay) ** 2  # K = 2 epochs of one full batch
    expected = [0.0]
    for n in range(1, len(omega)):
        expected.append(rho * expected[-1] + omega[n])
    assert [b[0] for b in accumulator.bounds(0)] == pytest.approx(expected, rel=1e-12)
    assert min(omega[1:]) > 0 and 0 < rho < 1
    assert SensitivityAccumulator.from_json(saved).bounds(0) == accumulator.bounds(0)
    del saved["parameters"]["expansion"]  # a state saved before the option: the smoothness bound
    assert SensitivityAccumulator.from_json(saved).parameters["expansion"] == "smoothness"
    with pytest.raises(ConfigError, match="sifu-expansion"):
        observed(problem, training, expansion="convex")


def test_the_run_config_chooses_the_expansion_and_the_certificate_names_it():
    from fedunlearn.config import ExperimentConfig
    from fedunlearn.unlearning.sifu import SensitivityRetention

    config = ExperimentConfig.from_run_config({"sifu-expansion": "non-expansive"})
    accumulator = SensitivityRetention.from_config(config).accumulator
    assert accumulator.parameters["expansion"] == "non-expansive"
    assert accumulator.assumptions()["regime"] == "non-expansive (assumed)"  # the ledger's line
    assert (
        SensitivityRetention.from_config(
            ExperimentConfig.from_run_config({})
        ).accumulator.parameters["expansion"]
        == "smoothness"
    )
    with pytest.raises(ConfigError, match="sifu-expansion"):
        ExperimentConfig.from_run_config({"sifu-expansion": "convex"})


# ------------------------------------------------------------------ sequential requests
def test_a_second_request_after_rollback_noise_and_forget_is_still_bounded():
    """Unlearn client 1 (rollback to T, noise, retrain without it), then client 3: the bound is the
    distance to FedAvg without both, with the same noise at T (one Gaussian mechanism each)."""
    problem = least_squares([12, 20, 8, 15])
    training = Training(lr=0.8 / problem.smoothness, epochs=2, rounds=8)
    accumulator, run = observed(problem, training)
    budget = accumulator.bound(1, 5) * 1.0001
    first = rollback_round(accumulator, 1, budget)
    assert first == 5
    xi = 0.01 * torch.randn(problem.dim, generator=entropy_generator(), dtype=D)
    accumulator.delete_rounds_after(first - 1)
    accumulator.forget(1)
    actual = fedavg(problem, training, run.models[first] + xi, excluded={1}, first=first, last=10)
    for observation in actual.observations:
        accumulator.observe(*observation)
    reference = fedavg(problem, training, initial(problem), excluded={1, 3}, last=first - 1)
    continued = fedavg(
        problem, training, reference.models[first] + xi, excluded={1, 3}, first=first, last=10
    )
    models = {**{n: run.models[n] for n in range(1, first)}, **actual.models}
    references = {**reference.models, **continued.models}
    for n in range(1, 12):
        distance = float(torch.linalg.norm(models[n] - references[n]))
        assert distance <= accumulator.bound(3, n) * (1 + 1e-9) + 1e-12


def test_forget_drops_the_client_but_keeps_combined_bounds_exact():
    problem = least_squares([12, 20, 8, 15])
    accumulator, _ = observed(problem, Training(lr=0.5 / problem.smoothness, epochs=2))
    together = [accumulator.bound({1, 3}, n) for n in range(1, 8)]
    accumulator.forget(1)
    assert 1 not in accumulator.clients() and accumulator.forgotten == 1
    saved = accumulator.to_json()
    assert all(1 not in record["clients"] for record in saved["rounds"])
    after = [accumulator.bound(3, n) for n in range(1, 8)]
    assert after == pytest.approx(together, rel=1e-9)
    assert accumulator.bound(0, 7) >= accumulator.bound({0}, 7) > 0


# ------------------------------------------------------------------ stacks: one bound per member
def test_a_stack_gives_each_member_its_own_bound_and_the_strictest_rollback():
    problem = least_squares([12, 20, 8, 15])
    training = Training(lr=0.6 / problem.smoothness, epochs=2)
    runs = [fedavg(problem, training, initial(problem, seed), key="w") for seed in (11, 12)]
    # Member 1 differs in its initial model; both see the same clients, as a judge stack's do.
    groups = [["members.0.w"], ["members.1.w"]]
    stack = training.accumulator(problem, groups=groups)
    singles = [training.accumulator(problem), training.accumulator(problem)]
    for first, second in zip(runs[0].observations, runs[1].observations):
        n, counts = first[0], first[3]
        state = {"members.0.w": first[1]["w"], "members.1.w": second[1]["w"]}
        updates = {
            k: {"members.0.w": first[2][k]["w"], "members.1.w": second[2][k]["w"]} for k in counts
        }
        stack.observe(n, state, updates, counts)
        singles[0].observe(*first)
        singles[1].observe(*second)
    for n in range(1, 8):
        members = stack.member_bounds((0, 2), n)
        assert members == pytest.approx([s.bound((0, 2), n) for s in singles], rel=1e-12)
    assert stack.member_bounds(2, 7)[0] != pytest.approx(stack.member_bounds(2, 7)[1])
    budget = sorted(stack.member_bounds(2, 5))[0]
    own = [rollback_round(single, 2, budget) for single in singles]
    assert rollback_round(stack, 2, budget) == min(own)
    for member, single in enumerate(singles):  # non-convex bounds only grow in n
        history = [h[member] for h in stack.bounds(2)]
        assert history == sorted(history)
        assert history == pytest.approx([h[0] for h in single.bounds(2)], rel=1e-12)


# ------------------------------------------------------------------ rollback, budget, noise
def test_rollback_picks_the_last_round_within_the_budget():
    problem = least_squares([12, 20, 8, 15])
    accumulator, _ = observed(problem, Training(lr=0.5 / problem.smoothness, epochs=2))
    history = [accumulator.bound(0, n) for n in range(1, 8)]
    assert history[0] == 0 and history == sorted(history)
    for n in range(1, 7):
        between = (history[n - 1] + history[n]) / 2
        assert rollback_round(accumulator, 0, between) == n
        assert rollback_round(accumulator, 0, history[n - 1]) == n  # the budget itself is within
    assert rollback_round(accumulator, 0, 0.0) == 1
    assert rollback_round(accumulator, 0, history[-1] * 2) == 7
    assert rollback_round(accumulator, 0, history[-1] * 2, latest=4) == 4


def test_noise_sigma_is_the_gaussian_mechanism_and_the_budget_its_inverse():
    epsilon, delta, budget = 0.5, 1e-5, 0.3
    c = math.sqrt(2 * math.log(1.25 / delta))
    assert noise_sigma(epsilon, delta, budget) == pytest.approx(budget * c / epsilon, rel=1e-15)
    assert unlearning_budget(epsilon, delta, 0.05) == pytest.approx(epsilon * 0.05 / c)
    # The analytic mechanism: exact delta at its sigma, and less noise than the classical one.
    from scipy.stats import norm

    for epsilon in (0.5, 2.0, 10.0):
        sigma = noise_sigma(epsilon, delta, budget, mechanism="analytic")
        r = budget / sigma
        reached = norm.cdf(r / 2 - epsilon / r) - math.exp(epsilon) * norm.cdf(-r / 2 - epsilon / r)
        assert reached <= delta and reached == pytest.approx(delta, rel=1e-6)
    assert noise_sigma(0.5, delta, budget, mechanism="analytic") < noise_sigma(0.5, delta, budget)


def test_added_noise_has_the_requested_standard_deviation_and_spares_integer_buffers():
    state = {"w": torch.zeros(400_000), "steps": torch.tensor(7)}
    noisy = add_noise(state, 0.05, entropy_generator())
    assert float(noisy["w"].std()) == pytest.approx(0.05, rel=0.01)
    assert abs(float(noisy["w"].mean())) < 0.05 * 5 / math.sqrt(400_000)
    assert int(noisy["steps"]) == 7 and float(state["w"].abs().sum()) == 0


def test_the_noise_comes_from_os_entropy_and_no_seed_reproduces_it():
    state = {"w": torch.zeros(64)}
    first, second = (
        add_noise(state, 1.0, entropy_generator()),
        add_noise(state, 1.0, entropy_generator()),
    )
    assert not torch.equal(first["w"], second["w"])
    run_seed = 0
    for seed in (run_seed, 7, 11):  # the seeds a run config or these tests use
        seeded = add_noise(state, 1.0, torch.Generator().manual_seed(seed))
        assert not torch.equal(first["w"], seeded["w"])
    with pytest.raises(ConfigError, match="generator"):
        add_noise(state, 1.0, secrets.randbits(32))


def test_the_certificate_records_the_rollback_its_bound_and_what_the_cli_shows():
    problem = least_squares([12, 20, 8, 15])
    accumulator, _ = observed(problem, Training(lr=0.5 / problem.smoothness, epochs=2))
    sigma = noise_sigma(0.9, 1e-5, accumulator.bound(2, 4))
    certificate = SifuCertificate.issue(
        accumulator, [2], request=1, n_after=3, epsilon=0.9, delta=1e-5, sigma=sigma
    )
    record = json.loads(json.dumps(certificate.to_record(), allow_nan=False))
    assert record["method"] == "sifu" and record["rollback_round"] == 4 and record["certified"]
    assert record["beta_after"] == accumulator.bound(2, 4) <= record["budget"]
    assert record["assumptions"]["smoothness"] == problem.smoothness
    assert record["total_epsilon"] == 0.9 and record["ids"] == [2] and record["removed"] == 1
    displayed = (
        "request kind removed n_after beta_after budget retrained certified total_epsilon "
        "total_delta seconds loss mode bound lam sigma"
    ).split()  # fedunlearn/cli.py's ledger fields
    assert set(displayed) <= set(record)


# ------------------------------------------------------------------ persistence
def test_json_round_trip_continues_the_accumulation_exactly():
    problem = logistic([7, 23, 4, 16])
    training = Training(lr=0.5 / problem.smoothness, epochs=2, batch_size=5, momentum=0.9)
    accumulator, run = observed(problem, training)
    halfway = training.accumulator(problem)
    for observation in run.observations[:3]:
        halfway.observe(*observation)
    restored = SensitivityAccumulator.from_json(json.loads(json.dumps(halfway.to_json())))
    for observation in run.observations[3:]:
        restored.observe(*observation)
    assert restored.bounds((0, 3)) == accumulator.bounds((0, 3))
    assert restored.to_json() == accumulator.to_json()


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        (dict(learning_rate=-0.1), "sifu-learning-rate"),
        (dict(learning_rate=float("inf")), "sifu-learning-rate"),
        (dict(smoothness=float("nan")), "sifu-smoothness"),
        (dict(momentum=1.0), "sifu-momentum"),
        (dict(weight_decay=-1.0), "sifu-weight-decay"),
        (dict(local_steps=0), "sifu-local-steps"),
        (dict(local_steps=2, local_epochs=1, batch_size=4), "sifu-local-steps"),
        (dict(local_steps=None, local_epochs=1), "sifu-local-steps"),
        (dict(local_steps=2.5), "sifu-local-steps"),
        (dict(strong_convexity=3.0), "sifu-strong-convexity"),
        (dict(strong_convexity=0.1, momentum=0.9), "sifu-strong-convexity"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_run_config_key(kwargs, key):
    arguments = dict(learning_rate=0.1, smoothness=2.0, local_steps=3) | kwargs
    with pytest.raises(ConfigError, match=key):
        SensitivityAccumulator(**arguments)


def test_bad_observations_and_requests_are_refused():
    w = {"w": torch.zeros(2)}
    accumulator = SensitivityAccumulator(learning_rate=0.1, smoothness=1.0, local_steps=1)
    with pytest.raises(ConfigError, match="round"):
        accumulator.observe(2, w, {0: w}, {0: 3})  # rounds start at 1
    with pytest.raises(ConfigError, match="num_examples"):
        accumulator.observe(1, w, {0: w}, {1: 3})
    with pytest.raises(ConfigError, match="num_examples"):
        accumulator.observe(1, w, {0: w}, {0: 0})
    with pytest.raises(ConfigError, match="updates"):
        accumulator.observe(1, w, {0: {"w": torch.tensor([1.0, float("nan")])}}, {0: 3})
    with pytest.raises(ConfigError, match="updates"):
        accumulator.observe(1, w, {0: {"w": torch.zeros(3)}}, {0: 3})
    with pytest.raises(ConfigError, match="groups"):
        SensitivityAccumulator(
            learning_rate=0.1, smoothness=1.0, local_steps=1, groups=[["v"]]
        ).observe(1, w, {0: w}, {0: 3})
    accumulator.observe(1, w, {0: w, 1: w}, {0: 3, 1: 4})
    for bad in (lambda: accumulator.bound(0, 3), lambda: accumulator.bound([], 1)):
        with pytest.raises(ConfigError):
            bad()
    with pytest.raises(ConfigError, match="sifu-budget"):
        rollback_round(accumulator, 0, -1.0)
    with pytest.raises(ConfigError, match="sifu-epsilon"):
        noise_sigma(2.0, 1e-5, 1.0)  # the classical mechanism is proven for epsilon < 1 only
    with pytest.raises(ConfigError, match="sifu-delta"):
        unlearning_budget(0.5, 0.0, 1.0)
    with pytest.raises(ConfigError, match="sifu-sigma"):
        unlearning_budget(0.5, 1e-5, 0.0)
    with pytest.raises(ConfigError, match="sifu-mechanism"):
        noise_sigma(0.5, 1e-5, 1.0, mechanism="laplace")
    saved = accumulator.to_json()
    saved["rounds"][0]["grams"][0][0][0] = float("nan")
    with pytest.raises(ConfigError, match="sifu-state"):
        SensitivityAccumulator.from_json(saved)
    with pytest.raises(ConfigError, match="sifu-state"):
        SensitivityAccumulator.from_json({"format": 1})


def test_a_round_without_replies_carries_the_bounds_over_unchanged():
    problem = least_squares([12, 20, 8, 15])
    training = Training(lr=0.5 / problem.smoothness, epochs=2)
    accumulator, run = observed(problem, training)
    before = accumulator.bounds((0, 1))[-1]
    accumulator.observe(7, {"w": run.models[7]}, {}, {})
    assert accumulator.bounds((0, 1))[-1] == before and accumulator.rounds()[-1] == 7


def test_the_platforms_own_training_loop_on_softmax_regression_stays_within_the_bound():
    """train_epochs (PyTorch SGD, momentum 0.9, weight decay, partial last batch) on nn.Linear with
    cross-entropy: L = max (||x||^2 + 1) / 2 (the bias is a feature of value 1)."""
    from torch import nn

    from fedunlearn.training.local import train_epochs

    problem = softmax([9, 17, 6, 12], dim=4)
    smoothness = max(float((x * x).sum(1).max()) + 1 for x in problem.xs.values()) / 2
    lr, epochs, batch_size = 0.5 / smoothness, 2, 5
    init = nn.Linear(4, 3).double().state_dict()

    def run(excluded) -> list[dict[str, torch.Tensor]]:
        state, models, observations = dict(init), [dict(init)], []
        for n in range(1, 5):
            kept = [k for k in problem.xs if k not in excluded]
            updates = {}
            for k in kept:
                model = nn.Linear(4, 3).double()
                model.load_state_dict(state)
                train_epochs(model, problem.xs[k], problem.ys[k], epochs=epochs, lr=lr,
                             batch_size=batch_size, seed=100 * n + k, momentum=0.9,
                             weight_decay=1e-3)  # fmt: skip
                updates[k] = {key: v - state[key] for key, v in model.state_dict().items()}
            counts = {k: len(problem.xs[k]) for k in kept}
            observations.append((n, state, updates, counts))
            total = sum(counts.values())
            state = {
                key: state[key] + sum(counts[k] / total * updates[k][key] for k in kept)
                for key in state
            }
            models.append(state)
        return models, observations

    models, observations = run(set())
    accumulator = SensitivityAccumulator(
        learning_rate=lr, smoothness=smoothness, local_epochs=epochs, batch_size=batch_size,
        momentum=0.9, weight_decay=1e-3,
    )  # fmt: skip
    for observation in observations:
        accumulator.observe(*observation)
    for removed in [(2,), (1, 3)]:
        reference, _ = run(set(removed))
        for n, (model, other) in enumerate(zip(models, reference), start=1):
            distance = math.sqrt(sum(float((model[k] - other[k]).pow(2).sum()) for k in model))
            assert distance <= accumulator.bound(removed, n) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda g: [[-x for x in row] for row in g], "eigenvalue"),  # negated: not PSD
        (
            lambda g: [
                [x if i <= j else x + 1.0 for j, x in enumerate(row)] for i, row in enumerate(g)
            ],
            "symmetric",
        ),
    ],
)
def test_a_gram_matrix_outside_its_domain_is_refused_by_name(edit, said):
    w = {"w": torch.zeros(3)}
    accumulator = SensitivityAccumulator(learning_rate=0.1, smoothness=1.0, local_steps=1)
    updates = {0: {"w": torch.tensor([1.0, 0.0, 2.0])}, 1: {"w": torch.tensor([0.0, 3.0, 1.0])}}
    accumulator.observe(1, w, updates, {0: 3, 1: 4})
    saved = json.loads(json.dumps(accumulator.to_json()))
    assert SensitivityAccumulator.from_json(saved).to_json() == accumulator.to_json()  # intact
    saved["rounds"][0]["grams"][0] = edit(saved["rounds"][0]["grams"][0])
    with pytest.raises(ConfigError, match=f"sifu-state.*{said}"):
        SensitivityAccumulator.from_json(saved)
    saved = json.loads(json.dumps(accumulator.to_json()))
    saved["rounds"][0]["global_step_sq"][0] = -1.0
    with pytest.raises(ConfigError, match="negative"):
        SensitivityAccumulator.from_json(saved)
