"""The scrubbing methods' server side (Golatkar et al., *Eternal Sunshine of the Spotless Net*): each
gathers what its registry entry needs (:data:`fedunlearn.registry.SCRUBBING`) and calls the core's
math (:mod:`fedunlearn.scrubbing.scrubbers`); nothing here computes an equation.

Every method is called as ``method(context, name)`` by :class:`server.method_runner.MethodRunner`
and reads its settings from its registry entry's ``options``:

* :func:`newton` (``newton``, ``newton-forget-only``): eq. 7 on the linear head,
  ``B = H_Dr / n_r + mu I`` (``scrub-damping`` mu), with ``grad L_Dr`` from D_r's sums or, Section
  3.2, ``-grad L_Df`` (valid at a minimum of L_D); H_D - H_Df is the same B, so both variants share
  one eigendecomposition.
* :func:`newton_finite`: eq. 6, time ``scrub-time`` (eta t; 0 = lr times the local SGD steps a
  client took in training).
* :func:`fisher` (``fisher``, ``fisher-sqrt``, ``fisher-reference``): Fisher forgetting of the whole
  network with the diagonal Fisher of D_r (eq. 8), or the authors' released recipe.
* :func:`baseline_rounds` (``finetune``, ``negative-gradient``, ``random-labels``): Section 5.2's
  baselines as federated rounds with the same clients; :func:`hiding`: server only.
* :func:`retrain`: FedRetrain without D_f, the reference (always run; not a registered method).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.serverapp import Grid

from fedunlearn.certified.curvature import assemble_hessian, head_matrix, with_head
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.registry import SCRUBBING
from fedunlearn.scrubbing.baselines import hide_class
from fedunlearn.scrubbing.scrubbers import (
    NewtonScrubber,
    finite_time_scrub,
    fisher_gaussian,
    fisher_sample,
    reference_fisher_gaussian,
)
from fedunlearn.seeding import derive_seed
from fedunlearn.store.run_directory import UNLEARNING_LOG
from fedunlearn.training.model_state import State
from server.method_runner import SharedStatistics
from server.progress import Log, count
from server.training.rounds import TrainingOutcome, participant_rounds


@dataclass
class ScrubContext:
    """What a scrubbing method gets: the trained run, the cohort D_f, which clients hold it
    (``holders``) and which hold retained data (``keepers``), the statistics query
    (:class:`server.scrubbing.phase.ScrubStatistics`) and what methods share: the statistics gathered
    once, the Newton scrubbers and the Fisher diagonals (the readouts reuse them)."""

    grid: Grid
    outcome: TrainingOutcome
    forget: ForgetSet
    stats: Any  # server.scrubbing.phase.ScrubStatistics
    holders: list[int]
    keepers: list[int]
    log: Log
    shared: SharedStatistics
    scrubbers: dict[str, NewtonScrubber] = field(default_factory=dict)
    fishers: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def config(self):
        return self.outcome.config

    @property
    def original(self) -> State:
        """The trained model every scrub starts from."""
        return self.outcome.final_state


def method_lambda(config, name: str) -> float:
    """The run config's lambda of a noisy scrub (``options["lambda"]``: its key), else NaN."""
    key = SCRUBBING[name].options.get("lambda") if name in SCRUBBING else None
    return getattr(config, key.replace("-", "_")) if key else float("nan")


# ---------------------------------------------------------------------- the reference
def retrain(context: ScrubContext):
    """FedRetrain without D_f (from the same initial weights and seed), or the unlearning step's
    FedRetrain model when it forgot exactly this client, as the run's first request."""
    outcome, forget, config = context.outcome, context.forget, context.config
    requests = outcome.run.read_log(UNLEARNING_LOG)
    reusable = f"model_fedretrain{requests[-1].get('suffix', '')}" if len(requests) == 1 else None
    details: dict[str, Any] = {"clients": list(context.keepers), "rounds": config.rounds}
    if (
        reusable is not None
        and forget.kind == "client"
        and config.unlearn_targets == [forget.client]
        and (outcome.run.path / f"{reusable}.safetensors").is_file()
    ):
        # Same initial weights, seeds and clients: the same model, so it is not trained twice.
        return outcome.run.load_model(reusable), {**details, "reused": reusable}
    state = participant_rounds(
        context.grid,
        outcome,
        outcome.initial_state,
        context.keepers,
        name="retrain",
        log=context.log,
        extra_config={"forget": str(forget)},
    )
    return state, details


