"""Federated training of the original model M: FedAvg rounds that retain client updates.

One progress line per round; per-round metrics, the initial and final models and the store go to
the run directory as they are produced, with a checkpoint of the global model after every round, so
an interrupted run keeps everything up to its last round and ``resume = true`` continues it there
(:mod:`server.training.resume`). The same round loop trains FedRetrain (the targets left out) during
unlearning.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pandas as pd
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, Strategy

from fedunlearn.certified.dp_accounting import dp_fedavg_epsilon
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import FederatedData, load_federated_data, run_settings
from fedunlearn.errors import RunStopped
from fedunlearn.memory import (
    current_rss_bytes,
    megabytes,
    peak_rss_bytes,
    release_free_memory,
    take_interval_peak_rss_bytes,
)
from fedunlearn.plots import plot_training_curves
from fedunlearn.registry import run_retention
from fedunlearn.seeding import derive_seed
from fedunlearn.store.retention import RetentionPolicy
from fedunlearn.store.run_directory import RECOVERY_LOG, RunDirectory
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.local import EvaluationResult, evaluate, resolve_device
from fedunlearn.training.models import BodyHeadNet, build_dataset_model, resolve_model_name
from fedunlearn.training.stacked import (
    ModelStack,
    build_model_stack,
    evaluate_stack,
    mean_evaluation,
    member_seeds,
)
from fedunlearn.unlearning.verdicts import training_flag
from server.federation.availability import roster_availability
from server.federation.members import (
    FederationMembers,
    discover_clients,
    round_sampler,
)
from server.federation.queries import collect_replies
from server.federation.reply_screening import ReplyScreen
from server.progress import Log, count
from server.training.resume import (
    check_finished_run,
    check_resumable,
    resume_point,
    training_finished,
)
from server.training.round_step import DivergedRound, round_label, train_round  # noqa: F401 - re-exported
from server.unlearning import journal as request_journal
from server.unlearning.adoption import finish_pending
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
        if config.judge_models:
            seeds = list(range(config.judge_models))
            return build_model_stack(config.model, config.dataset, shape, classes, seeds)
        return build_dataset_model(config.model, config.dataset, shape, classes)


def stack_seeds(config: ExperimentConfig, population: str = "") -> list[int]:
    """The model seeds of a judge run's N members (:func:`member_seeds` of ``training_seed``);
    ``population`` names an independent set (other seeds, the same partitions)."""
    base = config.training_seed if not population else derive_seed(config.training_seed, population)
    return member_seeds(base, config.judge_models)


def initial_model(
    config: ExperimentConfig, splits, seeds: list[int] | None = None
) -> BodyHeadNet | ModelStack:
    """M^0: one network seeded by ``training_seed``, or a judge run's stack whose member i is the
    M^0 of a single run with ``model-seed`` = ``seeds[i]`` (default :func:`stack_seeds`)."""
    shape, classes = splits.input_shape, splits.num_classes
    if not config.judge_models:
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
    seeds = {"stack-seeds": stack_seeds(config)} if config.judge_models else {}
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
    while it waits (:mod:`server.federation.queries`).
    """
    device = resolve_device(config.device)
    arrays = ArrayRecord(model.state_dict())
    train_config = {**train_config_record(config), **dict(extra_config or {})}
    for server_round in range(first_round, (config.rounds if rounds is None else rounds) + 1):
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


def train_federated(grid: Grid, config: ExperimentConfig, *, log: Log = print) -> TrainingOutcome:
    """Train with retaining FedAvg as ``config`` says; returns where the results are.

    Everything that can be checked is checked before the run directory is created: the config, the
    dataset, the partition sizes and the federation's size. With ``resume`` an interrupted run
    continues after its last completed round (:mod:`server.training.resume`), and a finished one is
    reopened as it is.
    """
    started = time.perf_counter()
    data = load_federated_data(config)
    splits = data.splits
    model = initial_model(config, splits)
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    path = config.run_directory()
    resuming = config.resume and (path / "config.json").is_file()
    if resuming:
        check_resumable(config, path)
    members = discover(grid, config, data, log=log)
    run, initial_state = _open_run(config, resuming, initial_state, log)
    store = UpdateStore(run.store_path, dtype=config.store_dtype) if config.retain else None
    screen = ReplyScreen(
        members,
        max_refusals=config.max_refusals,
        log=log,
        run=run,
        max_update_ratio=config.max_update_ratio,
    )
    if resuming and training_finished(path):
        check_finished_run(run, store, log=log)
        run.remove_checkpoint()
        return TrainingOutcome(
            config, run, data, members, store, initial_state, run.load_model("model_final"), screen
        )
    log(_run_description(config, data, members))
    retaining, strategy = _training_strategy(config, store, log, members)
    recorder = _RoundRecorder(config, run, store, model, retaining, started, log)
    first_round = 1
    if resuming:
        last_round, state = resume_point(run, store, initial_state, log=log)
        retaining.resume(last_round)
        model.load_state_dict(state)
        first_round = last_round + 1
        recorder.resumed()
    if not (run.path / "model_initial.safetensors").is_file():
        run.save_model("model_initial", initial_state)
    if run.metrics.empty:
        recorder.initial(splits)
    final_state = fedavg_rounds(
        grid,
        strategy,
        model,
        config,
        test=(splits.test.x, splits.test.y),
        on_round=recorder,
        first_round=first_round,
        screen=screen,
        log=log,
    )
    _finish(run, store, config, members, final_state, recorder.elapsed, resuming, log)
    return TrainingOutcome(config, run, data, members, store, initial_state, final_state, screen)


