"""End to end: a finished run directory is private - every folder 0700, every file 0600 - although
the process runs under the usual umask 0o022 (which would give 0755 folders and 0644 files).

The run is the suite's shared finished run (``finished_run`` in ``tests/conftest.py``: unlearning
and certified removal, trained under umask 0o022); the other tests here read it too."""

from __future__ import annotations

import json
import stat

import pandas as pd

from fedunlearn import cli


def test_a_finished_run_with_unlearning_and_certified_removal_is_private(finished_run):
    found = {
        path.relative_to(finished_run.parent): stat.S_IMODE(path.lstat().st_mode)
        for path in [finished_run.parent, finished_run, *finished_run.rglob("*")]
    }
    names = {str(path) for path in found}
    # the run really wrote what the claim is about: models, tables, figures, logs, store, ledger
    for expected in (
        "finished/config.json",
        "finished/metrics.csv",
        "finished/model_final.safetensors",
        "finished/unlearning.md",
        "finished/unlearning_log.jsonl",
        "finished/training.png",
        "finished/certified_removal.jsonl",
        "finished/certified_removal.png",
        "finished/store/index.sqlite",
        "finished/store/blobs/round_000002/client_000000.safetensors",
    ):
        assert expected in names, sorted(names)
    wrong = {
        str(path): oct(mode)
        for path, mode in found.items()
        if mode != (0o700 if (finished_run.parent / path).is_dir() else 0o600)
    }
    assert wrong == {}
    assert not [p for p in finished_run.rglob("*") if p.is_symlink() or p.name.endswith(".tmp")]


def test_the_finished_runs_store_verifies_and_holds_no_round_of_the_forgotten_client(
    finished_run, capsys
):
    assert cli.main(["store", "verify", str(finished_run)]) == 0
    assert cli.main(["store", "info", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert "clients: [0, 2, 3]" in out, out  # FedEraser was adopted: client 1 is gone
    assert not list((finished_run / "store" / "blobs").rglob("client_000001*"))


def test_the_finished_runs_comparison_and_certificates_read_back(finished_run, capsys):
    table = pd.read_csv(finished_run / "unlearning.csv")
    assert {"federaser", "fedaccum", "fedretrain"} <= set(table["method"])
    [entry] = [json.loads(line) for line in (finished_run / "unlearning_log.jsonl").open()]
    assert entry["targets"] == [1]
    assert cli.main(["certificates", str(finished_run)]) == 0
    ledger = [json.loads(line) for line in (finished_run / "certified_removal.jsonl").open()]
    assert len(ledger) >= 3 and all(record.get("certified") for record in ledger[-3:])
