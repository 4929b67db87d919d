"""Our console lines: the one ``Log`` type every phase writes through, and the heartbeat that
reports inside a long wait (a Fashion-MNIST round takes 30-40 s, a calibration longer)."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Where a phase writes its progress lines (``print`` by default; tests pass a list's ``append``).
Log = Callable[[str], None]

#: Seconds between two heartbeat lines of one wait.
HEARTBEAT_SECONDS = 10.0


def round_label(phase: str, server_round: int) -> str:
    """How a round is named in its heartbeat lines: ``round 3`` in training, else with its phase."""
    return f"round {server_round}" if phase == "train" else f"{phase} round {server_round}"


def count(n: int, noun: str) -> str:
    """``"1 client"``, ``"3 clients"``: a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Heartbeat:
    """One line at most every ``interval`` seconds while ``total`` replies are awaited, e.g.
    ``"  round 3: 7/10 clients replied, 12 s"``.

    Parameters
    ----------
    log : Log
        Where the lines go.
    label : str
        What is awaited (``"round 3"``, ``"federaser calibration, round 5"``).
    total : int
        Replies awaited.
    interval : float (default: 10)
        Seconds between two lines; the first comes ``interval`` seconds after the start.
    clock : callable (default: time.monotonic)
        Seconds since an arbitrary origin (a test's fake clock).
    """

    def __init__(
        self,
        log: Log,
        label: str,
        total: int,
        *,
        interval: float = HEARTBEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a number of seconds > 0, got {interval}")
        self.log, self.label, self.total = log, label, total
        self.interval, self.clock = interval, clock
        self.started = self.last = clock()

    def beat(self, replied: int) -> None:
        """Log ``replied``/``total`` and the seconds waited, unless a line went out less than
        ``interval`` seconds ago."""
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            waited = f"{now - self.started:.0f} s"
            if self.label.startswith("discovery"):  # Ray still starting the clients: not a failure
                self.log(
                    f"  {self.label}: waiting for {count(self.total, 'client')} to start ({replied} "
                    f"ready), {waited}"
                )
            else:
                self.log(f"  {self.label}: {replied}/{self.total} clients replied, {waited}")
