"""A load generator: ``--load N`` busy processes beside a command, for as long as it runs.

Each process spins in a pure-Python loop (one runnable task each, no memory, no I/O), so the
machine's load average climbs towards N (the one-minute average needs about a minute to get
there: ``--warmup`` waits that long before the command starts). ``--nice`` runs them at a lower
priority (0, the default, is not niced: they compete with the command as other users' jobs do).
Each runs in a session of its own (``setsid``): with Linux's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled`` = 1) the CPU is shared between sessions, so N
spinners in one session would weigh as much as one job against a SuperLink (which Flower starts in
a session of its own); ``--same-session`` keeps them in one (a lighter load at the same load average).
The processes are stopped by their ids when the command ends (or on Ctrl-C).

Usage::

    python -m simulations.benchmarks.load --load 8 --warmup 60 -- fedunlearn-run simulations/digits.toml

prints the load average before and after and exits with the command's status. Other benchmarks
use :func:`busy` (:mod:`simulations.benchmarks.launch_under_load`).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence


def _spin(nice: int, own_session: bool = True) -> None:  # pragma: no cover (in the children)
    if own_session:
        os.setsid()
    if nice:
        os.nice(nice)
    while True:
        pass


@contextlib.contextmanager
def busy(
    load: int, nice: int = 0, warmup: float = 0.0, own_sessions: bool = True
) -> Iterator[list[int]]:
    """``load`` spinning processes (niced by ``nice``, each in its own session unless
    ``own_sessions`` is false) while the block runs, after ``warmup`` seconds; yields their process
    ids, and stops them (by id) when the block ends."""
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_spin, args=(nice, own_sessions), daemon=True) for _ in range(load)
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(warmup)
        yield [worker.pid for worker in workers]
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=10)


def load_average() -> float:
    """The last minute's load average."""
    return os.getloadavg()[0]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.benchmarks.load", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--load", type=int, default=8, help="busy processes (default 8)")
    parser.add_argument("--nice", type=int, default=0, help="their niceness (default 0: not niced)")
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="seconds before the command (60)"
    )
    parser.add_argument(
        "--same-session", action="store_true", help="keep the spinners in one session (lighter)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser().error("name a command after --")
    with busy(args.load, args.nice, args.warmup, not args.same_session):
        print(
            f"load: {args.load} busy processes (nice {args.nice}), load average {load_average():.1f}",
            file=sys.stderr,
        )
        code = subprocess.call(command)
        print(
            f"load: the command exited {code}, load average {load_average():.1f}", file=sys.stderr
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
