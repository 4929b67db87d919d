"""Federated training of the original model M: FedAvg rounds that retain client updates.

One progress line per round; per-round metrics, the initial and final models and the store go to
the run directory as they are produced, so an interrupted run keeps everything up to its last round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid

from fedunlearn.config import ExperimentConfig
from fedunlearn.federated_data import load_federated_data
from fedunlearn.models import build_model, resolve_model_name
from fedunlearn.plots import plot_training_curves
from fedunlearn.run_directory import RunDirectory
from fedunlearn.seeding import derive_seed
from fedunlearn.training import evaluate, resolve_device
from fedunlearn.update_store import UpdateStore
from server.federation import discover_clients
from strategies.retaining_fedavg import RetainingFedAvg

ROUND_TIMEOUT_SECONDS = 3600.0


@dataclass(frozen=True)
class TrainingOutcome:
    run_dir: Path
    final_accuracy: float
    final_loss: float
    retained_rounds: list[int]
    seconds: float


def train_federated(
    grid: Grid, config: ExperimentConfig, *, log: Callable[[str], None] = print
) -> TrainingOutcome:
    """Train with retaining FedAvg as ``config`` says; returns where the results are.

    Everything that can be checked is checked before the run directory is created: the config, the
    dataset, the partition sizes and the federation's size.
    """
    started = time.perf_counter()
    data = load_federated_data(config)
    splits = data.splits
    model = build_model(
        resolve_model_name(config.model, config.dataset),
        splits.input_shape,
        splits.num_classes,
        seed=derive_seed(config.seed, "initial-model"),
    )
    device = resolve_device(config.device)
    members = discover_clients(grid, config.num_clients, config.node_wait_seconds, log=log)

    run = RunDirectory.create(config.run_directory(), config.to_run_config())
    log(f"run directory: {run.path}")
    log(
        f"{config.dataset}: {len(splits.train)} training samples over {config.num_clients} clients "
        f"({config.partitioning}), {len(splits.test)} test samples; {config.rounds} rounds x "
        f"{config.local_epochs} local epochs; retention "
        + (
            f"every {config.retain_interval} round(s), {config.store_dtype}"
            if config.retain
            else "off"
        )
        + (f"; {members.cuda_clients} client(s) on CUDA" if members.cuda_clients else "")
    )
    store = UpdateStore(run.store_path, dtype=config.store_dtype) if config.retain else None
    if store is not None:
        store.set_metadata(
            dataset=config.dataset,
            num_clients=config.num_clients,
            retain_interval=config.retain_interval,
            seed=config.seed,
            model=resolve_model_name(config.model, config.dataset),
        )
    strategy = RetainingFedAvg(
        store,
        retain_interval=config.retain_interval,
        fraction_train=1.0,
        fraction_evaluate=config.fraction_evaluate,
        min_train_nodes=config.num_clients,
        min_evaluate_nodes=1,
        min_available_nodes=config.num_clients,
    )
    train_config = ConfigRecord(
        {
            "local-epochs": config.local_epochs,
            "lr": config.lr,
            "batch-size": config.batch_size,
            "momentum": config.momentum,
            "weight-decay": config.weight_decay,
        }
    )

    run.save_model("model_initial", model.state_dict())
    initial = evaluate(model, splits.test.x, splits.test.y, device=device)
    run.append_metrics(
        _row(0, initial, MetricRecord(), 0, False, 0.0, time.perf_counter() - started)
    )
    log(
        f"round 0/{config.rounds}  test accuracy {initial.accuracy:.4f}  test loss {initial.loss:.4f}"
    )

    arrays = ArrayRecord(model.state_dict())
    for server_round in range(1, config.rounds + 1):
        round_started = time.perf_counter()
        messages = list(
            strategy.configure_train(server_round, arrays, ConfigRecord(dict(train_config)), grid)
        )
        replies = list(grid.send_and_receive(messages, timeout=ROUND_TIMEOUT_SECONDS))
        failed = [r for r in replies if r.has_error()]
        new_arrays, train_metrics = strategy.aggregate_train(server_round, replies)
        if new_arrays is None:
            reasons = (
                "; ".join(sorted({r.error.reason.strip().splitlines()[-1] for r in failed}))
                or "no replies"
            )
            raise RuntimeError(f"round {server_round}: no client returned an update ({reasons})")
        arrays = new_arrays
        evaluate_messages = strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid)
        client_eval = strategy.aggregate_evaluate(
            server_round, grid.send_and_receive(evaluate_messages, timeout=ROUND_TIMEOUT_SECONDS)
        )
        model.load_state_dict(arrays.to_torch_state_dict())
        result = evaluate(model, splits.test.x, splits.test.y, device=device)
        retained = strategy.is_retained_round(server_round)
        row = _row(
            server_round,
            result,
            train_metrics or MetricRecord(),
            len(replies) - len(failed),
            retained,
            time.perf_counter() - round_started,
            time.perf_counter() - started,
        )
        if client_eval is not None:
            row["client_eval_accuracy"] = float(client_eval.get("eval-accuracy", float("nan")))
        run.append_metrics(row)
        log(
            f"round {server_round}/{config.rounds}  test accuracy {result.accuracy:.4f}  "
            f"test loss {result.loss:.4f}  train loss {row['train_loss']:.4f}  "
            f"clients {row['clients_replied']}/{config.num_clients}"
            + ("  retained" if retained else "")
            + f"  {row['round_seconds']:.1f}s"
        )

    run.save_model("model_final", model.state_dict())
    metrics = run.metrics
    plot_training_curves(
        metrics, run.path / "training.png", title=f"{config.dataset}, {config.num_clients} clients"
    )
    retained_rounds = store.rounds() if store is not None else []
    seconds = time.perf_counter() - started
    summary = {
        "final_test_accuracy": float(metrics["test_accuracy"].iloc[-1]),
        "final_test_loss": float(metrics["test_loss"].iloc[-1]),
        "retained_rounds": retained_rounds,
        "store_bytes": store.total_bytes() if store is not None else 0,
        "seconds": seconds,
        "partition_sizes": {str(k): v for k, v in sorted(members.num_examples.items())},
    }
    run.write_json("summary.json", summary)
    log(
        f"done in {seconds:.1f}s: final test accuracy {summary['final_test_accuracy']:.4f}; "
        f"{len(retained_rounds)} retained round(s), {summary['store_bytes'] / 1e6:.2f} MB; "
        f"results in {run.path}"
    )
    return TrainingOutcome(
        run.path,
        summary["final_test_accuracy"],
        summary["final_test_loss"],
        retained_rounds,
        seconds,
    )


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
    }
