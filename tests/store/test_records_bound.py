"""Every record is bound to its run and its place: genuine files copied from elsewhere, stripped or
edited records and forged states are refused by name, by ``fedunlearn store verify`` and by the next
request (the launcher's preflight and the ServerApp), before any method reads them.

Each case starts from a copy of the shared finished run (digits, 4 clients, client 1 forgotten and
its history adopted, a certified head with its ledger), changes one thing the way an adversary or a
careless copy would, and checks all three refusals.
"""

from __future__ import annotations

import json
import shutil

import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.store.run_check import run_problems
from fedunlearn.store.sealing import KEY_VARIABLE, Sealer
from fedunlearn.store.update_store import UpdateStore


@pytest.fixture
def run(finished_run, tmp_path):
    """A copy of the shared finished run, free to change."""
    copy = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, copy)
    return copy


def lines(path):
    return path.read_bytes().splitlines(keepends=True)


def header_of_another_store(run):
    """A genuine header of another store of the same run (a request's staging store)."""
    other = UpdateStore(run / "store.request-9-federaser")
    other.set_metadata(**UpdateStore(run / "store", readonly=True).metadata)
    other.close()
    shutil.copyfile(run / "store.request-9-federaser" / "store.json", run / "store" / "store.json")
    shutil.rmtree(run / "store.request-9-federaser")
    return "store.json names store"


def header_of_another_moment(run):
    """This store's own header as it was before a later change (a backup put back)."""
    before = (run / "store" / "store.json").read_bytes()
    with UpdateStore(run / "store") as store:
        store.set_metadata(note="written after the copy")
    (run / "store" / "store.json").write_bytes(before)
    return "is not the header its index goes with"


def model_file_swapped(run):
    shutil.copyfile(run / "model_initial.safetensors", run / "model_final.safetensors")
    return "model_final.safetensors is this run's model_initial.safetensors, copied into the place"


def first_record_stripped_and_edited(run):
    ledger = run / "certified_removal.jsonl"
    first, *rest = lines(ledger)
    record = json.loads(first)
    del record["record_sha256"], record["previous_sha256"]
    record.update(beta_after=5, budget=99)
    ledger.write_bytes(json.dumps(record).encode() + b"\n" + b"".join(rest))
    return "certified_removal.jsonl, line 1: a record without"


def one_record_ledger_edited(run):
    ledger = run / "certified_removal.jsonl"
    record = json.loads(lines(ledger)[0])
    record["certified"] = not record.get("certified", True)  # seals kept, one field flipped
    ledger.write_bytes(json.dumps(record).encode() + b"\n")
    return "certified_removal.jsonl, line 1: a record whose fields do not match"


def garbage_last_line(run):
    with open(run / "certified_removal.jsonl", "ab") as ledger:
        ledger.write(b'{"request": 4, "certified": true}\n')  # a whole line: not a crash's doing
    count = len(lines(run / "certified_removal.jsonl"))
    return f"certified_removal.jsonl, line {count}: a record without"


def edited_ledger_record(run):
    ledger = run / "certified_removal.jsonl"
    records = lines(ledger)
    records[1] = records[1].replace(b'"n_after": ', b'"n_after": 1')
    ledger.write_bytes(b"".join(records))
    return "certified_removal.jsonl, line 2: a record whose fields do not match"


def forged_out_of_domain_state(run):
    """Crab's state with a ratio out of its domain, written through the store itself: every
    checksum and seal recomputed, as a forger with fedunlearn's code would."""
    from fedunlearn.store.retention import STATE_KEY
    from fedunlearn.unlearning.crab import CrabSelector

    state = CrabSelector(0.5, 0.5, 0.1, 2, final_round=2, keep_first_round=True).state_dict()
    state["parameters"]["crab-round-ratio"] = -0.5
    with UpdateStore(run / "store") as store:
        store.set_metadata(**{STATE_KEY: {"2": {"selected-history": state}}})
    return "invalid crab-round-ratio=-0.5"


CASES = [
    header_of_another_store,
    header_of_another_moment,
    model_file_swapped,
    first_record_stripped_and_edited,
    one_record_ledger_edited,
    garbage_last_line,
    edited_ledger_record,
    forged_out_of_domain_state,
]


