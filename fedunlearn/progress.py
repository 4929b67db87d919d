"""Progress of long work (rounds, methods, federations) with an ETA, as one line a log can carry.

The ServerApp runs in the SuperLink's process under ``flwr run``: its standard error is never a
terminal, so it cannot draw a progress bar. It logs one :class:`ProgressLine` now and then instead,
readable as it is::

    progress: training 7/20 rounds, elapsed 0:21, ETA 0:39

and ``fedunlearn-run``, which owns the user's terminal, parses each such line back
(:func:`parse_progress`) and draws it as a bar (:mod:`simulations.progress_display`).

The ETA is the mean time per step so far times the steps left: never negative, unknown (``?``)
before the first step of this session, 0 once every step is done.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds between two lines of one task; its start, first step and last step are always logged.
MIN_INTERVAL = 2.0

_LINE = re.compile(
    r"^(?:\[fedunlearn\] )?progress: (?P<task>\S.*?) (?P<done>\d+)/(?P<total>\d+) (?P<unit>[\w-]+), "
    r"elapsed (?P<elapsed>\d+(?::\d\d){1,2}), ETA (?P<eta>\d+(?::\d\d){1,2}|\?)$"
)


def format_duration(seconds: float) -> str:
    """``seconds`` as ``M:SS`` or, from an hour on, ``H:MM:SS`` (rounded down to the second)."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def parse_duration(text: str) -> float:
    """The seconds of a :func:`format_duration` text (``M:SS`` or ``H:MM:SS``)."""
    seconds = 0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return float(seconds)


def eta_seconds(done: int, total: int, elapsed: float, initial: int = 0) -> float | None:
    """Seconds left at the mean pace of the steps done since ``initial`` (a resumed task's first
    count) in ``elapsed`` seconds; None before the first of them, 0 when ``done`` >= ``total``."""
    if done >= total:
        return 0.0
    if done <= initial:
        return None
    return max(0.0, elapsed) / (done - initial) * (total - done)


@dataclass(frozen=True)
class ProgressLine:
    """One report of a task: ``done`` of ``total`` ``unit``, seconds ``elapsed`` and ``eta``
    (None: unknown yet)."""

    task: str
    done: int
    total: int
    unit: str
    elapsed: float
    eta: float | None

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def format(self) -> str:
        """The line as logged: ``progress: TASK DONE/TOTAL UNIT, elapsed M:SS, ETA M:SS``; the
        elapsed time rounded down, the ETA up (a task not done never says 0:00 left, unless its
        steps take no measurable time)."""
        eta = "?" if self.eta is None else format_duration(math.ceil(self.eta))
        return (
            f"progress: {self.task} {self.done}/{self.total} {self.unit}, "
            f"elapsed {format_duration(self.elapsed)}, ETA {eta}"
        )


def parse_progress(text: str) -> ProgressLine | None:
    """The :class:`ProgressLine` that ``text`` (one line, a ``[fedunlearn] `` prefix allowed)
    holds, or None when it is no progress line."""
    found = _LINE.match(text.rstrip("\r\n"))
    if found is None:
        return None
    eta = found["eta"]
    return ProgressLine(
        task=found["task"],
        done=int(found["done"]),
        total=int(found["total"]),
        unit=found["unit"],
        elapsed=parse_duration(found["elapsed"]),
        eta=None if eta == "?" else parse_duration(eta),
    )


class Progress:
    """A task of ``total`` steps that logs its :class:`ProgressLine` at a modest rate: when it
    starts, after its first step, at most every ``min_interval`` seconds after that, and at its
    last step.

    Parameters
    ----------
    task : str
        What is counted (``"training"``, ``"unlearning"``, ``"fedretrain"``).
    total : int
        Steps in all (>= 0).
    unit : str (default: "rounds")
        The steps' name, one word.
    log : callable or None (default: None)
        Where the lines go (the ServerApp's log); None logs nothing.
    initial : int (default: 0)
        Steps already done (a resumed training's rounds): the ETA counts the pace of the others.
    min_interval : float (default: :data:`MIN_INTERVAL`)
        Seconds between two lines.
    clock : callable (default: time.monotonic)
        Seconds since an arbitrary origin (a test's fake clock).
    """

    def __init__(
        self,
        task: str,
        total: int,
        *,
        unit: str = "rounds",
        log: Callable[[str], None] | None = None,
        initial: int = 0,
        min_interval: float = MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 0 or not 0 <= initial <= total:
            raise ValueError(f"need 0 <= initial <= total, got initial {initial}, total {total}")
        self.task, self.total, self.unit, self.log = task, total, unit, log
        self.initial = self.done = initial
        self.min_interval, self.clock = min_interval, clock
        self.started = clock()
        self._last_logged: float | None = None

    def elapsed(self) -> float:
        return max(0.0, self.clock() - self.started)

    def line(self) -> ProgressLine:
        """The task now."""
        elapsed = self.elapsed()
        eta = eta_seconds(self.done, self.total, elapsed, self.initial)
        return ProgressLine(self.task, self.done, self.total, self.unit, elapsed, eta)

    def start(self) -> Progress:
        """Log the task's first line (0 steps done); returns the task."""
        self._emit()
        return self

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` more done (never past ``total``) and log the line when it is due."""
        self.done = min(self.total, self.done + steps)
        now = self.clock()
        due = self._last_logged is None or now - self._last_logged >= self.min_interval
        if due or self.done >= self.total or self.done == self.initial + 1:
            self._emit()

    def finish(self) -> None:
        """Count every step done (some were skipped: a retained round nobody remained in) and log
        the last line, unless :meth:`advance` already did."""
        if self.done < self.total:
            self.advance(self.total - self.done)

    def _emit(self) -> None:
        self._last_logged = self.clock()
        if self.log is not None:
            self.log(self.line().format())
