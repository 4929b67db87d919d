"""Scale benchmark: a federation of 100 or 1,000 virtual clients on a small CPU, history kept on disk.

Runs ``fedunlearn-run`` (``flwr run`` on the local simulation) with ``--clients`` clients (digits by
default, or the run config given, e.g. ``simulations/scale_mnist_1000.toml``), retention at every
round (Δt = 1, every client), then forgets one client with FedEraser. The ServerApp records its own
resident memory (RSS) and the store's size in ``metrics.csv`` after every round; meanwhile this script
samples the memory of the local SuperLink's whole process tree (the ServerApp's ``flwr-simulation``
process, Ray's GCS and raylet, and the client workers).

It writes ``scale.csv``/``.md`` (one row per round: the ServerApp's RSS, the store, the round's wall
time and the wall time per client update), ``scale_samples.csv`` (the sampled RSS of the tree and
of the ServerApp's process every 0.5 s, training and unlearning), ``scale.png`` (RSS and store size
against the round) and ``scale_summary.json``: peak RSS of the ServerApp's process and of the tree,
store bytes, and the slope of the ServerApp's RSS over the rounds next to the store's growth per
round. If the
retained history were held in memory, the two slopes would be about equal; ``--no-retain`` runs the
same federation without a history, for the slope that has nothing to do with it.

Usage (about 5 minutes each on 2 cores)::

    pip install -e ".[bench]"
    python -m simulations.benchmarks.scale --output-dir results/scale
    python -m simulations.benchmarks.scale --output-dir results/scale-no-retain --no-retain

1,000 MNIST clients (60 images each), norms-only retention, then FedEraser (the config's header
gives the time)::

    python -m simulations.benchmarks.scale simulations/scale_mnist_1000.toml --clients 1000 \
        --rounds 20 --data-root PATH --output-dir results/scale-1000

To run the clients on an existing Ray cluster, start the local SuperLink with ``RAY_ADDRESS`` set
(README, "Scale"); the sampled tree then holds only the ServerApp's side.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.memory import MB  # noqa: E402
from simulations import run as runner  # noqa: E402
from simulations.benchmarks._args import common_args  # noqa: E402


class TreeProbe:
    """Samples, in a thread, the RSS of every local ``flower-superlink`` process tree and of its
    ``flwr-simulation`` process (the one running the ServerApp); keeps the peaks."""

    def __init__(self, interval: float = 0.5) -> None:
        import psutil

        self._psutil = psutil
        self.tree_peak = 0
        self.simulation_peak = 0
        self.samples: list[tuple[float, int, int]] = []  # (seconds, tree RSS, ServerApp RSS)
        self._started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _cmdline(self, process) -> str:
        try:
            return " ".join(process.cmdline())
        except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
            return ""

    def _rss(self, process) -> int:
        try:
            return process.memory_info().rss
        except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
            return 0

    def sample(self) -> None:
        for root in self._psutil.process_iter():
            if "flower-superlink" not in self._cmdline(root):
                continue
            try:
                tree = [root, *root.children(recursive=True)]
            except self._psutil.NoSuchProcess:
                continue
            total = sum(self._rss(p) for p in tree)
            server = sum(self._rss(p) for p in tree if "flwr-simulation" in self._cmdline(p))
            self.tree_peak = max(self.tree_peak, total)
            self.simulation_peak = max(self.simulation_peak, server)
            self.samples.append((time.perf_counter() - self._started, total, server))

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def __enter__(self) -> TreeProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def slope(metrics: pd.DataFrame, column: str, skip: int) -> float:
    """Least-squares slope (MB per round) of ``column`` over the rounds after the first ``skip``."""
    rows = metrics[metrics["round"] > skip]
    if len(rows) < 2:
        return float("nan")
    return float(np.polyfit(rows["round"], rows[column], 1)[0])


def plot(metrics: pd.DataFrame, path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(metrics["round"], metrics["server_rss_mb"], marker="o", ms=3, label="ServerApp RSS")
    if "server_round_peak_rss_mb" in metrics:
        peak = metrics["server_round_peak_rss_mb"]
        ax.plot(metrics["round"], peak, marker="^", ms=3, label="ServerApp peak within the round")
    ax.plot(metrics["round"], metrics["store_mb"], ls="--", label="store on disk")
    ax.set_xlabel("round")
    ax.set_ylabel("MB")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "config", nargs="?", type=Path, help="run-config TOML (default: digits, 1 local epoch)"
    )
    common_args(parser, None, data_root=False)
    parser.add_argument("--clients", type=int, default=100, help="virtual clients (default 100)")
    parser.add_argument("--rounds", type=int, default=100, help="training rounds (default 100)")
    parser.add_argument("--retain-interval", type=int, default=1, help="Δt (default 1)")
    parser.add_argument("--unlearn", default="0", help="clients to forget with FedEraser ('' none)")
    parser.add_argument("--data-root", help="dataset root (MNIST and the other downloads)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one key"
    )
    parser.add_argument(
        "--no-retain",
        action="store_true",
        help="retention off, no unlearning: the RSS slope of the same run without a history",
    )
    parser.add_argument("--warmup-rounds", type=int, default=5, help="rounds left out of the slope")
    parser.add_argument(
        "--from-run",
        action="store_true",
        help="launch nothing: summarise the run already in --output-dir (one whose unlearning "
        "failed, say); no wall time, no sampled process tree",
    )
    parser.add_argument("--app", type=Path, default=runner.PROJECT_ROOT, help="the Flower app")
    parser.add_argument(
        "--tile-mnist",
        type=int,
        metavar="COPIES",
        help="train on COPIES copies of MNIST's 60,000 training images (an .npz written in "
        "--output-dir from --data-root's MNIST), --samples-per-client each: K above 60,000",
    )
    parser.add_argument(
        "--samples-per-client",
        type=int,
        default=1,
        help="with --tile-mnist: training images per client (train-samples = K x this)",
    )
    args = parser.parse_args(argv)
    for name in ("clients", "rounds", "retain_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.tile_mnist is not None:
        if args.tile_mnist < 1 or not args.data_root:
            parser.error("--tile-mnist needs COPIES >= 1 and --data-root holding MNIST")
        if not 1 <= args.samples_per_client * args.clients <= 60000 * args.tile_mnist:
            parser.error("--samples-per-client x --clients exceeds the tiled training set")
    if args.warmup_rounds < 0:
        parser.error(f"--warmup-rounds must be >= 0, got {args.warmup_rounds}")
    try:
        import psutil  # noqa: F401
    except ImportError:
        parser.error('psutil is needed to sample memory: pip install -e ".[bench]"')
    return args


def tiled_mnist(data_root: str, copies: int, folder: Path) -> Path:
    """An .npz of MNIST's training images repeated ``copies`` times (labels alike) and its test
    set, written once in ``folder``: a training set of 60,000 x ``copies`` images, so that K above
    60,000 clients each hold a sample (the copies of one image may go to different clients)."""
    path = folder / f"mnist_x{copies}.npz"
    if path.is_file():
        return path
    import torchvision

    train = torchvision.datasets.MNIST(data_root, train=True, download=False)
    test = torchvision.datasets.MNIST(data_root, train=False, download=False)
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(
        partial,
        x_train=np.tile(train.data.numpy(), (copies, 1, 1)),
        y_train=np.tile(train.targets.numpy(), copies),
        x_test=test.data.numpy(),
        y_test=test.targets.numpy(),
    )
    partial.rename(path)
    return path


def tiled_settings(args: argparse.Namespace, output: Path) -> tuple[str, list[str]]:
    """``--tile-mnist``: the .npz as data-root, and the settings that train on it."""
    path = tiled_mnist(args.data_root, args.tile_mnist, output)
    samples = args.clients * args.samples_per_client
    return str(path), ["dataset='npz'", f"train-samples={samples}"]


def launcher_argv(args: argparse.Namespace, output: Path, name: str) -> list[str]:
    """``fedunlearn-run``'s arguments: the config (or digits), the scale settings, then ``--set``."""
    sets: dict[str, object] = {}
    if args.config is None:
        sets.update({"dataset": "'digits'", "local-epochs": 1})
    sets.update(
        {
            "num-clients": args.clients,
            "rounds": args.rounds,
            "retain": str(not args.no_retain).lower(),
            "retain-interval": args.retain_interval,
            "unlearn-clients": "''" if args.no_retain else repr(args.unlearn),
            "unlearn-methods": "'federaser'",
            "run-name": repr(name),
            "node-wait-seconds": 600,
        }
    )
    argv = [str(args.config)] if args.config is not None else []
    argv += ["--output-dir", str(output), "--app", str(args.app)]
    if args.data_root:
        argv += ["--data-root", args.data_root]
    argv += [x for key, value in sets.items() for x in ("--set", f"{key}={value}")]
    return argv + [x for item in args.set for x in ("--set", item)]


