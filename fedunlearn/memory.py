"""Resident memory (RSS) of this process, recorded with every round's metrics.

The server keeps FedEraser's retained history on disk (:mod:`fedunlearn.store.update_store`), so its
memory must not grow with the number of retained rounds; ``metrics.csv`` shows it round by round,
after :func:`release_free_memory` has returned what the allocator kept of the round's replies.
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


def _glibc_malloc_trim():
    """glibc's ``malloc_trim``, or ``None`` where the C library is not glibc (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _glibc_malloc_trim()


def release_free_memory() -> bool:
    """Hand the heap pages the process has freed back to the OS (glibc ``malloc_trim(0)``);
    returns whether it could.

    A round's replies are about K model-sized buffers, decoded on Flower's threads and freed on
    the server's: glibc keeps such freed memory in its per-thread arenas, so without this the
    ServerApp's RSS climbs round after round by what the allocator kept, not by anything live
    (measured with 1,000 MNIST clients: +200 MiB a round over the first five). Called after every
    round, it makes the RSS in ``metrics.csv`` measure what the server holds.
    """
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


def take_interval_peak_rss_bytes() -> int | None:
    """This process's peak RSS since the last call (Linux: ``VmHWM`` of ``/proc/self/status``,
    then reset by writing 5 to ``/proc/self/clear_refs``); ``None`` where either is unavailable.

    What a round or an unlearning step needed at its worst, not the run's peak so far
    (:func:`peak_rss_bytes`): the figure that shows whether the server's memory within a round
    grows with the number of clients.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("VmHWM:"))
        peak = int(line.split()[1]) * 1024
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return peak
