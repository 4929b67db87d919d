"""Overhead against Flower itself: our retaining ServerApp next to a minimal Flower FedAvg app.

Both train the same model (M^0 seeded alike) on the same partitions with the same client training
(:func:`fedunlearn.training.local.train_epochs`, batches seeded per round and client), in the same
in-process Ray simulation (``num_supernodes`` = K, 1 CPU per client, 2 CPUs in all, so 2 client
workers for every variant):

* ``plain``: Flower's own :class:`flwr.serverapp.strategy.FedAvg` through ``strategy.start`` (the
  Message API), no retention, no reply screening; its ``evaluate_fn`` evaluates the global model
  on the test set after every round, as our server does, with the same torch threads
  (:func:`server.federation.threads.use_server_threads`);
* ``full``, ``norms`` (or any ``NAME:key=value,...`` given with ``--variant``): our ServerApp
  (:func:`server.server_app.create_server_app`) with retention on, training only.

The variants run interleaved, ``--repeats`` times each, the order rotated every repetition, so all
see the same load. **How rounds are timed:** a round's wall time is the time between the ends of
two consecutive server-side test evaluations (the plain app's ``evaluate_fn`` calls; our
``metrics.csv``'s ``elapsed_seconds``), so it holds everything a round costs the server: sending,
waiting, screening, aggregation, retention, evaluation, the metrics row, checkpoint and console
line of the round before. Round 1 (which also pays for warm-up and, in ``norms`` mode, for keeping
round t_1 whole) is reported apart; the ratio is of the mean round time over rounds 2..R.

Because a loaded machine makes wall times noisy, each run also records the CPU time of the
ServerApp's thread over its whole ``main`` (``time.thread_time``: setup, discovery, every round,
the end): what the server computed itself, which the load does not change.

Writes ``flower_overhead.csv`` (one row per variant, repetition and round), ``flower_overhead.md``
(the summary table), ``flower_overhead.png`` and ``flower_overhead.json``; with ``--profile``
also ``profile_<variant>.txt`` (cProfile of our ServerApp's thread, top functions by own time).

Usage (about 6 minutes on 2 cores with the defaults)::

    FEDUNLEARN_DATA_ROOT=PATH python -m simulations.benchmarks.flower_overhead \\
        --output-dir results/flower_overhead
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import sys
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from fedunlearn.config import ExperimentConfig  # noqa: E402
from fedunlearn.data.federated_data import load_federated_data  # noqa: E402
from fedunlearn.seeding import derive_seed  # noqa: E402
from fedunlearn.training.local import evaluate, train_epochs  # noqa: E402
from fedunlearn.training.models import build_dataset_model  # noqa: E402
from server.federation.threads import use_server_threads  # noqa: E402
from simulations.benchmarks._args import common_args  # noqa: E402

#: Columns of the per-round rows (``server_cpu_seconds``: the whole run's, on every row of it).
COLUMNS = ["round", "round_seconds", "test_accuracy", "server_cpu_seconds"]
#: Our variants by default: retention of every round (Δt = 1), whole updates or norms only.
DEFAULT_VARIANTS = ("full:retain-mode=full", "norms:retain-mode=norms")


def base_config(args: argparse.Namespace) -> dict:
    """The run config every variant shares (ours read it whole; the plain app its data and SGD)."""
    return {
        "dataset": args.dataset,
        "data-root": args.data_root or "",
        "num-clients": args.clients,
        "train-samples": args.train_samples,
        "rounds": args.rounds,
        "local-epochs": args.local_epochs,
        "batch-size": args.batch_size,
        "lr": 0.05,
        "momentum": 0.9,
        "seed": 0,
        "fraction-evaluate": 0.0,
        "retain": True,
        "retain-interval": 1,
        "unlearn-clients": "",
        "unlearn-methods": "federaser",  # what norms mode can serve; training only here anyway
        "node-wait-seconds": 600,
    }


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME:key=value,key=value`` -> (name, overrides); values read as int, float or bool."""
    name, _, rest = text.partition(":")
    overrides: dict = {}
    for item in filter(None, rest.split(",")):
        key, _, raw = item.partition("=")
        value: object = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        if raw in ("true", "false"):
            value = raw == "true"
        overrides[key.strip()] = value
    if not name or name == "plain":
        raise SystemExit(f"--variant {text!r}: give it a name other than 'plain' before ':'")
    return name, overrides


