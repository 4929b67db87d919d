"""The request journal (server.unlearning.journal) on its own: what a reopen does at each stage, and a
journal that was edited is refused rather than trusted to cut the certificate ledger."""

from __future__ import annotations

import json

import pytest

from fedunlearn.errors import FedUnlearnError
from fedunlearn.store.run_directory import RunDirectory
from server.unlearning import journal as request_journal
from server.unlearning.adoption import HISTORY_LOG
from server.unlearning.request import LOG_NAME

LEDGER = "certified_removal.jsonl"


def _run(tmp_path) -> RunDirectory:
    run = RunDirectory.create(tmp_path / "run", {})
    run.append_log(LEDGER, {"method": "certified-head", "request": 0})  # before the request
    return run


def test_an_undecided_request_is_rolled_back_to_the_ledger_it_began_with(tmp_path):
    run = _run(tmp_path)
    before = (run.path / LEDGER).read_bytes()
    request_journal.begin(run, 1, [0])
    (run.path / "store.request-1-federaser").mkdir()
    run.append_log(LEDGER, {"method": "sifu", "request": 1})  # a model never kept
    lines = []
    assert request_journal.reopen(run, [0], keep_original=False, log=lines.append) is False
    assert (run.path / LEDGER).read_bytes() == before
    assert not (run.path / "store.request-1-federaser").exists()
    assert not (run.path / request_journal.JOURNAL).exists()
    assert "rolling it back" in lines[0]


def test_a_decided_request_is_rolled_forward_from_its_decision(tmp_path):
    run = _run(tmp_path)
    request_journal.begin(run, 1, [0])
    run.append_log(LEDGER, {"method": "sifu", "request": 1})  # its method's: kept
    request_journal.decide(run)
    decided = (run.path / LEDGER).read_bytes()
    run.append_log(LOG_NAME, {"request": 1, "targets": [0], "adopted": "federaser"})
    run.append_log(LEDGER, {"method": "certified-head", "request": 1})  # later phase: run again
    assert request_journal.reopen(run, [0], keep_original=False, log=print) is True
    assert (run.path / LEDGER).read_bytes() == decided
    assert (run.path / request_journal.JOURNAL).exists()  # until its history is adopted


def test_a_request_whose_adoption_was_recorded_is_closed(tmp_path):
    run = _run(tmp_path)
    request_journal.begin(run, 1, [0])
    request_journal.decide(run)
    run.append_log(LOG_NAME, {"request": 1, "targets": [0], "adopted": "federaser"})
    run.append_log(HISTORY_LOG, {"request": 1, "targets": [0], "adopted": "federaser"})
    assert request_journal.reopen(run, [0], keep_original=False, log=print) is False
    assert not (run.path / request_journal.JOURNAL).exists()


@pytest.mark.parametrize(
    "edit",
    [
        lambda j: j["begun"].__setitem__(LEDGER, 0),  # would cut every certificate
        lambda j: j.__setitem__("request", True),
        lambda j: j.__setitem__("targets", "0"),
    ],
)
def test_an_edited_journal_is_refused_and_nothing_is_cut(tmp_path, edit):
    run = _run(tmp_path)
    request_journal.begin(run, 1, [0])
    run.append_log(LEDGER, {"method": "sifu", "request": 1})
    ledger = (run.path / LEDGER).read_bytes()
    path = run.path / request_journal.JOURNAL
    journal = json.loads(path.read_text())
    edit(journal)
    path.write_text(json.dumps(journal))
    with pytest.raises(FedUnlearnError, match="request.json"):
        request_journal.reopen(run, [0], keep_original=False, log=print)
    assert (run.path / LEDGER).read_bytes() == ledger


def test_a_mark_inside_a_line_is_refused(tmp_path):
    run = _run(tmp_path)
    request_journal.begin(run, 1, [0])
    journal = request_journal.read(run)
    journal["begun"][LEDGER] -= 3  # inside the earlier request's line, digest recomputed
    request_journal._write(run, journal)
    run.append_log(LEDGER, {"method": "sifu", "request": 1})
    with pytest.raises(FedUnlearnError, match="line boundary"):
        request_journal.reopen(run, [0], keep_original=False, log=print)