def _open_run(config: ExperimentConfig, resuming: bool, initial_state, log: Log):
    """The run directory (reopened when resuming, else created) and the initial model M^0 (the
    one saved there when resuming)."""
    path = config.run_directory()
    if resuming:
        run = RunDirectory.open(path)
        run.take_stop_request()  # the Ctrl-C that interrupted it
        finish_pending(run, log=log)  # an interrupted history rewrite, before the store opens
        request_journal.reopen(
            run, config.unlearn_targets, keep_original=config.keep_original, log=log
        )
        if (path / "model_initial.safetensors").is_file():
            initial_state = run.load_model("model_initial")
    else:
        if config.resume:
            log(f"resume: {path} holds no run yet; starting it")
        run = RunDirectory.create(path, config.to_run_config())
    log(f"run directory: {run.path}")
    return run, initial_state


def _run_description(config: ExperimentConfig, data: FederatedData, members) -> str:
    """The line that opens a training: data, federation, rounds and retention."""
    splits = data.splits
    needs = ", ".join(policy.name for policy in run_retention(config)) or "nothing"
    mode = ", norms after t_1" if config.retain_mode == "norms" else ""
    retention = f"{needs} (Δt = {config.retain_interval}{mode}), {config.store_dtype}"
    retention = retention if config.retain else "off"
    sampled = f", {config.fraction_train:g} of them a round" if config.fraction_train < 1 else ""
    return (
        f"{config.dataset}: {sum(map(len, data.partitions))} of {len(splits.train)} training "
        f"samples over {count(config.num_clients, 'client')} "
        f"({config.partitioning}{sampled}), {len(splits.test)} test samples; {config.rounds} rounds x "
        f"{config.local_epochs} local epochs; retention {retention}"
        + (f"; {members.cuda_clients} client(s) on CUDA" if members.cuda_clients else "")
    )


def _training_strategy(
    config: ExperimentConfig, store: UpdateStore | None, log: Log, members: FederationMembers
):
    """(the retaining strategy, the strategy the rounds run): the same, or DP around it. The
    retaining strategy wraps the run's aggregation (``strategy``: FedAvg, FedProx, FedMedian,
    FedTrimmedAvg or Krum, :mod:`strategies.aggregation`) and samples ``fraction-train`` of the
    clients each round (:func:`server.federation.members.round_sampler`)."""
    if store is not None:
        store.set_metadata(
            dataset=config.dataset,
            num_clients=config.num_clients,
            retain_interval=config.retain_interval,
            seed=config.seed,
            model=resolve_model_name(config.model, config.dataset),
        )
    retaining = Retaining(
        aggregation_strategy(config, fraction_evaluate=config.fraction_evaluate),
        store,
        policies=run_retention(config) if store is not None else (),
        sampler=round_sampler(members, config, "train"),
        # DP-FedAvg's accountant assumes every client in every round: wait for all of them
        available=roster_availability(
            config, members, phase="train", log=log, every=config.dp_noise_multiplier > 0
        ),
    )
    if config.dp_noise_multiplier <= 0:
        return retaining, retaining
    # DP-FedAvg (McMahan et al. 2018): each update clipped to dp-clipping-norm, Gaussian noise of
    # std z C / K on the average. The store keeps the clipped, noise-free updates.
    strategy = DifferentialPrivacyServerSideFixedClipping(
        retaining,
        noise_multiplier=config.dp_noise_multiplier,
        clipping_norm=config.dp_clipping_norm,
        num_sampled_clients=config.num_clients,
    )
    log(
        f"differential privacy: noise multiplier {config.dp_noise_multiplier}, clipping norm "
        f"{config.dp_clipping_norm}: (epsilon, delta) = ({dp_epsilon_of(config):.3g}, "
        f"{config.dp_delta:g}) after {config.rounds} rounds (RDP accountant)"
    )
    return retaining, strategy


