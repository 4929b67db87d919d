"""Federated training of the original model M: FedAvg rounds that retain client updates.

The same round loop trains FedRetrain (the targets left out) during unlearning. The training run
itself (:func:`server.training.original.train_federated`: its run directory, per-round records,
checkpoints and summary) is :mod:`server.training.original`; this module holds what it shares with
every later phase: the round loop, the participants' rounds, the run's initial model, discovery and
the client settings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedunlearn.certified.dp_accounting import dp_fedavg_epsilon
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import FederatedData, run_settings
from fedunlearn.memory import (
    release_free_memory,
)
from fedunlearn.progress import Progress
from fedunlearn.seeding import derive_seed
from fedunlearn.store.retention import RetentionPolicy
from fedunlearn.store.run_directory import RunDirectory
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.local import EvaluationResult, evaluate, resolve_device
from fedunlearn.training.models import BodyHeadNet, build_dataset_model
from fedunlearn.training.stacked import (
    ModelStack,
    build_model_stack,
    evaluate_stack,
    mean_evaluation,
    member_seeds,
    member_state,
)
from server.federation.availability import roster_availability
from server.federation.members import (
    FederationMembers,
    discover_clients,
    round_sampler,
)
from server.federation.queries import collect_replies
from server.federation.reply_screening import ReplyScreen
from server.progress import Log, count
from server.training.round_step import DivergedRound, round_label, train_round  # noqa: F401 - re-exported
from strategies.aggregation import aggregation_strategy
from strategies.retaining import Retaining


@dataclass
class TrainingOutcome:
    """A finished training run and what unlearning needs from it."""

    config: ExperimentConfig
    run: RunDirectory
    data: FederatedData
    members: FederationMembers
    store: UpdateStore | None
    initial_state: dict[str, torch.Tensor]
    final_state: dict[str, torch.Tensor]
    screen: ReplyScreen | None = None

    def new_model(self) -> BodyHeadNet | ModelStack:
        """The run's network (weights to be loaded), or its stack of N in a judge run."""
        splits, config = self.data.splits, self.config
        shape, classes = splits.input_shape, splits.num_classes
        if config.stack_members:
            seeds = list(range(config.stack_members))
            return build_model_stack(config.model, config.dataset, shape, classes, seeds)
        return build_dataset_model(config.model, config.dataset, shape, classes)

    def member(self, index: int) -> TrainingOutcome:
        """Member ``index`` of a ``stack-models`` run as the single run it equals: the config with that
        member's ``model-seed`` (:func:`stack_seeds`) and no stack, its initial and final
        states; the run directory, data, store and members stay the stack's (read-only use)."""
        config = self.config
        seed = stack_seeds(config)[index]
        single = config.replace(stack_models=0, model_seed=seed)
        return dataclasses.replace(
            self,
            config=single,
            initial_state=member_state(self.initial_state, index),
            final_state=member_state(self.final_state, index),
        )


def stack_seeds(config: ExperimentConfig, population: str = "") -> list[int]:
    """The model seeds of a judge run's N members (:func:`member_seeds` of ``training_seed``);
    ``population`` names an independent set (other seeds, the same partitions)."""
    base = config.training_seed if not population else derive_seed(config.training_seed, population)
    return member_seeds(base, config.stack_members)


def initial_model(
    config: ExperimentConfig, splits, seeds: list[int] | None = None
) -> BodyHeadNet | ModelStack:
    """M^0: one network seeded by ``training_seed``, or a judge run's stack whose member i is the
    M^0 of a single run with ``model-seed`` = ``seeds[i]`` (default :func:`stack_seeds`)."""
    shape, classes = splits.input_shape, splits.num_classes
    if not config.stack_members:
        seed = derive_seed(config.training_seed, "initial-model")
        return build_dataset_model(config.model, config.dataset, shape, classes, seed=seed)
    seeds = stack_seeds(config) if seeds is None else seeds
    initial = [derive_seed(seed, "initial-model") for seed in seeds]
    return build_model_stack(config.model, config.dataset, shape, classes, initial)