def request_on(run, clients="2") -> ExperimentConfig:
    saved = json.loads((run / "config.json").read_text())
    trained = ExperimentConfig.from_run_config(saved, strict=False)
    return trained.replace(
        unlearn_only=True,
        unlearn_clients=clients,
        unlearn_methods="federaser",
        certified_head=False,
        run_name=run.name,
        output_dir=str(run.parent),
    )


def verify(run, capsys) -> tuple[int, str]:
    from fedunlearn.cli import main

    code = main(["store", "verify", str(run)])
    return code, capsys.readouterr().out


def test_the_finished_run_passes_every_check(run, capsys):
    code, out = verify(run, capsys)
    assert code == 0 and "0 problem(s)" in out, out
    problems, checked = run_problems(run)
    assert problems == [] and checked["logs"] >= 3 and checked["models"] >= 4, checked


@pytest.mark.parametrize("tamper", CASES, ids=[case.__name__ for case in CASES])
def test_a_tampered_run_is_refused_by_verify_and_by_the_next_request(run, capsys, tamper):
    from fedunlearn.preflight import check_run_directory
    from server.training.loading import load_trained_run

    said = tamper(run)
    code, out = verify(run, capsys)
    assert code == 1 and said in out, out
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=rf"run-name=.*{said.split(',')[0]}") as preflight:
        check_run_directory(request_on(run))
    assert said in str(preflight.value) and "Nothing was started" in str(preflight.value)
    with pytest.raises(ConfigError, match="a run whose records all pass their checks"):
        load_trained_run(None, request_on(run), log=lambda line: None)  # before any grid call
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_certificates_refuses_an_edited_ledger_and_the_next_append_does_not_hide_it(run, capsys):
    from fedunlearn.cli import main
    from fedunlearn.store.durable_io import LogCorruptionError
    from fedunlearn.store.json_lines import append_jsonl

    edited_ledger_record(run)
    assert main(["certificates", str(run)]) == 1
    assert "line 2" in capsys.readouterr().err
    with pytest.raises(LogCorruptionError, match="line 2"):
        append_jsonl(run / "certified_removal.jsonl", {"request": 9})


# ---------------------------------------------------------------- authenticity mode (a key)
@pytest.fixture
def key_file(tmp_path, monkeypatch):
    key = tmp_path / "keys" / "run.key"
    key.parent.mkdir()
    key.write_bytes(bytes(range(32)))
    monkeypatch.setenv(KEY_VARIABLE, str(key))
    return key


def test_with_a_key_a_forger_who_recomputes_every_digest_is_caught(tmp_path, key_file):
    from fedunlearn.store.durable_io import LogCorruptionError
    from fedunlearn.store.json_lines import read_jsonl
    from fedunlearn.store.run_directory import RunDirectory
    from fedunlearn.store.sealing import create_identity, sealer_of

    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    create_identity(run.path)
    for n in (1, 2):
        run.append_log("certified_removal.jsonl", {"request": n, "certified": False})
    assert [r["certified"] for r in run.read_log("certified_removal.jsonl")] == [False, False]
    # the forger knows the format and the run id (identity.json), not the key
    run_id = json.loads((run.path / "identity.json").read_text())["run_id"]
    forged = Sealer(run_id)  # integrity mode: what anyone can compute
    log = run.path / "certified_removal.jsonl"
    log.unlink()
    from fedunlearn.store.json_lines import append_jsonl

    for n in (1, 2):
        append_jsonl(log, {"request": n, "certified": True}, sealer=forged)
    with pytest.raises(LogCorruptionError, match="line 1"):
        read_jsonl(log)  # the run's sealer holds the key
    assert sealer_of(run.path).mode == "hmac-sha256"


