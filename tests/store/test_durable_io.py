"""Durable I/O: atomic private files, and JSON-lines logs that survive a crash mid-append."""

from __future__ import annotations

import json
import os
import stat
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.errors import FedUnlearnError
from fedunlearn.store.durable_io import (
    LogCorruptionError,
    TornLineWarning,
    atomic_write_bytes,
    atomic_write_json,
    log_size,
    private_directory,
    truncate_log,
)
from fedunlearn.store.json_lines import append_jsonl, read_jsonl


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o000, 0o022, 0o277])
def umask(request):
    """The widest umask, the usual one, and one that would leave a folder unwritable to its owner."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def write_log(path, records) -> None:
    for record in records:
        append_jsonl(path, record)


# ---------------------------------------------------------------- modes
def test_files_are_0600_and_new_folders_0700_whatever_the_umask(tmp_path, umask):
    target = tmp_path / "a" / "b" / "file.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")  # replaced whole
    log = tmp_path / "a" / "c" / "log.jsonl"
    append_jsonl(log, {"k": 1})
    assert target.read_bytes() == b"two" and read_jsonl(log) == [{"k": 1}]
    assert [mode(p) for p in (target, log)] == [0o600, 0o600]
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/c")] == [0o700] * 3
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.bin"]  # no temporary left


def test_an_existing_log_is_tightened_and_an_existing_folder_left_alone(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    log = shared / "old.jsonl"
    log.write_text('{"k": 0}\n')
    os.chmod(log, 0o644)
    append_jsonl(log, {"k": 1})
    assert mode(log) == 0o600 and mode(shared) == 0o755
    assert private_directory(shared) == shared and mode(shared) == 0o755


def test_atomic_write_keeps_the_old_bytes_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "f"
    atomic_write_bytes(target, b"old")

    def failing_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f"]


# ---------------------------------------------------------------- JSON lines
def test_a_torn_last_line_is_skipped_with_a_warning_naming_the_file(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, [{"request": 1}, {"request": 2}])
    with open(log, "ab") as handle:
        handle.write(b'{"request": 3, "par')  # a crash mid-append
    with pytest.warns(TornLineWarning, match=rf"{log}: skipped a torn last line \(19 byte"):
        assert read_jsonl(log) == [{"request": 1}, {"request": 2}]
    assert log.read_bytes().endswith(b'"par')  # reading never writes


@pytest.mark.parametrize(
    "tail",
    [b'{"request": 3}', b"\x00\x00\x00\x00", b'{"request": 3, "x"', b"\xff\xfe"],
    ids=["complete-but-no-newline", "zeros", "half-a-record", "not-utf8"],
)
def test_what_a_crash_can_leave_at_the_end_is_skipped_and_cut_off_by_the_next_append(
    tmp_path, tail
):
    log = tmp_path / "log.jsonl"
    write_log(log, [{"request": 1}])
    with open(log, "ab") as handle:
        handle.write(tail)
    with pytest.warns(TornLineWarning, match=str(log)):
        assert read_jsonl(log) == [{"request": 1}]
    with pytest.warns(TornLineWarning, match=rf"{log}: cut off a torn last line"):
        append_jsonl(log, {"request": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the log is whole again: no warning any more
        assert read_jsonl(log) == [{"request": 1}, {"request": 2}]
    lines = log.read_bytes().splitlines()
    assert len(lines) == 2 and all(b'"record_sha256"' in line for line in lines)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x00\n",
        b'{"request": 3, "x"\n',
        b"[1, 2]\n",
        b"\xff\xfe\n",
        b'{"request": 2}\n',
    ],
    ids=["zeros", "half-a-record", "not-an-object", "not-utf8", "a-record-without-seals"],
)
def test_a_whole_last_line_of_garbage_is_an_edit_not_a_tear(tmp_path, garbage):
    """A crash cannot leave a complete line (its newline is the last byte written): a whole last
    line that is not the chain's next record is refused, by readers and by the next append."""
    log = tmp_path / "log.jsonl"
    write_log(log, [{"request": 1}])
    with open(log, "ab") as handle:
        handle.write(garbage)
    with pytest.raises(LogCorruptionError, match=rf"{log}, line 2: "):
        read_jsonl(log)
    before = log.read_bytes()
    with pytest.raises(LogCorruptionError, match="line 2"):
        append_jsonl(log, {"request": 3})
    assert log.read_bytes() == before  # nothing cut off, nothing appended after it


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(b"{not json}\n", "Expecting property name"), (b'"a string"\n', "JSON str")],
)
def test_a_damaged_earlier_line_raises_naming_the_file_and_the_line(tmp_path, damage, reason):
    log = tmp_path / "log.jsonl"
    # a blank line 2 (ignored), then the damage on line 3, then a good last line
    log.write_bytes(b'{"request": 1}\n\n' + damage + b'{"request": 4}\n')
    with pytest.raises(LogCorruptionError, match=rf"{log}, line 3: not a JSON record") as info:
        read_jsonl(log)
    assert isinstance(info.value, FedUnlearnError) and info.value.line == 3
    assert reason in str(info.value)


