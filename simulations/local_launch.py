"""``fedunlearn-run --engine local``: the checked run served by :mod:`simulations.local_engine`,
its lines shown as ``flwr run``'s are (:class:`simulations.console.ConsoleFilter`, the progress
bars), its exit status the run's.

Where the platform can fork (Linux) and the machine shows no GPU
(:func:`simulations.local_engine.fork_is_safe`), the engine is a fork of the launcher itself: the launcher
has already imported PyTorch and the app's modules and loaded the data to check the run, and the
engine starts from there instead of from a fresh interpreter (about 3 s of the main job on 2
cores). The engine's standard output and error go to a pipe that the launcher reads, as it reads
``flwr run``'s. Elsewhere the engine is ``python -m simulations.local_engine``, whose workers
are spawned.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import tomllib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from simulations.console import ConsoleFilter, use_color
from simulations.local_engine import fork_is_safe, serve_locally, warm_up, worker_count
from simulations.run_stream import INTERRUPTED, RunInterrupted, say_continue, stream_process


class ForkedEngine:
    """The engine in a fork of this process, with the few parts of ``subprocess.Popen`` that
    :func:`simulations.run_stream.stream_process` uses: ``stdout`` (its standard output and error, as
    text lines), ``terminate`` and ``wait``."""

    def __init__(self, serve: Callable[[], None]) -> None:
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the engine: never returns
            os.close(read_end)
            _run_forked(serve, write_end)
        os.close(write_end)
        self.stdout = os.fdopen(read_end, "r", encoding="utf-8", errors="replace")
        self.returncode: int | None = None

    def terminate(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            self.stdout.close()
        return self.returncode


def _run_forked(serve: Callable[[], None], write_end: int) -> None:
    """In the forked engine: standard output and error to the pipe, ``serve()``, then exit with
    0, or 1 and the traceback when it raised (SIGTERM ends it as Ctrl-C would)."""
    code = 1
    try:
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        # Python's own streams on the pipe, line by line, whatever this process had made of them
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGTERM, _interrupt)
        serve()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def engine_size(args: argparse.Namespace, config: ExperimentConfig) -> tuple[int, int, int]:
    """(K, worker processes, PyTorch threads per worker) for the checked run: a worker per
    ``--num-cpus`` CPUs of this machine (and ``--num-gpus`` of a GPU), at most K
    (:func:`simulations.local_engine.worker_count`). Raises :class:`ConfigError` naming
    ``--num-gpus`` when a GPU share is asked of a machine that shows none."""
    try:
        workers = worker_count(args.num_cpus, config.num_clients, num_gpus=args.num_gpus)
    except ValueError:
        raise ConfigError(
            "--num-gpus", args.num_gpus, "0 here: this machine shows no NVIDIA GPU"
        ) from None
    return config.num_clients, workers, max(1, math.floor(args.num_cpus))


def engine_line(size: tuple[int, int, int]) -> str:
    """What the launcher says before the engine of ``size`` (:func:`engine_size`) starts (the
    line ``flwr run``'s command takes)."""
    clients, workers, threads = size
    return (
        f"fedunlearn-run: local engine: {clients} clients in {workers} worker process(es), "
        f"{threads} thread(s) each; no SuperLink, no Ray"
    )


def start_engine(args: argparse.Namespace, size: tuple[int, int, int], text: str, env, tmp: str):
    """The engine of ``size`` (:func:`engine_size`) serving the checked run config ``text``: a
    fork of this process where the platform can, else a ``python -m simulations.local_engine``
    process."""
    clients, workers, threads = size
    app, gpu = args.app.resolve(), args.num_gpus > 0
    if fork_is_safe():
        overrides = tomllib.loads(text)
        # once, here, for every fork: else each worker imports PyTorch's compiler (1.1 s of CPU)
        # on its own while discovery waits for it (measured: round 1 then starts 0.4 s later)
        warm_up()
        return ForkedEngine(lambda: serve_locally(app, overrides, clients, workers, threads, gpu))
    run_config = Path(tmp) / "run-config.toml"
    run_config.write_text(text, encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "simulations.local_engine",
        *("--app", str(app), "--run-config", str(run_config)),
        *("--num-clients", str(clients), "--workers", str(workers), "--threads", str(threads)),
        *(["--gpu"] if gpu else []),
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env)
    )


def run_local(
    args: argparse.Namespace, size: tuple[int, int, int], text: str, env, out: TextIO
) -> tuple[int, object]:
    """Serve the checked run locally on an engine of ``size`` (:func:`engine_size`), its lines
    on ``out``; returns (exit status, console). Raises
    :class:`simulations.run_stream.RunInterrupted` on Ctrl-C."""
    print(engine_line(size), file=out, flush=True)
    console = ConsoleFilter(verbose=args.verbose, color=use_color(out))
    with tempfile.TemporaryDirectory() as tmp:
        process = start_engine(args, size, text, env, tmp)
        code, _ = stream_process(process, console, out)
    return code, console


def local_verdict(code: int, console, verbose: bool) -> tuple[int, str]:
    """The launcher's exit status for a local run that exited with ``code`` and why."""
    if console.error is not None:
        hint = "" if verbose else " (--verbose shows the traceback)"
        return 1, f"run failed: {console.error}{hint}"
    if code != 0:
        return (code if code > 0 else 1), f"run failed (the local engine exited with {code})"
    return 0, ""


def launch_local(
    args: argparse.Namespace, config: ExperimentConfig, text: str, argv: list[str], env
) -> int:
    """``fedunlearn-run --engine local`` once the run is checked (``argv``: as typed, for the
    continue hint; ``env``: the engine's environment when it is a process of its own):
    ``--dry-run`` says what would start; else the run, its exit status, and on Ctrl-C the
    command that continues it."""
    try:
        size = engine_size(args, config)
    except ConfigError as error:
        print(f"fedunlearn-run: error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(engine_line(size), flush=True)
        print(text, end="")
        return 0
    try:
        code, console = run_local(args, size, text, env, out=sys.stdout)
    except RunInterrupted as interrupted:
        print("\nfedunlearn-run: interrupted: the local engine stopped", file=sys.stderr)
        say_continue(interrupted.run_directory, argv)
        return INTERRUPTED
    code, said = local_verdict(code, console, args.verbose)
    if said:
        print(f"fedunlearn-run: {said}", file=sys.stderr)
    return code