# ---------------------------------------------------------------------- the head (eqs. 6, 7)
@dataclass
class HeadStatistics:
    """The head's sums over D_r and D_f at the trained model (one query, Hessians included)."""

    weights: np.ndarray  # W, (K, d)
    n_r: int
    n_f: int
    gradient_r: np.ndarray
    gradient_f: np.ndarray
    hessian_r: np.ndarray
    hessian_f: np.ndarray
    damping: np.ndarray  # mu I


def head_statistics(context: ScrubContext) -> HeadStatistics:
    """The head's statistics, asked of every client the first time a method needs them."""

    def collect() -> HeadStatistics:
        partitions = context.outcome.members.partition_ids
        parts = ("retained", "forgotten")
        head = context.stats.ask("head", context.original, parts, partitions, hessian=True)
        w = head_matrix(context.original)
        k, d = w.shape
        return HeadStatistics(
            w,
            head["retained"]["count"],
            head["forgotten"]["count"],
            head["retained"]["gradient"],
            head["forgotten"]["gradient"],
            assemble_hessian(head["retained"]["blocks"], k, d),
            assemble_hessian(head["forgotten"]["blocks"], k, d),
            context.config.scrub_damping * np.eye(k * d),
        )

    fresh = "head-statistics" not in context.shared.values
    head = context.shared.get("head-statistics", collect)
    if fresh:
        k, d = head.weights.shape
        clients = len(context.outcome.members.partition_ids)
        seconds = context.shared.seconds["head-statistics"]
        context.log(
            f"head statistics (K={k}, d={d}) from {count(clients, 'client')}: {seconds:.1f}s"
        )
    return head


def newton(context: ScrubContext, name: str) -> State:
    """Eq. 7 on the head; ``options["gradient"]``: ``retained`` (grad L_Dr) or ``forgotten``
    (Section 3.2's -grad L_Df)."""
    head = head_statistics(context)
    if SCRUBBING[name].options["gradient"] == "retained":
        gradient = head.gradient_r / head.n_r
    else:
        gradient = -head.gradient_f / head.n_r
    shared = next(iter(context.scrubbers.values()), None)
    if shared is None:
        # B = H_Dr / n_r + mu I; Section 3.2's H_D - H_Df, with H_D the cached sum of both parts,
        # is the same matrix: one eigendecomposition serves both variants.
        context.scrubbers[name] = NewtonScrubber(
            head.weights, gradient, head.hessian_r / head.n_r + head.damping
        )
    else:
        context.scrubbers[name] = shared.with_gradient(head.weights, gradient)
    config = context.config
    rng = np.random.default_rng(derive_seed(config.seed, "scrub", name))
    sample = context.scrubbers[name].sample(method_lambda(config, name), config.scrub_sigma_h, rng)
    return with_head(context.original, sample)


def newton_finite(context: ScrubContext, name: str):
    """Eq. 6 from the trained head, for the time training ran (:func:`training_time`)."""
    head = head_statistics(context)
    config = context.config
    n = head.n_r + head.n_f
    time = training_time(context.outcome)
    scrubbed = finite_time_scrub(
        head.weights,
        (head.gradient_r + head.gradient_f) / n,
        (head.hessian_r + head.hessian_f) / n + head.damping,
        head.gradient_r / head.n_r,
        head.hessian_r / head.n_r + head.damping,
        method_lambda(config, name),
        config.scrub_sigma_h,
        time=time,
        rng=np.random.default_rng(derive_seed(config.seed, "scrub", name)),
    )
    return with_head(context.original, scrubbed.weights), {"time": time}


def training_time(outcome: TrainingOutcome) -> float:
    """eta t for eq. 6: ``scrub-time``, or lr times the SGD steps a client took in training."""
    config = outcome.config
    if config.scrub_time > 0:
        return config.scrub_time
    sizes = list(outcome.members.num_examples.values())
    steps = int(np.ceil(np.mean(sizes) / config.batch_size)) * config.local_epochs * config.rounds
    return config.lr * steps


