"""Scale benchmark: a digits federation of 100 virtual clients on a small CPU, history kept on disk.

Trains with retention at every round (Δt = 1, every client), then forgets one client with FedEraser,
in a Ray simulation run from this process (the ServerApp runs here, so its memory is this process's).
After every round it samples:

* the resident memory (RSS) of the ServerApp's process (this one), which holds the global model,
  the strategy and the store's index, never the retained updates;
* the RSS of the whole process tree (Ray's GCS, raylet and client workers included);
* the bytes of the store on disk.

It writes ``scale.csv``/``.md`` (one row per round), ``scale.png`` (RSS and store size against the
round) and ``scale_summary.json``: peak RSS (``ru_maxrss`` of this process and the sampled tree
peak), store bytes, and the server RSS slope over the retained rounds next to the store's growth per
round. If the retained history were held in memory, the slope would be about the store's growth.

Usage (about 5 minutes on 2 cores)::

    pip install -e ".[bench]"
    python -m simulations.benchmarks.scale --output-dir results/scale
    python -m simulations.benchmarks.scale --output-dir results/scale-no-retain --no-retain

``--ray-address`` runs the clients on an existing Ray cluster instead of starting one (the same as
setting ``RAY_ADDRESS``); Ray then owns the CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

MB = 1024 * 1024
ROUND_LINE = re.compile(r"^round (\d+)/(\d+) ")
RUN_LINE = re.compile(r"^run directory: (.+)$")


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when missing)."""
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class MemoryProbe:
    """RSS of this process and of its whole process tree, sampled in a thread and on demand."""

    def __init__(self, interval: float = 0.25) -> None:
        import psutil

        self._psutil = psutil
        self.process = psutil.Process()
        self.tree_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, args=(interval,), daemon=True)

    def server_rss(self) -> int:
        return self.process.memory_info().rss

    def tree_rss(self) -> int:
        total = self.server_rss()
        for child in self.process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                pass
        self.tree_peak = max(self.tree_peak, total)
        return total

    def _sample_forever(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.tree_rss()

    def __enter__(self) -> MemoryProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def server_app_with_probe(overrides: dict, probe: MemoryProbe, rows: list[dict]):
    """Train and unlearn like the main ServerApp, recording memory and store size at each round."""
    from flwr.serverapp import ServerApp

    from fedunlearn.config import ExperimentConfig
    from server.federated_training import train_federated
    from server.unlearning import run_unlearning

    state: dict = {"phase": "training", "run": None, "started": time.perf_counter()}

    def log(line: str) -> None:
        print(f"[scale] {line}", flush=True)
        if match := RUN_LINE.match(line):
            state["run"] = Path(match.group(1))
        if line.startswith("unlearning client"):
            state["phase"] = "unlearning"
        if (match := ROUND_LINE.match(line)) and state["run"] is not None:
            rows.append(
                {
                    "phase": state["phase"],
                    "round": int(match.group(1)),
                    "server_rss_mb": probe.server_rss() / MB,
                    "tree_rss_mb": probe.tree_rss() / MB,
                    "store_mb": directory_bytes(state["run"] / "store") / MB,
                    "elapsed_seconds": time.perf_counter() - state["started"],
                }
            )

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        config = ExperimentConfig.from_run_config(overrides)
        outcome = train_federated(grid, config, log=log)
        if config.unlearn_targets:
            run_unlearning(grid, outcome, log=log)
        state["outcome"] = outcome
        # the store's SQLite connection belongs to this (the ServerApp's) thread
        state["retained_rounds"] = outcome.store.rounds() if outcome.store else []

    return app, state


def server_slope(table: pd.DataFrame, skip: int) -> tuple[float, float]:
    """Least-squares slope (MB per round) of the server's RSS and of the store over the training
    rounds after the first ``skip`` (allocator and import warm-up)."""
    training = table[(table["phase"] == "training") & (table["round"] > skip)]
    if len(training) < 2:
        return float("nan"), float("nan")
    rss = np.polyfit(training["round"], training["server_rss_mb"], 1)[0]
    store = np.polyfit(training["round"], training["store_mb"], 1)[0]
    return float(rss), float(store)


def plot(table: pd.DataFrame, path: Path, title: str) -> None:
    training = table[table["phase"] == "training"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(training["round"], training["server_rss_mb"], marker="o", ms=3, label="ServerApp RSS")
    ax.plot(training["round"], training["tree_rss_mb"], marker="s", ms=3, label="process tree RSS")
    ax.plot(training["round"], training["store_mb"], ls="--", label="store on disk")
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
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1, help="Ray CPUs")
    parser.add_argument("--ray-address", help="an existing Ray cluster (default: start one)")
    parser.add_argument("--warmup-rounds", type=int, default=5, help="rounds left out of the slope")
    args = parser.parse_args(argv)
    for name in ("clients", "rounds", "num_cpus"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        import psutil  # noqa: F401
    except ImportError:
        parser.error('psutil is needed to sample memory: pip install -e ".[bench]"')

    import warnings

    from flwr.simulation import run_simulation

    from clients.client_app import create_client_app

    output = args.output_dir.resolve()
    output.mkdir(parents=True, exist_ok=True)
    overrides = {
        "dataset": "digits",
        "num-clients": args.clients,
        "rounds": args.rounds,
        "local-epochs": 1,
        "retain": not args.no_retain,
        "retain-interval": 1,
        "unlearn-clients": "" if args.no_retain else args.unlearn,
        "unlearn-methods": "federaser" if args.unlearn else "federaser,fedaccum,fedretrain",
        "output-dir": str(output),
        "run-name": f"scale-{args.clients}{'-no-retain' if args.no_retain else ''}-"
        f"{time.strftime('%Y%m%d-%H%M%S')}",
        "node-wait-seconds": 600.0,
    }
    init_args = {"address": args.ray_address} if args.ray_address else {"num_cpus": args.num_cpus}
    rows: list[dict] = []
    with MemoryProbe() as probe:
        app, state = server_app_with_probe(overrides, probe, rows)
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(
                server_app=app,
                client_app=create_client_app(overrides),
                num_supernodes=args.clients,
                backend_config={
                    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                    "init_args": init_args,
                },
            )
        seconds = time.perf_counter() - started
    if "outcome" not in state:
        print("the run did not finish; see the log above", file=sys.stderr)
        return 1
    outcome = state["outcome"]
    table = pd.DataFrame(rows)
    rss_slope, store_slope = server_slope(table, args.warmup_rounds)
    store_bytes = directory_bytes(outcome.run.store_path)
    training = table[table["phase"] == "training"]
    summary = {
        "clients": args.clients,
        "rounds": args.rounds,
        "retain": not args.no_retain,
        "retained_rounds": len(state["retained_rounds"]),
        "seconds": round(seconds, 1),
        "server_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tree_peak_rss_mb": probe.tree_peak / MB,
        "store_bytes_after_training": int(training["store_mb"].iloc[-1] * MB),
        "store_bytes_after_unlearning": store_bytes,
        "server_rss_slope_mb_per_round": rss_slope,
        "store_growth_mb_per_round": store_slope,
        "server_rss_growth_over_store_growth": rss_slope / store_slope if store_slope > 0 else None,
        "run_directory": str(outcome.run.path),
        "ray_address": args.ray_address or "",
    }
    (output / "scale_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table.to_csv(output / "scale.csv", index=False)
    (output / "scale.md").write_text(table.to_markdown(index=False, floatfmt=".1f") + "\n")
    plot(
        table,
        output / "scale.png",
        f"digits, {args.clients} clients, "
        + ("no retention" if args.no_retain else "Δt = 1: memory vs retained history"),
    )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