def test_an_empty_or_missing_log_has_no_records(tmp_path):
    assert read_jsonl(tmp_path / "absent.jsonl") == []
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert read_jsonl(tmp_path / "empty.jsonl") == []
    append_jsonl(tmp_path / "empty.jsonl", {"first": True})
    assert read_jsonl(tmp_path / "empty.jsonl") == [{"first": True}]


def test_values_json_cannot_encode_are_written_as_text_and_newlines_never_split_a_record(
    tmp_path,
):
    log = tmp_path / "log.jsonl"
    append_jsonl(log, {"path": tmp_path, "text": "two\nlines"})
    assert read_jsonl(log) == [{"path": str(tmp_path), "text": "two\nlines"}]
    assert log.read_bytes().count(b"\n") == 1


records = st.lists(
    st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.one_of(st.integers(), st.text(max_size=20), st.booleans(), st.none()),
        max_size=4,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(records=records, cut=st.floats(min_value=0.0, max_value=1.0))
def test_any_crash_point_keeps_exactly_the_records_whose_newline_reached_the_disk(
    tmp_path_factory, records, cut
):
    log = tmp_path_factory.mktemp("log") / "log.jsonl"
    write_log(log, records)
    data = log.read_bytes()
    kept = data[: int(cut * len(data))]
    log.write_bytes(kept)
    survivors = records[: kept.count(b"\n")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TornLineWarning)
        assert read_jsonl(log) == survivors
        append_jsonl(log, {"after": "crash"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_jsonl(log) == [*survivors, {"after": "crash"}]
    last = json.loads(log.read_bytes().splitlines()[-1])
    assert last.pop("record_sha256") and last.pop("previous_sha256") and last == {"after": "crash"}


def test_a_json_document_is_written_private_and_reads_back(tmp_path):
    path = atomic_write_json(tmp_path / "new" / "summary.json", {"b": 1, "a": tmp_path})
    assert json.loads(path.read_text()) == {"a": str(tmp_path), "b": 1}
    assert path.read_text().endswith("\n") and mode(path) == 0o600


def test_truncating_to_an_earlier_size_undoes_exactly_the_later_appends(tmp_path):
    path = tmp_path / "ledger.jsonl"
    assert log_size(path) == -1
    append_jsonl(path, {"request": 1})
    mark = log_size(path)
    append_jsonl(path, {"request": 2})
    append_jsonl(path, {"request": 3})
    truncate_log(path, mark)
    assert read_jsonl(path) == [{"request": 1}]
    truncate_log(path, -1)  # the log did not exist before the first append
    assert not path.exists()


@pytest.mark.parametrize("where", ["last", "middle"])
def test_an_edited_record_is_refused_naming_its_line_and_never_cut_off(tmp_path, where):
    """A record carries the digest of its fields: an edit of a whole line is not a torn line."""
    log = tmp_path / "log.jsonl"
    for request in (1, 2, 3):
        append_jsonl(log, {"request": request, "epsilon": 0.5})
    lines = log.read_bytes().splitlines(keepends=True)
    number = 3 if where == "last" else 2
    lines[number - 1] = lines[number - 1].replace(b'"epsilon": 0.5', b'"epsilon": 5.0')
    log.write_bytes(b"".join(lines))
    with pytest.raises(LogCorruptionError, match=rf"line {number}: .*edited or damaged"):
        read_jsonl(log)
    edited = log.read_bytes()
    with pytest.raises(LogCorruptionError):  # the next append does not cut the evidence off
        append_jsonl(log, {"request": 4})
        read_jsonl(log)
    assert log.read_bytes().startswith(edited)


def test_a_record_written_before_digests_is_read_as_it_is(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"request": 1}\n')
    append_jsonl(log, {"request": 2})
    assert read_jsonl(log) == [{"request": 1}, {"request": 2}]


@pytest.mark.parametrize("number", [2, 3])
def test_a_record_whose_digest_was_removed_is_refused(tmp_path, number):
    """After the first record with a digest every append writes one: a later record without one
    had it removed (an edit that dropped the evidence), and is refused naming its line."""
    log = tmp_path / "log.jsonl"
    for request in (1, 2, 3):
        append_jsonl(log, {"request": request, "certified": False})
    lines = log.read_bytes().splitlines(keepends=True)
    lines[number - 1] = json.dumps({"request": number, "certified": True}).encode() + b"\n"
    log.write_bytes(b"".join(lines))
    with pytest.raises(LogCorruptionError, match=rf"line {number}: .*digest was removed"):
        read_jsonl(log)


# ---------------------------------------------------------------- the chain
def chained(tmp_path, name="log.jsonl", count=3):
    log = tmp_path / name
    for request in range(1, count + 1):
        append_jsonl(log, {"request": request, "certified": request % 2 == 0})
    return log, log.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        (lambda lines: lines[1:], 1),  # the first record stripped
        (lambda lines: [lines[0], lines[2]], 2),  # a record in the middle removed
        (lambda lines: [lines[1], lines[0], lines[2]], 1),  # two records swapped
        (lambda lines: [lines[0], lines[1], lines[1], lines[2]], 3),  # a record repeated
    ],
    ids=["first-stripped", "middle-removed", "reordered", "repeated"],
)
def test_no_record_the_first_included_can_be_removed_reordered_or_repeated(tmp_path, edit, line):
    log, lines = chained(tmp_path)
    log.write_bytes(b"".join(edit(lines)))
    with pytest.raises(LogCorruptionError, match=rf"line {line}: a record that does not follow"):
        read_jsonl(log)
    with pytest.raises(LogCorruptionError):  # nor appended after
        append_jsonl(log, {"request": 9})


def test_the_first_record_stripped_of_its_seals_and_edited_is_refused(tmp_path):
    """A one-record ledger of a run: stripping its seals does not make it a log written before
    chains (a run with an identity has none)."""
    from fedunlearn.store.sealing import create_identity

    create_identity(tmp_path)
    log, lines = chained(tmp_path, count=1)
    record = json.loads(lines[0])
    del record["record_sha256"], record["previous_sha256"]
    record["certified"] = True
    log.write_bytes(json.dumps(record).encode() + b"\n")
    with pytest.raises(LogCorruptionError, match="line 1: a record without"):
        read_jsonl(log)


def test_a_log_copied_to_another_name_or_another_run_is_refused(tmp_path):
    from fedunlearn.store.sealing import create_identity

    log, _ = chained(tmp_path, name="scrubbing.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_bytes(log.read_bytes())
    with pytest.raises(
        LogCorruptionError, match="line 1: a record that does not follow the log's genesis"
    ):
        read_jsonl(other)
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    for run in (run_a, run_b):
        run.mkdir()
        create_identity(run)
    log_a, _ = chained(run_a, name="ledger.jsonl")
    (run_b / "ledger.jsonl").write_bytes(log_a.read_bytes())
    assert len(read_jsonl(log_a)) == 3
    with pytest.raises(LogCorruptionError, match="genesis"):
        read_jsonl(run_b / "ledger.jsonl")


def test_a_log_in_a_run_with_an_identity_has_no_record_without_its_seals(tmp_path):
    from fedunlearn.store.sealing import create_identity

    create_identity(tmp_path)
    (tmp_path / "log.jsonl").write_bytes(b'{"request": 1}\n')  # a legacy line in a new run
    with pytest.raises(LogCorruptionError, match="line 1: a record without previous_sha256"):
        read_jsonl(tmp_path / "log.jsonl")
