"""Federated training of the original model M: the training run around the round loop of
:mod:`server.training.rounds`.

One progress line per round; per-round metrics, the initial and final models and the store go to
the run directory as they are produced, with a checkpoint of the global model after every round, so
an interrupted run keeps everything up to its last round and ``resume = true`` continues it there
(:mod:`server.training.resume`).
"""

from __future__ import annotations

import time

import pandas as pd
from flwr.app import MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import FederatedData, load_federated_data
from fedunlearn.errors import RunStopped
from fedunlearn.memory import (
    current_rss_bytes,
    megabytes,
    peak_rss_bytes,
    take_interval_peak_rss_bytes,
)
from fedunlearn.registry import run_retention
from fedunlearn.store.run_directory import RECOVERY_LOG, RunDirectory
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.tracking import open_tracker
from fedunlearn.training.local import resolve_device
from fedunlearn.training.models import resolve_model_name
from fedunlearn.unlearning.verdicts import training_flag
from server.federation.availability import roster_availability
from server.federation.members import FederationMembers, round_sampler
from server.federation.reply_screening import ReplyScreen
from server.progress import Log, count
from server.training.resume import (
    check_finished_run,
    check_resumable,
    resume_point,
    training_finished,
)
from server.training.rounds import (
    TrainingOutcome,
    discover,
    dp_epsilon_of,
    evaluate_run_model,
    fedavg_rounds,
    initial_model,
)
from server.unlearning import journal as request_journal
from server.unlearning.adoption import finish_pending
from strategies.aggregation import aggregation_strategy
from strategies.retaining import Retaining


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
    recorder.tracker.close()
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
    """What each completed round leaves: a ``metrics.csv`` row (also to TensorBoard and MLflow
    when asked: :mod:`fedunlearn.tracking`), a checkpoint, a console line.

    Called as ``fedavg_rounds``'s ``on_round``; the elapsed time continues a resumed run's.
    """

    def __init__(self, config, run, store, model, retaining, started, log: Log) -> None:
        self.config, self.run, self.store, self.model = config, run, store, model
        self.retaining, self.started, self.log = retaining, started, log
        self.elapsed_before = 0.0
        self.tracker = open_tracker(config, run.path)

    def _record(self, row: dict) -> None:
        self.run.append_metrics(row)
        self.tracker.log_round(row)

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
        self._record({**row, **self._store_size(), "refused": 0, "check_seconds": 0.0})
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
        self._record(row)
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
    from fedunlearn.plots import plot_training_curves  # matplotlib: after training, not at start

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