def test_with_a_key_a_run_downgraded_to_integrity_mode_is_refused(tmp_path, key_file, monkeypatch):
    from fedunlearn.errors import StoreCorruptionError
    from fedunlearn.store.sealing import IDENTITY, create_identity, sealer_of

    run = tmp_path / "run"
    run.mkdir()
    create_identity(run)
    identity = json.loads((run / IDENTITY).read_text())
    fields = {k: v for k, v in identity.items() if k != "sha256"}
    fields.update(integrity="sha256", key_id=None)
    fields["sha256"] = Sealer(identity["run_id"]).seal({"file": IDENTITY}, fields)
    (run / IDENTITY).write_text(json.dumps(fields))
    with pytest.raises(StoreCorruptionError, match="sealed without a key .* while"):
        sealer_of(run)
    monkeypatch.delenv(KEY_VARIABLE)
    assert sealer_of(run).mode == "sha256"  # read in integrity mode, as the user chose


def test_a_keyed_run_needs_its_key_and_a_key_inside_the_run_is_refused(tmp_path, monkeypatch):
    from fedunlearn.errors import StoreCorruptionError
    from fedunlearn.store.sealing import create_identity, sealer_of

    (tmp_path / "run").mkdir()
    inside = tmp_path / "run" / "key"
    inside.write_bytes(bytes(32))
    monkeypatch.setenv(KEY_VARIABLE, str(inside))
    with pytest.raises(ConfigError, match="outside the run directory"):
        create_identity(tmp_path / "run")
    outside = tmp_path / "key"
    outside.write_bytes(bytes(range(32)))
    monkeypatch.setenv(KEY_VARIABLE, str(outside))
    create_identity(tmp_path / "run")
    other = tmp_path / "other.key"
    other.write_bytes(bytes(range(1, 33)))
    monkeypatch.setenv(KEY_VARIABLE, str(other))
    with pytest.raises(StoreCorruptionError, match="not with the key"):
        sealer_of(tmp_path / "run")
    monkeypatch.delenv(KEY_VARIABLE)
    with pytest.raises(StoreCorruptionError, match="set FEDUNLEARN_INTEGRITY_KEY"):
        sealer_of(tmp_path / "run")
    short = tmp_path / "short.key"
    short.write_bytes(b"password")
    monkeypatch.setenv(KEY_VARIABLE, str(short))
    with pytest.raises(ConfigError, match="at least 32 random bytes"):
        sealer_of(tmp_path / "run")


def test_seals_bind_the_run_the_place_and_the_content():
    a, b = Sealer("a" * 32), Sealer("b" * 32)
    keyed = Sealer("a" * 32, key=bytes(32))
    place, content = {"file": "x.jsonl"}, {"n": 1}
    seals = {
        a.seal(place, content),
        b.seal(place, content),
        a.seal({"file": "y.jsonl"}, content),
        a.seal(place, {"n": 2}),
        keyed.seal(place, content),
    }
    assert len(seals) == 5
    assert a.matches(place, content, a.seal(place, content))
    assert not a.matches(place, content, None) and not keyed.matches(
        place, content, a.seal(place, content)
    )


def test_with_a_key_an_index_row_edited_and_resealed_without_it_is_refused(tmp_path, key_file):
    import sqlite3

    import torch

    from fedunlearn.store.index_rows import BlobRow
    from fedunlearn.store.sealing import create_identity

    (tmp_path / "run").mkdir()
    sealer = create_identity(tmp_path / "run")
    with UpdateStore(tmp_path / "run" / "store") as store:
        store.write_round(1, {"w": torch.zeros(2)}, {0: ({"w": torch.ones(2)}, 5)})
        store_id = json.loads((store.root / "store.json").read_text())["store_id"]
    with sqlite3.connect(tmp_path / "run" / "store" / "index.sqlite") as index:
        fields = index.execute(
            "SELECT round, client, kind, num_examples, dtype, bytes, checksum, path FROM blobs "
            "WHERE client = 0"
        ).fetchone()
        forged = BlobRow(*fields[:3], 500, *fields[4:])  # N_k x 100: reweights eq. (2)
        unkeyed = Sealer(sealer.run_id).seal({"store": store_id, "row": "blob"}, forged.canonical())
        index.execute(
            "UPDATE blobs SET num_examples = 500, row_checksum = ? WHERE client = 0", (unkeyed,)
        )
    problems, _ = run_problems(tmp_path / "run")
    assert len(problems) == 1 and "round 1, client 0" in problems[0], problems
    assert "row checksum does not match" in problems[0]
