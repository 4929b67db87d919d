"""Scale benchmark: a digits federation of 100 virtual clients on a small CPU, history kept on disk.

Runs ``fedunlearn-run`` (``flwr run`` on the local simulation) with 100 clients, retention at every
round (Δt = 1, every client), then forgets one client with FedEraser. The ServerApp records its own
resident memory (RSS) and the store's size in ``metrics.csv`` after every round; meanwhile this script
samples the memory of the local SuperLink's whole process tree (the ServerApp's ``flwr-simulation``
process, Ray's GCS and raylet, and the client workers).

It writes ``scale.csv``/``.md`` (one row per round), ``scale.png`` (RSS and store size against the
round) and ``scale_summary.json``: peak RSS of the ServerApp's process and of the tree, store bytes,
and the slope of the ServerApp's RSS over the rounds next to the store's growth per round. If the
retained history were held in memory, the two slopes would be about equal; ``--no-retain`` runs the
same federation without a history, for the slope that has nothing to do with it.

Usage (about 5 minutes each on 2 cores)::

    pip install -e ".[bench]"
    python -m simulations.benchmarks.scale --output-dir results/scale
    python -m simulations.benchmarks.scale --output-dir results/scale-no-retain --no-retain

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


class TreeProbe:
    """Samples, in a thread, the RSS of every local ``flower-superlink`` process tree and of its
    ``flwr-simulation`` process (the one running the ServerApp); keeps the peaks."""

    def __init__(self, interval: float = 0.5) -> None:
        import psutil

        self._psutil = psutil
        self.tree_peak = 0
        self.simulation_peak = 0
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
            self.tree_peak = max(self.tree_peak, sum(self._rss(p) for p in tree))
            for process in tree:
                if "flwr-simulation" in self._cmdline(process):
                    self.simulation_peak = max(self.simulation_peak, self._rss(process))

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
    ax.plot(metrics["round"], metrics["store_mb"], ls="--", label="store on disk")
    ax.set_xlabel("round")
    ax.set_ylabel("MB")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=100, help="virtual clients (default 100)")
    parser.add_argument("--rounds", type=int, default=100, help="training rounds (default 100)")
    parser.add_argument("--unlearn", default="0", help="clients to forget with FedEraser ('' none)")
    parser.add_argument(
        "--no-retain",
        action="store_true",
        help="retention off, no unlearning: the RSS slope of the same run without a history",
    )
    parser.add_argument("--warmup-rounds", type=int, default=5, help="rounds left out of the slope")
    parser.add_argument("--app", type=Path, default=runner.PROJECT_ROOT, help="the Flower app")
    args = parser.parse_args(argv)
    for name in ("clients", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup_rounds < 0:
        parser.error(f"--warmup-rounds must be >= 0, got {args.warmup_rounds}")
    try:
        import psutil  # noqa: F401
    except ImportError:
        parser.error('psutil is needed to sample memory: pip install -e ".[bench]"')

    output = args.output_dir.resolve()
    name = f"scale-{args.clients}" + ("-no-retain" if args.no_retain else "")
    sets = {
        "dataset": "'digits'",
        "num-clients": args.clients,
        "rounds": args.rounds,
        "local-epochs": 1,
        "retain": str(not args.no_retain).lower(),
        "retain-interval": 1,
        "unlearn-clients": "''" if args.no_retain else repr(args.unlearn),
        "unlearn-methods": "'federaser'",
        "run-name": repr(name),
        "node-wait-seconds": 600,
    }
    argv = ["--output-dir", str(output), "--app", str(args.app)]
    argv += [x for key, value in sets.items() for x in ("--set", f"{key}={value}")]
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
    rss_slope = slope(metrics, "server_rss_mb", args.warmup_rounds)
    store_slope = slope(metrics, "store_mb", args.warmup_rounds)
    store_bytes = sum(f.stat().st_size for f in (run / "store").rglob("*") if f.is_file())
    summary = {
        "clients": args.clients,
        "rounds": args.rounds,
        "retain": not args.no_retain,
        "retained_rounds": len(trained["retained_rounds"]),
        "seconds": round(seconds, 1),
        "store_bytes_after_training": trained["store_bytes"],
        "store_bytes_on_disk_at_end": store_bytes,
        "server_rss_mb_first_round": float(metrics["server_rss_mb"].iloc[1]),
        "server_rss_mb_last_round": float(metrics["server_rss_mb"].iloc[-1]),
        "server_rss_slope_mb_per_round": rss_slope,
        "store_growth_mb_per_round": store_slope,
        "server_peak_rss_mb_training": trained["server_peak_rss_mb"],
        "serverapp_process_peak_rss_mb_sampled": probe.simulation_peak / MB,
        "process_tree_peak_rss_mb_sampled": probe.tree_peak / MB,
        "run_directory": str(run),
    }
    output.mkdir(parents=True, exist_ok=True)
    (output / "scale_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    columns = ["round", "test_accuracy", "server_rss_mb", "store_mb", "round_seconds"]
    metrics[columns].to_csv(output / "scale.csv", index=False)
    (output / "scale.md").write_text(
        metrics[columns].to_markdown(index=False, floatfmt=("g", ".4f", ".1f", ".1f", ".2f")) + "\n"
    )
    plot(
        metrics,
        output / "scale.png",
        f"digits, {args.clients} clients, "
        + ("no retention" if args.no_retain else "every round retained (Δt = 1)")
        + f"; tree peak {probe.tree_peak / MB / 1024:.1f} GB",
    )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