def evaluate_run_model(model, x: torch.Tensor, y: torch.Tensor, *, device) -> EvaluationResult:
    """:func:`evaluate` of the run's model; for a stack, its members' mean loss and accuracy."""
    if isinstance(model, ModelStack):
        return mean_evaluation(evaluate_stack(model, x, y, device=device))
    return evaluate(model, x, y, device=device)


def discover(
    grid: Grid,
    config: ExperimentConfig,
    data: FederatedData,
    *,
    log: Log = print,
    partial: bool = False,
):
    """:func:`server.federation.members.discover_clients` for ``config``'s run: the nodes get the run's data
    settings, and each must declare the size of the partition the server computes for it;
    ``partial``: an unlearning request goes on with the nodes connected by ``node-wait-seconds``."""
    return discover_clients(
        grid,
        config.num_clients,
        config.node_wait_seconds,
        log=log,
        settings=run_settings(config),
        partition_sizes={p: len(part) for p, part in enumerate(data.partitions)},
        reply_timeout=config.reply_timeout,
        partial=partial,
    )


def dp_epsilon_of(config: ExperimentConfig) -> float:
    """epsilon_DP of the body's DP-FedAvg training (0 without DP): every client takes part in every
    round (sampling rate 1), ``rounds`` Gaussian mechanisms, Opacus's RDP accountant."""
    if config.dp_noise_multiplier <= 0:
        return 0.0
    return dp_fedavg_epsilon(config.dp_noise_multiplier, 1.0, config.rounds, config.dp_delta)


def train_config_record(config: ExperimentConfig) -> dict[str, int | float | str]:
    """The client SGD settings sent with every training (and calibration) message (FedProx's mu
    when the run aggregates with FedProx), and the run's data settings
    (:func:`fedunlearn.data.federated_data.run_settings`)."""
    seeds = {"stack-seeds": stack_seeds(config)} if config.stack_members else {}
    # FedProx's clients train with the proximal term in every training-type message (calibration,
    # exact updates, post-training too), not only in the rounds its strategy configures
    proximal = {"proximal-mu": config.proximal_mu} if config.strategy == "fedprox" else {}
    return {
        **proximal,
        "local-epochs": config.local_epochs,
        "lr": config.lr,
        "batch-size": config.batch_size,
        "momentum": config.momentum,
        "weight-decay": config.weight_decay,
        "model-seed": config.training_seed,
        **seeds,
        **run_settings(config),
    }


