"""Resident memory (RSS) of this process, recorded with every round's metrics.

The server keeps FedEraser's retained history on disk (:mod:`fedunlearn.store.update_store`), so its
memory must not grow with the number of retained rounds; ``metrics.csv`` shows it round by round.
"""

from __future__ import annotations

import os
import sys

try:
    import resource
except ImportError:  # Windows
    resource = None

MB = 1024 * 1024


def current_rss_bytes() -> int | None:
    """This process's RSS now (Linux ``/proc/self/statm``); ``None`` where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def peak_rss_bytes() -> int | None:
    """This process's peak RSS so far (``getrusage``: kilobytes on Linux, bytes on macOS)."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def megabytes(value: int | None) -> float:
    """``value`` bytes in MiB, NaN for an unknown value (a CSV cell stays numeric)."""
    return float("nan") if value is None else round(value / MB, 1)
