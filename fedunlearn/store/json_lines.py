"""Append-only JSON-lines logs: one fsynced record per line, each a link of a hash chain sealed
with the run (:mod:`fedunlearn.store.sealing`), that survive a crash mid-append.

A record exists once its newline is on disk. A crash can leave at most one torn last line, one
without its newline; :func:`read_jsonl` skips it (with a
:class:`~fedunlearn.store.durable_io.TornLineWarning` naming the file) and the next
:func:`append_jsonl` cuts it off first, so a new record never merges into it. Each log is a hash
chain from a genesis seal that names the run and the file (:class:`_Chain`): any complete line that
is not the next record of the chain (damaged, edited, removed, reordered, copied from another log or
run, or a whole line of garbage) is not a crash's doing, and
:class:`~fedunlearn.store.durable_io.LogCorruptionError` names the file and the line.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedunlearn.store.durable_io import (
    LogCorruptionError,
    TornLineWarning,
    fcntl,
    fsync_directory,
    json_loads,
    json_sha256,
    open_private_file,
    private_directory,
)
from fedunlearn.store.sealing import sealer_of

#: The key of a log record's own seal (over its other fields, the previous record's seal among them).
RECORD_DIGEST = "record_sha256"
#: The key of the seal of the record before it (the log's genesis seal for the first record).
PREVIOUS_DIGEST = "previous_sha256"


class _EditedRecord(ValueError):
    """A complete log line that is not the record its place in the chain demands: edited, not torn."""


class _Chain:
    """The hash chain of one log (``path``, sealed by ``sealer``): each record names the seal of
    the record before it (``previous_sha256``; the first one the log's **genesis**, the seal of the
    run and the file name), and its own seal (``record_sha256``) covers all its fields. No record
    (the first included) can then be removed, replaced, reordered or moved to another log or run
    without breaking the chain. A log written before chains (no ``previous_sha256``, in a folder
    without a run identity) keeps its per-record digests."""

    def __init__(self, path: Path, sealer) -> None:
        self.path, self.sealer = path, sealer
        self.place = {"file": path.name}
        self.head = self.genesis = sealer.seal({**self.place, "genesis": True}, b"")
        self.legacy = self.chained = False
        self.count = 0

    def accept(self, raw: bytes) -> dict[str, Any]:
        """The record of the next complete line, checked against the chain (and popped of its
        seals); ``ValueError`` for a line that is no JSON object, :class:`_EditedRecord` for one
        that breaks the chain."""
        record = json_loads(raw.decode("utf-8"))  # UnicodeDecodeError, JSONDecodeError: ValueError
        if not isinstance(record, dict):
            raise ValueError(f"a JSON {type(record).__name__}, expected an object")
        if self.count == 0 and PREVIOUS_DIGEST not in record and self.sealer.run_id is None:
            self.legacy = True
        self.count += 1
        return self._legacy(record) if self.legacy else self._link(record)

    def _link(self, record: dict[str, Any]) -> dict[str, Any]:
        seal, previous = record.pop(RECORD_DIGEST, None), record.get(PREVIOUS_DIGEST)
        if previous is None or seal is None:
            raise _EditedRecord(
                f"a record without {PREVIOUS_DIGEST if previous is None else RECORD_DIGEST} in a "
                "chained log: its digest was removed"
            )
        if previous != self.head:
            what = (
                "the log's genesis (this run, this file)"
                if self.head == self.genesis
                else ("the record before it")
            )
            raise _EditedRecord(
                f"a record that does not follow {what}: a record was removed, inserted, reordered "
                "or copied from another log or run"
            )
        if not self.sealer.matches(self.place, record, seal):
            raise _EditedRecord(
                f"a record whose fields do not match its {RECORD_DIGEST}: edited or damaged"
            )
        self.head, self.chained = seal, True
        record.pop(PREVIOUS_DIGEST)
        return record

    def _legacy(self, record: dict[str, Any]) -> dict[str, Any]:
        """A record of a log written before chains: its own digest, once the log has one."""
        if self.chained and RECORD_DIGEST not in record:
            raise _EditedRecord(
                f"a record without {RECORD_DIGEST} after records with one: its digest was removed"
            )
        if RECORD_DIGEST in record:
            recorded = record.pop(RECORD_DIGEST)
            if recorded != json_sha256(record):
                raise _EditedRecord(
                    f"a record whose fields do not match its {RECORD_DIGEST}: edited or damaged"
                )
            self.chained = True
        return record

    def next_line(self, record: Mapping[str, Any]) -> bytes:
        """The line that appends ``record`` to this chain (or to a log written before chains)."""
        fields = json.loads(json.dumps(dict(record), default=str))  # as a reader will see them
        fields.pop(RECORD_DIGEST, None)
        fields.pop(PREVIOUS_DIGEST, None)
        if self.legacy:
            fields[RECORD_DIGEST] = json_sha256(fields)
        else:
            fields[PREVIOUS_DIGEST] = self.head
            fields[RECORD_DIGEST] = self.sealer.seal(self.place, fields)
        return (json.dumps(fields, sort_keys=True) + "\n").encode("utf-8")


def _read_chain(path: Path, data: bytes, sealer) -> tuple[_Chain, list[dict[str, Any]], int]:
    """(the chain, its records, the length of the whole lines) of a log's bytes: a last line
    without its newline is torn (what a crash mid-append leaves) and left out; any complete line
    that is not the next record of the chain raises :class:`LogCorruptionError`."""
    chain = _Chain(path, sealer)
    whole = data.rfind(b"\n") + 1
    records = []
    for number, raw in enumerate(data[:whole].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            records.append(chain.accept(raw))
        except _EditedRecord as error:
            raise LogCorruptionError(path, number, str(error)) from None
        except ValueError as error:
            raise LogCorruptionError(path, number, f"not a JSON record ({error})") from None
    return chain, records, whole


def _sealer_for(path: Path, sealer):
    return sealer if sealer is not None else sealer_of(path.parent)


def _warn_torn(path: Path, size: int, action: str) -> None:
    warnings.warn(
        f"{path}: {action} a torn last line ({size} byte(s), not a complete JSON record: "
        "what a crash in the middle of an append leaves behind)",
        TornLineWarning,
        stacklevel=3,
    )


def append_jsonl(path: str | os.PathLike, record: Mapping[str, Any], *, sealer=None) -> Path:
    """Append ``record`` as one JSON line to ``path`` (created 0600), chained to the records before
    it (:class:`_Chain`), and fsync it.

    The log is read and checked first: an edited or misplaced record is refused
    (:class:`LogCorruptionError`), never appended after. A torn last line left by an earlier crash
    is cut off (with a :class:`TornLineWarning`), so the new record starts on a line of its own.
    ``sealer`` (:class:`fedunlearn.store.sealing.Sealer`) defaults to the run of ``path``'s folder.
    Values JSON cannot encode are written as ``str``.
    """
    path = Path(path)
    sealer = _sealer_for(path, sealer)
    private_directory(path.parent)
    created = not path.exists()
    descriptor = open_private_file(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        if fcntl is not None:  # one appender at a time: cutting a tail must not race a write
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        size = os.fstat(descriptor).st_size
        chain, _, keep = _read_chain(path, os.pread(descriptor, size, 0), sealer)
        if keep < size:
            os.ftruncate(descriptor, keep)
            _warn_torn(path, size - keep, "cut off")
        line = chain.next_line(record)
        written = 0
        while written < len(line):  # O_APPEND: every chunk lands at the end
            written += os.write(descriptor, line[written:])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)  # also releases the flock
    if created:
        fsync_directory(path.parent)
    return path


def read_jsonl(path: str | os.PathLike, *, sealer=None) -> list[dict[str, Any]]:
    """The records of a JSON-lines log, in order, without their seals (``[]`` if the file does
    not exist).

    Blank lines are ignored. A last line without its newline (torn by a crash) is skipped with a
    :class:`TornLineWarning` naming the file; any complete line that is not the next record of
    the log's chain (not JSON, edited, removed, reordered, from another log or run, or a whole
    line of garbage) raises :class:`LogCorruptionError` naming the line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    _, records, whole = _read_chain(path, data, _sealer_for(path, sealer))
    if whole < len(data):
        _warn_torn(path, len(data) - whole, "skipped")
    return records