#: How each column of ``scale.md`` is printed.
FORMATS = {"test_accuracy": ".4f", "round_wall_seconds": ".2f", "seconds_per_update": ".4f"}
FORMATS.update(dict.fromkeys(["server_rss_mb", "server_round_peak_rss_mb", "store_mb"], ".1f"))


def round_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per round: accuracy, the ServerApp's RSS, the store, the round's wall time (between
    the ends of two consecutive rounds' evaluations: everything the round cost) and that time per
    client update (the clients that replied; 2 workers train side by side)."""
    table = metrics.copy()
    table["round_wall_seconds"] = table["elapsed_seconds"].diff()
    table["seconds_per_update"] = table["round_wall_seconds"] / table["clients_replied"]
    columns = ["round", "test_accuracy", "server_rss_mb", "store_mb", "clients_replied"]
    if "server_round_peak_rss_mb" in table:  # the peak within each round (newer runs)
        columns.insert(3, "server_round_peak_rss_mb")
    return table[table["round"] >= 1][columns + ["round_wall_seconds", "seconds_per_update"]]


def calibration_updates(run: Path, details: dict, steps: int, remaining: int) -> int:
    """The calibration updates FedEraser asked: as its details count them (newer runs),
    else the clients of each adopted trajectory round after the first (a sampled run calibrates
    each round's participants only), else every remaining client at every step after t_1."""
    if "calibration_updates" in details:
        return int(details["calibration_updates"])
    store = run / "store"
    if (store / "store.json").is_file():
        from fedunlearn.store.update_store import UpdateStore

        history = UpdateStore(store, readonly=True)
        rounds = history.rounds()
        if len(rounds) == steps:
            return sum(len(history.clients(r)) for r in rounds[1:])
    return max(steps - 1, 0) * remaining


def unlearning_costs(run: Path, clients: int, targets: int) -> dict:
    """FedEraser's wall time and calibration updates (each retained round after t_1, every
    remaining client), from the run's ``unlearning.csv`` and log."""
    table_path, log_path = run / "unlearning.csv", run / "unlearning_log.jsonl"
    if not table_path.is_file() or not log_path.is_file():
        return {}
    table = pd.read_csv(table_path).set_index("method")
    entry = json.loads(log_path.read_text().splitlines()[-1])
    details = entry["details"].get("federaser", {})
    steps = int(details.get("steps", 0))
    peaks = [float(p) for p in details.get("step_peak_rss_mb", [])]
    updates = calibration_updates(run, details, steps, clients - targets)
    seconds = float(table.loc["federaser", "seconds"]) if "federaser" in table.index else 0.0
    return {
        "federaser_seconds": round(seconds, 1),
        "federaser_steps": steps,
        "calibration_updates": updates,
        "seconds_per_calibration_update": seconds / updates if updates else float("nan"),
        "federaser_step_peak_rss_mb": peaks,
        "federaser_peak_rss_mb": max(peaks, default=float("nan")),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = args.output_dir.resolve()
    dataset = "digits" if args.config is None else args.config.stem
    if args.tile_mnist is not None:
        dataset = f"mnist-x{args.tile_mnist}"
        args.data_root, tiled = tiled_settings(args, output)
        args.set = tiled + args.set
    name = f"scale-{dataset}-{args.clients}" + ("-no-retain" if args.no_retain else "")
    argv = launcher_argv(args, output, name)
    if args.from_run:  # the run is there already: its tables only, no sampled tree, no wall time
        probe, seconds = TreeProbe(), float("nan")
    else:
        print(f"=== fedunlearn-run {' '.join(argv)}", flush=True)
        started = time.perf_counter()
        with TreeProbe() as probe:
            code = runner.main(argv)
        seconds = time.perf_counter() - started
        if code != 0:
            print(f"fedunlearn-run failed with exit code {code}", file=sys.stderr)
            return code

    run = output / name
    metrics = pd.read_csv(run / "metrics.csv")
    trained = json.loads((run / "summary.json").read_text())
    rounds = round_table(metrics)
    later = rounds[rounds["round"] > 1]
    targets = 0 if args.no_retain or not args.unlearn else len(args.unlearn.split(","))
    summary = {
        "clients": args.clients,
        "rounds": args.rounds,
        "retain": not args.no_retain,
        "retained_rounds": len(trained["retained_rounds"]),
        "seconds": round(seconds, 1),
        "training_seconds": round(float(trained["seconds"]), 1),
        "mean_round_wall_seconds_after_round_1": float(later["round_wall_seconds"].mean()),
        "mean_seconds_per_update_after_round_1": float(later["seconds_per_update"].mean()),
        "store_bytes_after_training": trained["store_bytes"],
        "store_bytes_on_disk_at_end": sum(
            f.stat().st_size for f in (run / "store").rglob("*") if f.is_file()
        ),
        "server_rss_mb_first_round": float(rounds["server_rss_mb"].iloc[0]),
        "server_rss_mb_last_round": float(rounds["server_rss_mb"].iloc[-1]),
        "server_rss_mb_between_rounds_max": float(rounds["server_rss_mb"].max()),
        "server_round_peak_rss_mb_max": float(
            rounds.get("server_round_peak_rss_mb", pd.Series([float("nan")])).max()
        ),
        "server_rss_slope_mb_per_round": slope(metrics, "server_rss_mb", args.warmup_rounds),
        "store_growth_mb_per_round": slope(metrics, "store_mb", args.warmup_rounds),
        "server_peak_rss_mb_training": trained["server_peak_rss_mb"],
        "serverapp_process_peak_rss_mb_sampled": probe.simulation_peak / MB,
        "process_tree_peak_rss_mb_sampled": probe.tree_peak / MB,
        **unlearning_costs(run, args.clients, targets),
        "run_directory": str(run),
    }
    write_outputs(output, rounds, probe, summary, args, dataset)
    print(json.dumps(summary, indent=2))
    return 0


def write_outputs(output: Path, rounds: pd.DataFrame, probe: TreeProbe, summary, args, dataset):
    output.mkdir(parents=True, exist_ok=True)
    (output / "scale_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    rounds.to_csv(output / "scale.csv", index=False)
    (output / "scale.md").write_text(
        rounds.to_markdown(index=False, floatfmt=tuple(FORMATS.get(c, "g") for c in rounds)) + "\n"
    )
    samples = pd.DataFrame(probe.samples, columns=["seconds", "tree_rss_bytes", "server_rss_bytes"])
    samples.to_csv(output / "scale_samples.csv", index=False)
    retention = "no retention" if args.no_retain else f"retained, Δt = {args.retain_interval}"
    plot(
        rounds,
        output / "scale.png",
        f"{dataset}, {args.clients} clients, {retention}; tree peak "
        f"{probe.tree_peak / MB / 1024:.1f} GiB",
    )


if __name__ == "__main__":
    sys.exit(main())