class _RoundRecorder:
    """What each completed round leaves: a ``metrics.csv`` row, a checkpoint, a console line.

    Called as ``fedavg_rounds``'s ``on_round``; the elapsed time continues a resumed run's.
    """

    def __init__(self, config, run, store, model, retaining, started, log: Log) -> None:
        self.config, self.run, self.store, self.model = config, run, store, model
        self.retaining, self.started, self.log = retaining, started, log
        self.elapsed_before = 0.0

    def resumed(self) -> None:
        """Continue the elapsed time from the last recorded round."""
        if not self.run.metrics.empty:
            self.elapsed_before = float(self.run.metrics["elapsed_seconds"].iloc[-1])

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    def _store_size(self) -> dict[str, float]:
        """The store's size in MB and, exactly, in bytes (a norms round adds a few KB)."""
        size = self.store.total_bytes() if self.store is not None else 0
        return {"store_mb": megabytes(size), "store_bytes": size}

    def initial(self, splits) -> None:
        """Round 0: the initial model's test accuracy and loss."""
        device = resolve_device(self.config.device)
        initial = evaluate_run_model(self.model, splits.test.x, splits.test.y, device=device)
        row = _row(0, initial, MetricRecord(), 0, False, 0.0, self.elapsed())
        self.run.append_metrics({**row, **self._store_size(), "refused": 0, "check_seconds": 0.0})
        self.log(
            f"round 0/{self.config.rounds}  test accuracy {initial.accuracy:.4f}  "
            f"test loss {initial.loss:.4f}"
        )

    def __call__(self, server_round, result, train_metrics, replied, seconds) -> None:
        retained = self.retaining.retained(server_round)
        row = _row(server_round, result, train_metrics, replied, retained, seconds, self.elapsed())
        row.update(self._store_size())
        row["refused"] = int(train_metrics.get("refused", 0))
        row["check_seconds"] = round(float(train_metrics.get("check-seconds", 0.0)), 6)
        if "client-eval-accuracy" in train_metrics:
            row["client_eval_accuracy"] = float(train_metrics["client-eval-accuracy"])
        # Metrics first, checkpoint last: the checkpoint's round is the last completed round.
        self.run.append_metrics(row)
        self.run.save_checkpoint(server_round, self.model.state_dict())
        self.log(
            f"round {server_round}/{self.config.rounds}  test accuracy {result.accuracy:.4f}  "
            f"test loss {result.loss:.4f}  train loss {row['train_loss']:.4f}  "
            f"clients {replied}/{self.config.num_clients}"
            + ("  retained" if retained else "")
            + f"  {seconds:.1f}s"
        )
        if self.run.take_stop_request():
            raise RunStopped(
                f"stopped after round {server_round} (Ctrl-C on fedunlearn-run); the checkpoint "
                f"holds it: continue with resume=true and run-name={self.run.path.name}"
            )


def _finish(run, store, config, members, final_state, elapsed, resuming: bool, log: Log):
    """The final model, the training curves and ``summary.json`` (``elapsed()``: the run's seconds
    so far); the checkpoint goes."""
    run.save_model("model_final", final_state)
    metrics = run.metrics
    plot_training_curves(
        metrics, run.path / "training.png", title=f"{config.dataset}, {config.num_clients} clients"
    )
    retained_rounds = store.rounds() if store is not None else []
    seconds = elapsed()
    summary = {
        "final_test_accuracy": float(metrics["test_accuracy"].iloc[-1]),
        "final_test_loss": float(metrics["test_loss"].iloc[-1]),
        "retained_rounds": retained_rounds,
        "store_bytes": store.total_bytes() if store is not None else 0,
        "seconds": seconds,
        "partition_sizes": {str(k): v for k, v in sorted(members.num_examples.items())},
        "dp_epsilon": dp_epsilon_of(config),
        "dp_delta": config.dp_delta if config.dp_noise_multiplier > 0 else 0.0,
        "server_peak_rss_mb": megabytes(peak_rss_bytes()),
        "refused_replies": int(metrics.get("refused", pd.Series(dtype=int)).sum()),
        "dropped_clients": {str(k): v for k, v in sorted(members.dropped.items())},
        "training_flag": training_flag(metrics["test_accuracy"]),
    }
    if resuming:
        summary["resumed"] = len(run.read_log(RECOVERY_LOG))
    run.write_json("summary.json", summary)
    run.remove_checkpoint()
    log(
        f"trained in {seconds:.1f}s: final test accuracy {summary['final_test_accuracy']:.4f}; "
        f"{len(retained_rounds)} retained round(s), {summary['store_bytes'] / 1e6:.2f} MB; "
        f"results in {run.path}"
    )
    if summary["training_flag"]:
        log(f"WARNING {summary['training_flag']}: a comparison built on this model means little")


def _row(server_round, result, train_metrics, replied, retained, round_seconds, elapsed) -> dict:
    return {
        "round": server_round,
        "test_accuracy": result.accuracy,
        "test_loss": result.loss,
        "train_loss": float(train_metrics.get("train-loss", float("nan"))),
        "clients_replied": replied,
        "retained": bool(retained),
        "round_seconds": round(round_seconds, 3),
        "elapsed_seconds": round(elapsed, 3),
        "server_rss_mb": megabytes(current_rss_bytes()),
        # the peak within the round (since the last row), not the run's so far
        "server_round_peak_rss_mb": megabytes(take_interval_peak_rss_bytes()),
    }
