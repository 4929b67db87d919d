"""The main job launched again and again on a busy machine: does it start, does it finish?

Holds the machine at ``--load`` busy processes (:mod:`simulations.benchmarks.load`, not niced by
default) and runs ``fedunlearn-run CONFIG --output-dir OUT/runs/run-N`` (a fresh output folder
each time) ``--runs`` times, one after another, each through ``--wrap`` when given (e.g. a script
that gives the run its own network namespace and ``FLWR_HOME``, so that a SuperLink of someone
else's on the machine is not used). For each run it records whether the run started (Flower
announced a run and the ServerApp made its run directory), whether it finished (exit 0 and the
results line), its wall time, the attempts ``fedunlearn-run`` retried (its "trying again" lines),
its exit status and the load average when it started. It stops starting new runs once
``--budget`` seconds have passed (the table says how many ran).

Writes ``launch_under_load.csv`` and ``launch_under_load.md`` in ``--output-dir`` after every run,
and each run's output in ``logs/run-N.log``.

Usage (the main job takes about 1.5 minutes on an idle 2-core machine, several under load 8)::

    FEDUNLEARN_DATA_ROOT=PATH python -m simulations.benchmarks.launch_under_load --runs 10 \\
        --load 8 --output-dir simulations/benchmarks/results/launch_under_load
"""

from __future__ import annotations

import argparse
import csv
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from simulations.benchmarks.load import busy, load_average
from simulations.run_parser import PROJECT_ROOT

COLUMNS = ["run", "started", "finished", "seconds", "retries", "exit_code", "load_at_start"]
STARTED = re.compile(r"^\[fedunlearn\] run directory: ", re.M)
FINISHED = re.compile(r"^\[fedunlearn\] results in ", re.M)
RETRY = re.compile(r"^fedunlearn-run: .* did not start; trying again", re.M)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.benchmarks.launch_under_load",
        description=__doc__.split("\n")[0],
    )
    parser.add_argument("--runs", type=int, default=10, help="runs of the main job (default 10)")
    parser.add_argument("--load", type=int, default=8, help="busy processes beside them (8)")
    parser.add_argument("--nice", type=int, default=0, help="their niceness (0: not niced)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of load first (60)")
    parser.add_argument(
        "--same-session", action="store_true", help="the spinners in one session (a lighter load)"
    )
    parser.add_argument("--budget", type=float, default=3000.0, help="start no run after (s)")
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "simulations" / "digits.toml")
    parser.add_argument(
        "--launcher",
        default=str(Path(sys.executable).parent / "fedunlearn-run"),
        help="the fedunlearn-run to start (default: this environment's)",
    )
    parser.add_argument("--wrap", default="", help="a command to run each launch through")
    parser.add_argument("--output-dir", type=Path, required=True)
    return parser


def one_run(args: argparse.Namespace, number: int) -> dict:
    """Run the main job once; its row of the table."""
    out = args.output_dir / "runs" / f"run-{number}"
    command = [*shlex.split(args.wrap), args.launcher, str(args.config), "--output-dir", str(out)]
    log = args.output_dir / "logs" / f"run-{number}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    load, start = load_average(), time.monotonic()
    with log.open("w", encoding="utf-8") as file:
        code = subprocess.call(command, stdout=file, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    return {
        "run": number,
        "started": bool(STARTED.search(text)),
        "finished": code == 0 and bool(FINISHED.search(text)),
        "seconds": round(seconds, 1),
        "retries": len(RETRY.findall(text)),
        "exit_code": code,
        "load_at_start": round(load, 1),
    }


def write_tables(rows: list[dict], args: argparse.Namespace) -> str:
    """Write the CSV and the markdown table; returns the markdown."""
    with (args.output_dir / "launch_under_load.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    started = sum(r["started"] for r in rows)
    finished = sum(r["finished"] for r in rows)
    lines = [
        f"Load: {args.load} busy processes (nice {args.nice}, "
        f"{'one session' if getattr(args, 'same_session', False) else 'a session each'}); "
        f"{len(rows)} of {args.runs} runs "
        f"made; {started} of {len(rows)} started, {finished} of {len(rows)} finished.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows),
    ]
    text = "\n".join(lines) + "\n"
    (args.output_dir / "launch_under_load.md").write_text(text, encoding="utf-8")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with busy(args.load, args.nice, args.warmup, not args.same_session):
        began = time.monotonic()
        for number in range(1, args.runs + 1):
            if time.monotonic() - began > args.budget:
                break
            rows.append(one_run(args, number))
            print(rows[-1], flush=True)
            write_tables(rows, args)
    print(write_tables(rows, args), end="")
    return 0 if rows and all(r["finished"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