# ----------------------------------------------------------------------- the plain Flower app
def plain_client_app(values: dict) -> ClientApp:
    """Flower ClientApp: ``train`` only; the same partition, model and seeded SGD as ours."""
    app = ClientApp()
    config = ExperimentConfig.from_run_config(values)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        partition = int(context.node_config["partition-id"])
        data = load_federated_data(config)
        split = data.client_split(partition)
        model = build_dataset_model(
            config.model, config.dataset, data.splits.input_shape, data.splits.num_classes
        )
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        server_round = int(msg.content["config"]["server-round"])
        loss = train_epochs(
            model,
            split.x,
            split.y,
            epochs=config.local_epochs,
            lr=config.lr,
            batch_size=config.batch_size,
            momentum=config.momentum,
            seed=derive_seed(config.training_seed, "train", server_round, partition),
        )
        metrics = MetricRecord({"num-examples": len(split), "train-loss": loss})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    return app


def plain_server_app(values: dict, marks: list[tuple[int, float, float]]) -> ServerApp:
    """Flower ServerApp: Flower's FedAvg (``strategy.start``), the test set evaluated after every
    round by ``evaluate_fn``, which appends (round, perf_counter, accuracy) to ``marks``."""
    app = ServerApp()
    config = ExperimentConfig.from_run_config(values)

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        use_server_threads()  # as ours: the ratio measures our work, not a thread setting
        splits = load_federated_data(config).splits
        shape, classes = splits.input_shape, splits.num_classes
        seed = derive_seed(config.training_seed, "initial-model")  # ours' M^0
        model = build_dataset_model(config.model, config.dataset, shape, classes, seed=seed)

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            model.load_state_dict(arrays.to_torch_state_dict())
            result = evaluate(model, splits.test.x, splits.test.y)
            marks.append((server_round, time.perf_counter(), result.accuracy))
            return MetricRecord({"accuracy": result.accuracy, "loss": result.loss})

        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=config.num_clients,
            min_available_nodes=config.num_clients,
        )
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=config.rounds,
            train_config=ConfigRecord({"lr": config.lr}),
            evaluate_fn=evaluate_fn,
        )

    return app


# ----------------------------------------------------------------------- running the variants
def simulate(server_app: ServerApp, client_app: ClientApp, clients: int) -> None:
    from flwr.simulation import run_simulation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=clients,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": 2},
            },
        )


def run_plain(values: dict) -> pd.DataFrame:
    """One run of the plain app: (round, round_seconds, test_accuracy) for rounds 1..R."""
    marks: list[tuple[int, float, float]] = []
    cpu: list[float] = []
    server = cpu_timed(plain_server_app(values, marks), cpu)
    simulate(server, plain_client_app(values), values["num-clients"])
    table = pd.DataFrame(marks, columns=["round", "time", "test_accuracy"]).sort_values("round")
    table["round_seconds"] = table["time"].diff()
    table["server_cpu_seconds"] = cpu[0]
    return table[table["round"] >= 1][COLUMNS]


def cpu_timed(app: ServerApp, sink: list[float]) -> ServerApp:
    """``app`` whose main's CPU time on the ServerApp's thread (``time.thread_time``: what the
    server itself computed, whatever the load) is appended to ``sink``."""
    wrapper = ServerApp()

    @wrapper.main()
    def main(grid: Grid, context: Context) -> None:
        started = time.thread_time()
        try:
            app._main(grid, context)  # noqa: SLF001 - the inner app's main, unchanged
        finally:
            sink.append(time.thread_time() - started)

    return wrapper


def profiled(app: ServerApp, path: Path) -> ServerApp:
    """``app`` with its main run under cProfile (the ServerApp's thread); the top functions by own
    time go to ``path``."""
    wrapper = ServerApp()

    @wrapper.main()
    def main(grid: Grid, context: Context) -> None:
        profile = cProfile.Profile()
        profile.enable()
        try:
            app._main(grid, context)  # noqa: SLF001 - the inner app's main, unchanged
        finally:
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(40)
            path.write_text(out.getvalue())

    return wrapper


