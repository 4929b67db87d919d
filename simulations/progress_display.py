"""How ``fedunlearn-run`` shows the ServerApp's progress lines (:mod:`fedunlearn.progress`).

The ServerApp cannot draw a bar (its output is Flower's log stream, never a terminal); the launcher
owns the user's terminal, so it draws one: a tqdm bar per running task on standard error, an inner
task (FedRetrain's rounds) under the outer one (the request's methods), each gone when its task is
done, with the ServerApp's own elapsed time and ETA. Our other lines are printed above the bars.

Without a terminal (a log file, CI) there are no bars: a task's progress line is printed as it
came, its first one with an ETA and then at most one every :data:`PLAIN_INTERVAL` seconds of the
task, so that a log stays readable. ``FEDUNLEARN_PROGRESS=0`` turns the bars off on a terminal too,
``FEDUNLEARN_PROGRESS=1`` draws them anywhere.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from fedunlearn.progress import ProgressLine, format_duration

#: The environment variable that turns the bars off (``0``) or on (``1``) whatever the output.
PROGRESS_ENV = "FEDUNLEARN_PROGRESS"
#: Seconds of a task between two of its plain progress lines (no terminal).
PLAIN_INTERVAL = 30.0
#: tqdm puts ", " before a postfix: "7/20 rounds, elapsed 0:21, ETA 0:39".
#: (columns, lines) where the terminal reports no size.
FALLBACK_SIZE = (100, 24)
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit}{postfix}"


def _width(stream: TextIO) -> dict[str, Any]:
    """tqdm's width settings for ``stream``: the terminal's, followed as it is resized; else
    (a terminal that reports no size, as a pseudo-terminal opened without one does, on which tqdm
    would draw nothing) :data:`FALLBACK_SIZE`."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        size = os.terminal_size((0, 0))
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    return dict(zip(("ncols", "nrows"), FALLBACK_SIZE, strict=True))


def bars_wanted(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether to draw bars on ``stream``: :data:`PROGRESS_ENV` when it says ``0`` or ``1``, else
    whether ``stream`` is a terminal."""
    environ = os.environ if environ is None else environ
    setting = environ.get(PROGRESS_ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressDisplay:
    """The launcher's output: our lines (:meth:`write`) and the progress of each task
    (:meth:`update`), as bars or as plain lines.

    Parameters
    ----------
    out : TextIO
        Where our lines go (standard output).
    bars : bool
        Draw bars (see :func:`bars_wanted`); else print progress lines now and then.
    bar_file : TextIO or None (default: None)
        Where the bars are drawn; None: standard error.
    """

    def __init__(self, out: TextIO, *, bars: bool, bar_file: TextIO | None = None) -> None:
        self.out, self.bars = out, bars
        self.bar_file = bar_file if bar_file is not None else sys.stderr
        self._open: dict[str, Any] = {}  # task -> its tqdm bar, outermost first
        self._printed: dict[str, float] = {}  # task -> elapsed seconds of its last plain line

    def update(self, line: ProgressLine, text: str) -> None:
        """Show the progress ``line`` (``text``: as it came)."""
        if self.bars:
            self._draw(line)
        elif self._plain_due(line):
            self.write(text if text.endswith("\n") else text + "\n")

    def write(self, text: str) -> None:
        """Print ``text`` above the bars."""
        for bar in self._open.values():
            bar.clear()
        self.out.write(text)
        self.out.flush()
        for bar in self._open.values():
            bar.refresh()

    def close(self) -> None:
        """Remove every bar still drawn (the stream ended)."""
        for task in reversed(list(self._open)):
            self._open.pop(task).close()

    def _plain_due(self, line: ProgressLine) -> bool:
        last = self._printed.get(line.task)
        if line.eta is None or line.finished:
            if line.done == 0 or line.finished:
                self._printed.pop(line.task, None)  # a task that starts (again) or ends
            return False
        if last is not None and last <= line.elapsed < last + PLAIN_INTERVAL:
            return False
        self._printed[line.task] = line.elapsed
        return True

    def _draw(self, line: ProgressLine) -> None:
        from tqdm import tqdm  # the launcher's only use of it

        tasks = list(self._open)
        if line.task in tasks:  # inner tasks left unfinished (a method refused) are over
            for task in reversed(tasks[tasks.index(line.task) + 1 :]):
                self._open.pop(task).close()
        eta = "?" if line.eta is None else format_duration(math.ceil(line.eta))
        postfix = f"elapsed {format_duration(line.elapsed)}, ETA {eta}"
        bar = self._open.get(line.task)
        if bar is None:
            bar = tqdm(
                total=line.total,
                initial=line.done,
                postfix=postfix,
                desc=line.task,
                unit=line.unit,
                position=len(self._open),
                leave=False,
                file=self.bar_file,
                bar_format=BAR_FORMAT,
                **_width(self.bar_file),
            )
            self._open[line.task] = bar
        bar.total, bar.n = line.total, line.done
        bar.set_postfix_str(postfix, refresh=False)
        bar.refresh()
        if line.finished:
            self._open.pop(line.task).close()
