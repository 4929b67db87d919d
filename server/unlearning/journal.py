"""An unlearning request as a transaction: a crash anywhere in it, or a node that stops the run,
leaves a run that the same request (or ``resume=true``) finishes to the result of a request never
interrupted (docs/crash-recovery.md).

``request.json`` is written before the request's first file and removed once its history is
adopted. It records the request's number and targets and the lengths of the run's append-only
records (the certificate ledger, the scrubbing log) at two points. A request goes through three
stages, each recoverable:

1. **undecided**, until its entry in ``unlearning_log.jsonl``. Nothing the run had before the
   request changes in this stage (the targets' retained updates are deleted only with the old
   history, at adoption). A crash is *rolled back* (:func:`reopen`): the staging stores are removed,
   the records cut back to their lengths at :func:`begin` (a SIFU certificate of a model never kept
   goes with them), and the request is computed again from the pre-request state.
2. **decided**: the log entry names the adopted method; the later phases (certified head,
   scrubbing, membership audit) run on the pre-request model. A crash is *rolled forward*: the
   records are cut back to their lengths at :func:`decide`, the later phases run again, then the
   history is adopted.
3. **adopting**: :mod:`server.unlearning.adoption`'s own journal swaps the trajectory in and deletes the old
   history with the targets' updates; rolled forward whenever the run is reopened.

The journal is untrusted input like every file of a run: its digest is checked, and a record is
never cut below a line boundary or grown.
"""

from __future__ import annotations

from pathlib import Path

from fedunlearn.errors import FedUnlearnError
from fedunlearn.store.durable_io import (
    fsync_directory,
    json_loads,
    log_size,
    truncate_log,
)
from fedunlearn.store.run_directory import (
    CERTIFIED_LEDGER,
    REQUEST_JOURNAL,
    SCRUBBING_LOG,
    UNLEARNING_LOG,
    RunDirectory,
)
from server.progress import Log
from server.unlearning.adoption import adopt, adopted_requests, discard_stagings, pending_request

JOURNAL = REQUEST_JOURNAL
#: The append-only records a request (or its later phases) adds to: a rerun cuts them back.
RECORDS = (CERTIFIED_LEDGER, SCRUBBING_LOG)


def record_marks(run: RunDirectory) -> dict[str, int]:
    """The length of each of :data:`RECORDS` now (-1: absent)."""
    return {name: log_size(run.path / name) for name in RECORDS}


def begin(run: RunDirectory, request: int, targets: list[int]) -> None:
    """Journal request ``request`` before it writes anything (stage 1)."""
    _write(run, {"request": request, "targets": sorted(targets), "begun": record_marks(run)})


def decide(run: RunDirectory) -> None:
    """Mark the records' lengths once the methods ran, just before the log entry (stage 2)."""
    journal = read(run)
    if journal is not None:
        _write(run, {**journal, "decided": record_marks(run)})


def close(run: RunDirectory) -> None:
    """The request's history is adopted: it is over."""
    path = run.path / JOURNAL
    if path.exists():
        path.unlink()
        fsync_directory(run.path)


def abandon(run: RunDirectory) -> None:
    """Roll back the undecided request (a crash, or a refused adoption): its staging stores go and
    the records lose what it appended (a SIFU certificate of a model that is not kept)."""
    journal = read(run)
    if journal is None:
        return
    _cut(run, journal["begun"])
    discard_stagings(run, journal["request"])
    close(run)


def read(run: RunDirectory) -> dict | None:
    """The journal (None: no request in progress); an edited or malformed one raises
    :class:`FedUnlearnError` naming the file."""
    path = run.path / JOURNAL
    if not path.is_file():
        return None
    try:
        journal = json_loads(path.read_bytes().decode("utf-8"))
        digest = journal.pop("sha256")
        problem = _malformed(journal)
    except (ValueError, AttributeError, KeyError, TypeError) as error:
        problem = f"not a request journal ({error})"
    else:
        if problem is None and not run.sealer.matches({"file": JOURNAL}, journal, digest):
            problem = "its sha256 does not match its fields and this run: it was edited or copied"
    if problem is not None:
        raise FedUnlearnError(f"{path}: {problem}; restore it from a backup")
    return journal


def reopen(run: RunDirectory, targets: list[int], *, keep_original: bool, log: Log) -> bool:
    """Bring an interrupted request to a state the run can go on from, when the run is reopened
    (after :func:`server.unlearning.adoption.finish_pending`). Returns True when the request asked for now
    (``targets``) is a decided request to roll forward: its later phases run again, then it is
    adopted. An undecided request is rolled back; a decided one for other targets is adopted
    before the new request starts."""
    journal = read(run)
    pending = pending_request(run)
    if journal is not None and journal["request"] in _numbers(adopted_requests(run)):
        close(run)  # crashed after the history log recorded the adoption
        journal = None
    if journal is not None and journal["request"] not in _numbers(run.read_log(UNLEARNING_LOG)):
        log(
            f"request {journal['request']} ({journal['targets']}) was interrupted before its "
            "decision: rolling it back, nothing it wrote is kept"
        )
        abandon(run)
        return False
    if pending is None:
        return False
    if journal is not None and journal.get("decided"):
        _cut(run, journal["decided"])
    if sorted(pending["targets"]) == sorted(targets):
        log(
            f"request {pending['request']} ({pending['targets']}) was decided before it was "
            f"interrupted ({pending['adopted']} adopted): finishing it"
        )
        return True
    log("the previous request finished but its history was not adopted yet: adopting it now")
    adopt(run, keep_original=keep_original, log=log)
    close(run)
    return False


def _numbers(entries: list[dict]) -> set[int]:
    return {entry.get("request", number) for number, entry in enumerate(entries, start=1)}


def _cut(run: RunDirectory, marks: dict[str, int]) -> None:
    """Cut each record back to its length in ``marks``, at a line boundary only."""
    for name, mark in marks.items():
        path = run.path / name
        if name not in RECORDS or not path.is_file() or path.stat().st_size <= mark:
            continue
        if mark > 0 and _byte_before(path, mark) != b"\n":
            raise FedUnlearnError(
                f"{run.path / JOURNAL}: its mark {mark} for {name} is not at a line boundary"
            )
        truncate_log(path, mark)


def _byte_before(path: Path, mark: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(mark - 1)
        return handle.read(1)


def _malformed(journal: dict) -> str | None:
    """Why ``journal`` is not a request journal (None when it is one)."""
    if not (_is_int(journal.get("request")) and journal["request"] >= 1):
        return "its request is not a positive integer"
    if not (isinstance(journal.get("targets"), list) and all(map(_is_int, journal["targets"]))):
        return "its targets are not a list of integers"
    for stage in ("begun", "decided"):
        marks = journal.get(stage, {})
        if not isinstance(marks, dict) or any(
            name not in RECORDS or not _is_int(mark) or mark < -1 for name, mark in marks.items()
        ):
            return f"its {stage} marks are not record lengths"
    return None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _write(run: RunDirectory, journal: dict) -> None:
    run.write_json(JOURNAL, {**journal, "sha256": run.sealer.seal({"file": JOURNAL}, journal)})
