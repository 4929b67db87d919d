"""Durable, private file I/O for everything fedunlearn writes under a run directory.

Three invariants, kept here once so that no writer needs its own copy:

* **Atomic files.** :func:`atomic_write_bytes` writes a fsynced temporary file and renames it into
  place, then fsyncs the folder: a reader (or a crash) sees the old bytes or the new, never half.
  :func:`atomic_write_json` is the same for a JSON document.
* **Append-only logs that survive a crash mid-append.** :func:`append_jsonl` writes one JSON record
  per line with a single ``write`` and fsyncs it; a record exists once its newline is on disk. A crash
  can leave at most one torn last line, one without its newline; :func:`read_jsonl` skips it (with a
  :class:`TornLineWarning` naming the file) and the next :func:`append_jsonl` cuts it off first, so a
  new record never merges into it. Each log is a hash chain from a genesis seal that names the run
  and the file (:class:`_Chain`, sealed by :mod:`fedunlearn.store.sealing`): any complete line that
  is not the next record of the chain (damaged, edited, removed, reordered, copied from another log
  or run, or a whole line of garbage) is not a crash's doing, and :class:`LogCorruptionError` names
  the file and the line. A writer that must undo its own append (a transaction that failed after
  it) takes :func:`log_size` before and hands it to :func:`truncate_log`.
* **Least privilege.** Files are created ``0600`` and folders ``0700`` whatever the process umask
  (``fchmod``/``chmod`` after creation, since a umask can only take bits away, and a umask like
  ``0o277`` would otherwise leave a folder its owner cannot write to).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fedunlearn.errors import FedUnlearnError

try:
    import fcntl
except ImportError:  # no advisory locks on Windows: concurrent appends are then the caller's care
    fcntl = None

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIRECTORY_MODE = 0o700


class LogCorruptionError(FedUnlearnError, ValueError):
    """A complete line of an append-only JSON-lines log is not the record its place demands (not
    JSON, or edited, removed, reordered or copied from elsewhere: it breaks the log's chain)."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        self.path, self.line = Path(path), line
        super().__init__(
            f"{path}, line {line}: {reason}; only a last line without its newline can be torn by "
            "a crash, so this line was damaged or edited - restore the file from a backup"
        )


class TornLineWarning(UserWarning):
    """A JSON-lines log ended with a torn line (a crash mid-append); it was skipped or cut off."""


def _set_mode(descriptor: int, mode: int) -> None:
    if hasattr(os, "fchmod"):  # os.fchmod is POSIX-only before Python 3.13
        os.fchmod(descriptor, mode)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename, creation or unlink in ``directory`` durable (its entry reaches the disk)."""
    if os.name == "nt":  # folders cannot be opened for fsync on Windows
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def private_directory(path: str | os.PathLike) -> Path:
    """Create ``path`` and its missing parents with mode 0700; an existing folder is left as is."""
    target = path = Path(path)
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIRECTORY_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # created meanwhile by another process: its mode is that process's choice
        os.chmod(folder, PRIVATE_DIRECTORY_MODE)
    return target


def open_private_file(path: str | os.PathLike, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """``os.open`` that creates ``path`` with mode 0600 (and tightens an existing one to 0600)."""
    descriptor = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
    try:
        _set_mode(descriptor, PRIVATE_FILE_MODE)
    except PermissionError:
        pass  # another user's file (a new one is always ours): its mode is its owner's to set
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes, *, sync_directory: bool = True
) -> None:
    """Write ``data`` to ``path`` (mode 0600) so that ``path`` holds either the old or the new bytes,
    never half; missing parent folders are created 0700.

    ``sync_directory=False`` leaves the folder's fsync (which makes the rename durable) to a caller
    that writes many files into one folder and fsyncs it once before it relies on them.
    """
    path = Path(path)
    private_directory(path.parent)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            _set_mode(handle.fileno(), PRIVATE_FILE_MODE)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if sync_directory:
        fsync_directory(path.parent)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """:func:`atomic_write_bytes` of ``obj`` as indented JSON with sorted keys and a final newline;
    values JSON cannot encode are written as ``str``."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    return Path(path)


def json_loads(text: str | bytes) -> Any:
    """:func:`json.loads`, where a nesting too deep for Python's parser (``RecursionError``, e.g.
    a file of 100,000 ``[``) is a ``ValueError`` like every other undecodable text: every JSON
    file this project reads is untrusted input."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


# ---------------------------------------------------------------------- digests
def json_sha256(value: Any) -> str:
    """sha256 of ``value``'s canonical JSON (sorted keys, no spaces): the digest of a record of a
    log written before chains, and of the request journal."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def log_size(path: str | os.PathLike) -> int:
    """The size of an append-only log now (-1: it does not exist), for :func:`truncate_log`."""
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return -1


def truncate_log(path: str | os.PathLike, size: int) -> None:
    """Give an append-only log back the bytes it had when :func:`log_size` returned ``size`` (cutting
    it to that length undoes every later append; ``-1`` removes a log that did not exist), durably."""
    path = Path(path)
    if size < 0:
        if path.exists():
            path.unlink()
            fsync_directory(path.parent)
        return
    if path.is_file() and path.stat().st_size > size:
        with open(path, "r+b") as handle:
            handle.truncate(size)
            handle.flush()
            os.fsync(handle.fileno())
