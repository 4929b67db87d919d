"""What ``fedunlearn-run`` does with a running run's output and with Ctrl-C: the lines of ``flwr
run --stream`` or of the local engine (:mod:`simulations.local_launch`) are filtered
(:class:`simulations.console.ConsoleFilter`) and drawn (:class:`simulations.progress_display.ProgressDisplay`)
as they come; Ctrl-C ends the command, asks the run directory to stop, stops a run left on the
SuperLink and prints the command that continues the run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, MutableSequence, Sequence
from pathlib import Path
from typing import TextIO

from fedunlearn.progress import parse_progress
from simulations.console import ConsoleFilter, strip_ansi
from simulations.progress_display import ProgressDisplay, bars_wanted

#: The exit status after Ctrl-C (128 + SIGINT), as a shell reports an interrupted command.
INTERRUPTED = 130


class RunInterrupted(Exception):
    """Ctrl-C during a run: the run id and run directory seen so far (None when not yet)."""

    def __init__(self, run_id: str | None, run_directory: str | None):
        super().__init__(run_id)
        self.run_id, self.run_directory = run_id, run_directory


def stream_run(
    command: Sequence[str],
    env: Mapping[str, str],
    console: ConsoleFilter,
    out: TextIO,
    seen: MutableSequence[str] | None = None,
    display: ProgressDisplay | None = None,
) -> tuple[int, str | None]:
    """Run ``command`` (``flwr run --stream``), copy what ``console`` lets through to ``out`` as it
    comes (and every line, without colour codes, to ``seen``); returns its exit status and the run
    id it announced (None if it did not). The app's progress lines go to ``display`` (default:
    bars when standard error is a terminal, :func:`bars_wanted`). Ctrl-C ends the command and
    raises :class:`RunInterrupted`."""
    process = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env)
    )
    return stream_process(process, console, out, seen, display)


def stream_process(
    process,
    console: ConsoleFilter,
    out: TextIO,
    seen: MutableSequence[str] | None = None,
    display: ProgressDisplay | None = None,
) -> tuple[int, str | None]:
    """:func:`stream_run` for a started ``process`` (``stdout``: its text lines; ``terminate``,
    ``wait``): ``flwr run``, or the local engine (:mod:`simulations.local_launch`)."""
    if display is None:
        display = ProgressDisplay(out, bars=bars_wanted(sys.stderr))
    try:
        return _stream_lines(process, console, display, seen)
    finally:
        display.close()


def _stream_lines(process, console: ConsoleFilter, display: ProgressDisplay, seen):
    """:func:`stream_run`'s loop over the lines of ``process``."""
    run_id = run_directory = None
    assert process.stdout is not None
    try:
        for line in process.stdout:
            # anchored, first one only: a client's printed line must not name another run
            plain = strip_ansi(line).rstrip()
            if seen is not None:
                seen.append(plain)
            match = re.match(r"Successfully started run (\d+)$", plain)
            run_id = run_id or (match.group(1) if match else None)
            found = re.match(r"\[fedunlearn\] run directory: (.+)$", plain)
            run_directory = run_directory or (found.group(1) if found else None)
            progress = parse_progress(plain)
            if progress is not None:
                display.update(progress, plain)
                continue
            shown = console(line)
            if shown is not None:
                display.write(shown)
        display.close()
        display.write(console.finish())
    except KeyboardInterrupt:
        process.terminate()
        process.wait()
        raise RunInterrupted(run_id, run_directory) from None
    return process.wait(), run_id


def _without_run_location(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--output-dir DIR``, ``--set run-name=...`` and ``--set resume=...`` (the
    resume command names the run itself)."""
    kept, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        following = argv[i + 1] if i + 1 < len(argv) else ""
        if arg == "--output-dir" or (
            arg == "--set" and following.split("=")[0].strip() in ("run-name", "resume")
        ):
            skip = True
            continue
        if not arg.startswith("--output-dir=") and arg != "--dry-run":
            kept.append(arg)
    return kept


def stop_interrupted(
    interrupted: RunInterrupted, argv: Sequence[str], env: Mapping[str, str]
) -> int:
    """Stop the run Ctrl-C left on the SuperLink (``flwr stop``), say how to continue it, and
    return 130 (the shell's status for an interrupted command)."""
    if interrupted.run_id is None:
        print("\nfedunlearn-run: interrupted before the run started", file=sys.stderr)
        return INTERRUPTED
    if interrupted.run_directory:
        from fedunlearn.store.run_directory import request_stop

        request_stop(Path(interrupted.run_directory))  # training stops after its current round
    stop = subprocess.run(
        ["flwr", "stop", interrupted.run_id], capture_output=True, text=True, env=dict(env)
    )
    said = "stopped" if stop.returncode == 0 else f"could not stop (flwr stop {interrupted.run_id})"
    print(f"\nfedunlearn-run: interrupted: {said} run {interrupted.run_id}", file=sys.stderr)
    say_continue(interrupted.run_directory, argv)
    return INTERRUPTED


def say_continue(run_directory: str | None, argv: Sequence[str]) -> None:
    """Print the command that continues an interrupted run (nothing before its run directory
    existed)."""
    if run_directory:
        folder = Path(run_directory)
        again = _without_run_location(argv)
        again += ["--output-dir", str(folder.parent), "--set", f"run-name={folder.name}"]
        again += ["--set", "resume=true"]
        print(
            f"fedunlearn-run: continue it with: fedunlearn-run {shlex.join(again)}", file=sys.stderr
        )
