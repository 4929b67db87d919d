"""Durable, private file I/O for everything fedunlearn writes under a run directory.

Three invariants, kept here once so that no writer needs its own copy:

* **Atomic files.** :func:`atomic_write_bytes` writes a fsynced temporary file and renames it into
  place, then fsyncs the folder: a reader (or a crash) sees the old bytes or the new, never half.
  :func:`atomic_write_json` is the same for a JSON document.
* **Append-only logs that survive a crash mid-append.** :func:`append_jsonl` writes one JSON record
  per line with a single ``write`` and fsyncs it; a record exists once its newline is on disk. A crash
  can leave at most one torn last line; :func:`read_jsonl` skips it (with a :class:`TornLineWarning`
  naming the file) and the next :func:`append_jsonl` cuts it off first, so a new record never merges
  into it. A damaged line anywhere else is not a crash's doing: :class:`LogCorruptionError` names the
  file and the line. A writer that must undo its own append (a transaction that failed after it)
  takes :func:`log_size` before and hands it to :func:`truncate_log`.
* **Least privilege.** Files are created ``0600`` and folders ``0700`` whatever the process umask
  (``fchmod``/``chmod`` after creation, since a umask can only take bits away, and a umask like
  ``0o277`` would otherwise leave a folder its owner cannot write to).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedunlearn.errors import FedUnlearnError

try:
    import fcntl
except ImportError:  # no advisory locks on Windows: concurrent appends are then the caller's care
    fcntl = None

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIRECTORY_MODE = 0o700
_CHUNK = 1 << 16


class LogCorruptionError(FedUnlearnError, ValueError):
    """A line of an append-only JSON-lines log, other than a torn last line, is not a JSON record."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        self.path, self.line = Path(path), line
        super().__init__(
            f"{path}, line {line}: not a JSON record ({reason}); only the last line of an "
            "append-only log can be torn by a crash, so this line was damaged or edited - restore "
            "the file from a backup, or remove that line by hand if its record can be lost"
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


# ---------------------------------------------------------------------- JSON lines
#: The key of a log record's own digest (sha256 of its other fields' canonical JSON).
RECORD_DIGEST = "record_sha256"


class _EditedRecord(ValueError):
    """A complete log line whose fields no longer match its digest: edited, not torn."""


def json_sha256(value: Any) -> str:
    """sha256 of ``value``'s canonical JSON (sorted keys, no spaces): the digest of a log record
    and of each field of a store header's metadata."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _parse_record(raw: bytes, *, digested: bool = False) -> dict[str, Any]:
    """One log line as a JSON object (its digest checked and removed, when it has one);
    ``ValueError`` (with the reason) for anything else, :class:`_EditedRecord` for an edit, and for
    a record without a digest where one is due (``digested``: an earlier record had one, and every
    append since writes one)."""
    record = json_loads(raw.decode("utf-8"))  # UnicodeDecodeError and JSONDecodeError: ValueError
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, expected an object")
    if digested and RECORD_DIGEST not in record:
        raise _EditedRecord(
            f"a record without {RECORD_DIGEST} after records with one: its digest was removed"
        )
    if RECORD_DIGEST in record:
        recorded = record.pop(RECORD_DIGEST)
        if recorded != json_sha256(record):
            raise _EditedRecord(
                f"a record whose fields do not match its {RECORD_DIGEST}: edited or damaged"
            )
    return record


def _last_newline(descriptor: int, end: int) -> int:
    """Offset of the last ``\\n`` before offset ``end`` of an open file, or -1; reads backwards."""
    while end > 0:
        start = max(0, end - _CHUNK)
        found = os.pread(descriptor, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found
        end = start
    return -1


def _torn_tail_start(descriptor: int) -> int:
    """Length of the log prefix that :func:`read_jsonl` keeps: everything up to a torn last line
    (one without its newline, or newline-terminated but unparsable); the file size if none."""
    size = os.fstat(descriptor).st_size
    if size == 0:
        return 0
    newline = _last_newline(descriptor, size)
    if newline != size - 1:  # the last line has no newline: a crash cut the append short
        return newline + 1
    start = _last_newline(descriptor, size - 1) + 1
    raw = os.pread(descriptor, size - 1 - start, start)
    if raw.strip():
        try:
            _parse_record(raw)
        except _EditedRecord:
            return size  # a whole line, edited: never cut off (reading it raises)
        except ValueError:
            return start
    return size


def _warn_torn(path: Path, size: int, action: str) -> None:
    warnings.warn(
        f"{path}: {action} a torn last line ({size} byte(s), not a complete JSON record: "
        "what a crash in the middle of an append leaves behind)",
        TornLineWarning,
        stacklevel=3,
    )


def append_jsonl(path: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Append ``record`` as one JSON line to ``path`` (created 0600) and fsync it.

    A torn last line left by an earlier crash is cut off first (with a :class:`TornLineWarning`),
    so the new record starts on a line of its own. Values JSON cannot encode are written as ``str``.
    """
    path = Path(path)
    fields = json.loads(json.dumps(dict(record), default=str))  # as a reader will see them
    fields.pop(RECORD_DIGEST, None)
    fields[RECORD_DIGEST] = json_sha256(fields)
    line = (json.dumps(fields, sort_keys=True) + "\n").encode("utf-8")
    private_directory(path.parent)
    created = not path.exists()
    descriptor = open_private_file(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        if fcntl is not None:  # one appender at a time: cutting a tail must not race a write
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        keep, size = _torn_tail_start(descriptor), os.fstat(descriptor).st_size
        if keep < size:
            os.ftruncate(descriptor, keep)
            _warn_torn(path, size - keep, "cut off")
        written = 0
        while written < len(line):  # O_APPEND: every chunk lands at the end
            written += os.write(descriptor, line[written:])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)  # also releases the flock
    if created:
        fsync_directory(path.parent)
    return path


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSON-lines log, in order (``[]`` if the file does not exist).

    Blank lines are ignored. A torn last line is skipped with a :class:`TornLineWarning` naming
    the file; any other line that is not a JSON object raises :class:`LogCorruptionError`.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a line cut short
    records, digested = [], False
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(_parse_record(raw, digested=digested))
            digested = digested or f'"{RECORD_DIGEST}":'.encode() in raw  # the key, not a value
        except ValueError as error:
            if number == len(lines) and not tail and not isinstance(error, _EditedRecord):
                _warn_torn(path, len(raw) + 1, "skipped")
                continue
            raise LogCorruptionError(path, number, str(error)) from None
    if tail:
        _warn_torn(path, len(tail), "skipped")
    return records


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