# ---------------------------------------------------------------------- Fisher (eq. 8)
def mean_fisher(context: ScrubContext, state: State) -> dict[str, np.ndarray]:
    """The mean diagonal Fisher of D_r at ``state``, per parameter tensor (asked of the keepers)."""
    samples = {"max-samples": context.config.scrub_fisher_samples}
    totals = context.stats.ask("fisher", state, ("retained",), context.keepers, **samples)
    totals = totals["retained"]
    count = max(totals.pop("count"), 1)
    return {name: value / count for name, value in totals.items()}


def fisher_statistics(context: ScrubContext) -> dict[str, np.ndarray]:
    """The Fisher of D_r at the trained model, asked the first time a method needs it."""
    fresh = "fisher-statistics" not in context.shared.values
    fisher = context.shared.get("fisher-statistics", lambda: mean_fisher(context, context.original))
    if fresh:
        context.fishers["original"] = fisher
        seconds = context.shared.seconds["fisher-statistics"]
        context.log(
            f"diagonal Fisher of D_r from {count(len(context.keepers), 'client')}: {seconds:.1f}s"
        )
    return fisher


def fisher_gaussian_of(
    name: str, state: State, fisher: Mapping[str, np.ndarray], config, forget: ForgetSet
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Mean and base variance of the Fisher scrub ``name`` at ``state``: eq. 8 with
    ``options["power"]``, or the authors' recipe (``options["reference"]``)."""
    weights = {key: state[key].detach().double().numpy() for key in fisher}
    options = SCRUBBING[name].options
    if options.get("reference"):
        forget_class = forget.label if forget.is_class else None
        return reference_fisher_gaussian(weights, fisher, forget_class=forget_class)
    return fisher_gaussian(weights, fisher, power=options["power"], floor=config.scrub_fisher_floor)


def fisher_state(mean, base, lam: float, config, name: str, template: State) -> State:
    """``template`` with its parameters drawn by :func:`fisher_sample` (seeded by method and
    lambda, so the trade-off's draw at the configured lambda is the table's)."""
    rng = np.random.default_rng(derive_seed(config.seed, "scrub", name, lam))
    drawn = fisher_sample(mean, base, lam, config.scrub_sigma_h, rng)
    out = {k: v.detach().clone() for k, v in template.items()}
    for key, value in drawn.items():
        out[key] = torch.as_tensor(value).to(out[key].dtype)
    return out


def fisher(context: ScrubContext, name: str) -> State:
    """Fisher forgetting of the whole network at the run config's lambda."""
    config = context.config
    gaussian = fisher_gaussian_of(
        name, context.original, fisher_statistics(context), config, context.forget
    )
    return fisher_state(*gaussian, method_lambda(config, name), config, name, context.original)


# ---------------------------------------------------------------------- baselines (Section 5.2)
def baseline_rounds(context: ScrubContext, name: str):
    """``scrub-baseline-rounds`` federated rounds from the trained model with
    the client objective its entry declares (``train`` for none: finetune) on the clients holding
    ``options["clients"]`` data."""
    config = context.config
    spec = SCRUBBING[name]
    clients = context.holders if spec.on_forgotten() else context.keepers
    extra = {
        "forget": str(context.forget),
        "objective": spec.objective(),
        "local-epochs": config.scrub_baseline_epochs,
    }
    state = participant_rounds(
        context.grid,
        context.outcome,
        context.original,
        clients,
        name=name,
        log=context.log,
        rounds=config.scrub_baseline_rounds,
        extra_config=extra,
    )
    return state, {"clients": list(clients), "rounds": config.scrub_baseline_rounds}


def hiding(context: ScrubContext, name: str) -> State | None:
    """The forgotten class's head row re-initialised (server only); None for another cohort."""
    forget = context.forget
    if not forget.is_class:
        context.log(f"hiding skipped: it hides a class, and {forget} is not one")
        return None
    model = context.outcome.new_model()
    model.load_state_dict(context.original)
    generator = torch.Generator().manual_seed(derive_seed(context.config.seed, "hiding"))
    hide_class(model, forget.label, generator=generator)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