def fedavg_rounds(
    grid: Grid,
    strategy: Strategy,
    model: BodyHeadNet,
    config: ExperimentConfig,
    *,
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
    on_round: Callable[[int, EvaluationResult | None, MetricRecord, int, float], None]
    | None = None,
    rounds: int | None = None,
    extra_config: Mapping[str, int | float | str] | None = None,
    first_round: int = 1,
    screen: ReplyScreen | None = None,
    phase: str = "train",
    log: Log | None = None,
) -> dict[str, torch.Tensor]:
    """Run rounds ``first_round`` .. ``rounds`` (default ``config.rounds``) of FedAvg from ``model``'s
    weights; returns the final state (``model``'s own when no round is left).

    ``test`` (inputs, labels) turns on a server-side evaluation after each round, reported to
    ``on_round(round, evaluation, train_metrics, clients_replied, round_seconds)``; the metrics
    carry ``refused`` (replies refused by ``screen``) and ``check-seconds`` (the time the checks
    took). ``extra_config`` is added to every training message's config (e.g. a scrubbing
    baseline's ``objective`` and ``forget``). ``screen`` checks every reply before it is aggregated
    or retained (:mod:`server.federation.reply_screening`); ``phase`` names the rounds in its log. Every
    round waits ``reply-timeout`` seconds at most for its replies, with a heartbeat line to ``log``
    while it waits (:mod:`server.federation.queries`), and a progress line with its ETA
    (:mod:`fedunlearn.progress`: the task ``training`` for ``phase`` = ``train``, else the phase).
    """
    device = resolve_device(config.device)
    arrays = ArrayRecord(model.state_dict())
    train_config = {**train_config_record(config), **dict(extra_config or {})}
    last_round = config.rounds if rounds is None else rounds
    task = "training" if phase == "train" else phase
    progress = Progress(task, last_round, log=log, initial=min(first_round - 1, last_round))
    if first_round <= last_round:
        progress.start()
    for server_round in range(first_round, last_round + 1):
        started = time.perf_counter()
        refused_before = screen.refused if screen is not None else 0
        checks_before = screen.seconds if screen is not None else 0.0
        arrays, train_metrics, replied = train_round(
            grid, strategy, config, server_round, arrays, train_config, screen, phase, log
        )
        evaluate_messages = strategy.configure_evaluate(
            server_round, arrays, ConfigRecord(run_settings(config)), grid
        )
        if screen is not None:
            evaluate_messages = screen.active(evaluate_messages)
        evaluations = collect_replies(
            grid,
            evaluate_messages,
            timeout=config.reply_timeout,
            label=f"{round_label(phase, server_round)} evaluation",
            log=log,
        )
        if screen is not None:
            evaluations = screen.evaluation(server_round, evaluations)
        client_eval = strategy.aggregate_evaluate(server_round, evaluations)
        model.load_state_dict(arrays.to_torch_state_dict())
        result = evaluate_run_model(model, *test, device=device) if test is not None else None
        release_free_memory()  # the round's replies are freed: RSS must not keep them
        if on_round is not None:
            metrics = train_metrics or MetricRecord()
            if client_eval is not None:
                metrics["client-eval-accuracy"] = float(
                    client_eval.get("eval-accuracy", float("nan"))
                )
            if screen is not None:
                metrics["refused"] = screen.refused - refused_before
                metrics["check-seconds"] = screen.seconds - checks_before
            on_round(server_round, result, metrics, replied, time.perf_counter() - started)
        progress.advance()
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def participant_strategy(
    config: ExperimentConfig,
    nodes: list[int],
    store: UpdateStore | None = None,
    policies: Iterable[RetentionPolicy] = (),
    sampler=None,
    *,
    members: FederationMembers | None = None,
    phase: str = "retrain",
    log: Log = print,
) -> Retaining:
    """The run's aggregation (``strategy``) over the nodes ``nodes`` only: each round samples,
    configures and messages exactly them (FedRetrain without the forgotten clients, a baseline's
    rounds), or the round's sample of them (``sampler``,
    :func:`server.federation.members.round_sampler`); with ``store`` it retains what
    ``policies`` select. With ``members`` a round trains those of them connected, once
    ``min-reply-fraction`` of them are (:mod:`server.federation.availability`)."""
    available = None
    if members is not None:
        available = roster_availability(config, members, nodes, phase=phase, log=log)
    return Retaining(
        aggregation_strategy(config),
        store,
        policies=policies,
        participants=nodes,
        sampler=sampler,
        available=available,
    )


def participant_rounds(
    grid: Grid,
    outcome: TrainingOutcome,
    start: Mapping[str, torch.Tensor],
    partitions: list[int],
    *,
    name: str,
    log: Log = print,
    rounds: int | None = None,
    extra_config: Mapping[str, int | float | str] | None = None,
) -> dict[str, torch.Tensor]:
    """FedAvg rounds (default ``rounds`` of the run) from the weights ``start`` with only the clients
    ``partitions`` taking part, nothing retained; progress logged under ``name``. Training messages
    carry ``extra_config`` (e.g. the cohort to leave out, or a baseline's objective)."""
    config = outcome.config
    nodes = outcome.members.nodes(exclude=set(outcome.members.node_of_partition) - set(partitions))
    model = outcome.new_model()
    model.load_state_dict(dict(start))
    total = config.rounds if rounds is None else rounds

    def progress(server_round, _result, _metrics, replied, round_seconds):
        log(
            f"{name}: round {server_round}/{total}, {count(replied, 'client')}, {round_seconds:.1f}s"
        )

    return fedavg_rounds(
        grid,
        participant_strategy(
            config,
            nodes,
            sampler=round_sampler(outcome.members, config, name),
            members=outcome.members,
            phase=name,
            log=log,
        ),
        model,
        config,
        on_round=progress,
        rounds=total,
        extra_config=extra_config,
        screen=outcome.screen,
        phase=name,
        log=log,
    )
