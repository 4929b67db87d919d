"""``flwr run``, tried again while what it needs is still starting: the local SuperLink and Ray.

On a busy machine the first ``flwr run`` may find no SuperLink (Flower's own probe gives up after
0.4 s and its own start after 15 s: "Failed to start local SuperLink"), or the simulation runtime's
Ray may not start its raylet within Ray's fixed 30 s ("The current node timed out during
startup"). Neither has trained or written anything: :func:`run_until_started` makes sure the
SuperLink is up (:func:`simulations.local_superlink.ensure_local_superlink`), runs the command, and
tries again, up to :data:`MAX_ATTEMPTS` times within the start timeout, when an attempt failed so.
A run that announced its run directory is never tried again (it may have written files). When it
gives up, :class:`~simulations.local_superlink.StartFailure` says what did not start, how long it
was given, the machine's load and what to do.
"""

from __future__ import annotations

import re
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from simulations.local_superlink import StartFailure, give_up_hint

#: The most times ``flwr run`` is started for one launch.
MAX_ATTEMPTS = 4
#: The lines of an attempt kept to judge why it failed.
KEPT_LINES = 400
#: Flower's words when it found no local SuperLink to talk to, or could not start one.
SUPERLINK_NOT_STARTED = re.compile(
    r"Failed to start local SuperLink|Unable to launch `flower-superlink`"
    r"|failed to connect to all addresses|StatusCode\.UNAVAILABLE"
)
#: Ray's words when it did not start in the simulation runtime (raylet, GCS, its workers).
RAY_NOT_STARTED = re.compile(
    r"timed out during startup|Failed to (start|connect to) (the )?GCS"
    r"|Timed out after \d+ seconds while waiting for node to startup"
    r"|raylet (failed|died|has died)|Failed to register worker"
)
#: Our line once the ServerApp made the run directory: from then on a run is not tried again.
RUN_DIRECTORY_LINE = re.compile(r"^\[fedunlearn\] run directory: ")


@dataclass
class Outcome:
    """The last attempt: ``flwr run``'s exit status, the run id it announced, the console that
    filtered its lines, the run's status from the SuperLink (None when not asked), and the number
    of attempts made."""

    code: int
    run_id: str | None
    console: Any
    status: tuple[str, str] | None
    attempts: int


def start_problem(lines: Sequence[str], run_id: str | None, status: tuple[str, str] | None) -> str:
    """What did not start ("the local SuperLink", "Ray") when an attempt that printed ``lines``
    (plain text) failed because of it; "" when it failed otherwise, succeeded, or may have written
    a run directory."""
    if any(RUN_DIRECTORY_LINE.match(line) for line in lines):
        return ""
    if status is not None and status[0] == "finished:completed":
        return ""
    text = "\n".join(lines) + ("\n" + status[1] if status else "")
    if run_id is None and SUPERLINK_NOT_STARTED.search(text):
        return "the local SuperLink"
    if RAY_NOT_STARTED.search(text):
        return "Ray"
    return ""


def run_until_started(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float,
    stream: Callable[..., tuple[int, str | None]],
    status: Callable[[str, Mapping[str, str]], tuple[str, str]],
    ensure: Callable[..., Any],
    new_console: Callable[[], Any],
    out: TextIO,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Run ``command`` with ``stream`` (:func:`simulations.run.stream_run`) once the local
    SuperLink is up (``ensure``), again while an attempt failed because the SuperLink or Ray did
    not start, within ``timeout`` seconds of starting and :data:`MAX_ATTEMPTS` attempts; ``status``
    asks the SuperLink how a run ended. Raises :class:`StartFailure` when it gives up."""
    deadline = clock() + timeout
    for number in range(1, MAX_ATTEMPTS + 1):
        local = ensure(env, max(deadline - clock(), 1.0))  # None: not a local connection
        console, lines = new_console(), deque(maxlen=KEPT_LINES)
        code, run_id = stream(command, env, console, out, lines)
        asked = run_id is not None and code == 0 and getattr(console, "error", None) is None
        state = status(run_id, env) if asked else None
        cause = start_problem(lines, run_id, state)
        if cause == "the local SuperLink" and local is None:
            cause = ""  # a deployment's SuperLink: what flwr run said stands
        if not cause:
            return Outcome(code, run_id, console, state, number)
        if number == MAX_ATTEMPTS or clock() >= deadline:
            raise StartFailure(
                f"{cause} did not start ({number} attempt(s) in {timeout:.0f} s); "
                f"{give_up_hint(timeout)}"
            )
        print(
            f"fedunlearn-run: {cause} did not start; trying again "
            f"(attempt {number + 1} of at most {MAX_ATTEMPTS})",
            file=sys.stderr,
            flush=True,
        )
    raise AssertionError("unreachable")  # pragma: no cover