def run_ours(values: dict, output: Path, name: str, profile: Path | None) -> pd.DataFrame:
    """One run of our ServerApp: (round, round_seconds, test_accuracy) for rounds 1..R from the
    run directory's ``metrics.csv`` (``elapsed_seconds`` differences)."""
    from clients.client_app import create_client_app
    from server.server_app import create_server_app

    values = {**values, "output-dir": str(output / "runs"), "run-name": name}
    shutil.rmtree(output / "runs" / name, ignore_errors=True)
    cpu: list[float] = []
    server = create_server_app(values)
    if profile is not None:
        server = profiled(server, profile)
    simulate(cpu_timed(server, cpu), create_client_app(values), values["num-clients"])
    metrics = pd.read_csv(output / "runs" / name / "metrics.csv").sort_values("round")
    metrics["round_seconds"] = metrics["elapsed_seconds"].diff()
    metrics["server_cpu_seconds"] = cpu[0]
    return metrics[metrics["round"] >= 1][COLUMNS]


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per variant: mean round time over rounds 2..R (and round 1 apart), its ratio to plain's,
    and the final test accuracy (mean over repetitions)."""
    later = rows[rows["round"] >= 2]
    per_run = later.groupby(["variant", "repeat"])["round_seconds"].mean().reset_index()
    plain = per_run[per_run["variant"] == "plain"].set_index("repeat")["round_seconds"]
    per_run["ratio"] = per_run["round_seconds"] / per_run["repeat"].map(plain)
    last = rows[rows["round"] == rows["round"].max()]
    summary = per_run.groupby("variant").agg(
        mean_round_seconds=("round_seconds", "mean"),
        ratio_to_plain=("ratio", "mean"),
        ratio_min=("ratio", "min"),
        ratio_max=("ratio", "max"),
    )
    summary["round_1_seconds"] = rows[rows["round"] == 1].groupby("variant")["round_seconds"].mean()
    runs = rows.groupby(["variant", "repeat"])["server_cpu_seconds"].first()
    summary["server_cpu_seconds_per_run"] = runs.groupby("variant").mean()
    summary["final_test_accuracy"] = last.groupby("variant")["test_accuracy"].mean()
    order = ["plain"] + [v for v in summary.index if v != "plain"]
    return summary.loc[order].reset_index()


def plot(rows: pd.DataFrame, summary: pd.DataFrame, path: Path, title: str) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for variant, group in rows.groupby("variant", sort=False):
        mean = group.groupby("round")["round_seconds"].mean()
        left.plot(mean.index, mean.values, marker="o", ms=3, label=variant)
    left.set_xlabel("round")
    left.set_ylabel("round wall time (s), mean over repetitions")
    left.grid(alpha=0.3)
    left.legend()
    right.bar(summary["variant"], summary["ratio_to_plain"], color="tab:blue")
    right.axhline(1.02, color="tab:red", ls="--", label="goal 1.02")
    right.set_ylabel("mean round time / plain Flower's (rounds 2..R)")
    right.set_ylim(0.9, max(1.1, float(summary["ratio_to_plain"].max()) + 0.05))
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common_args(parser, None, data_root_help=None)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--train-samples", type=int, default=0, help="0: the whole training set")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        help="one of ours, NAME:key=value,... (default: " + " and ".join(DEFAULT_VARIANTS) + ")",
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile our ServerApp in the last repetition"
    )
    args = parser.parse_args(argv)
    for name in ("clients", "rounds", "local_epochs", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.rounds < 2:
        parser.error("--rounds must be >= 2: round 1 is reported apart from the ratio")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = args.output_dir.resolve()
    output.mkdir(parents=True, exist_ok=True)
    values = base_config(args)
    ours = dict(parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS))
    names = ["plain", *ours]
    frames = []
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:  # rotated: no variant always runs first
            started = time.perf_counter()
            if name == "plain":
                table = run_plain(values)
            else:
                last = args.profile and repeat == args.repeats - 1
                profile = output / f"profile_{name}.txt" if last else None
                table = run_ours({**values, **ours[name]}, output, name, profile)
            table.insert(0, "repeat", repeat)
            table.insert(0, "variant", name)
            frames.append(table)
            print(
                f"=== {name} (repetition {repeat + 1}/{args.repeats}): "
                f"{time.perf_counter() - started:.1f}s, rounds 2..R mean "
                f"{table[table['round'] >= 2]['round_seconds'].mean():.2f}s",
                flush=True,
            )
    rows = pd.concat(frames, ignore_index=True)
    rows.to_csv(output / "flower_overhead.csv", index=False)
    summary = summarize(rows)
    (output / "flower_overhead.md").write_text(
        summary.to_markdown(index=False, floatfmt=".4f") + "\n"
    )
    title = (
        f"{args.dataset}, K = {args.clients}, {args.rounds} rounds x {args.local_epochs} epoch(s), "
        f"{args.repeats} interleaved repetitions"
    )
    plot(rows, summary, output / "flower_overhead.png", title)
    (output / "flower_overhead.json").write_text(
        json.dumps(
            {"settings": vars(args) | {"output_dir": str(output)}, "variants": ours},
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(summary.to_markdown(index=False, floatfmt=".4f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
