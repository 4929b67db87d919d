"""End to end: a finished run directory is private - every folder 0700, every file 0600 - although
the process runs under the usual umask 0o022 (which would give 0755 folders and 0644 files)."""

from __future__ import annotations

import os
import stat


def test_a_finished_run_with_unlearning_and_certified_removal_is_private(tmp_path, simulate):
    overrides = {
        "num-clients": 4,
        "rounds": 2,
        "local-epochs": 1,
        "retain-interval": 1,
        "output-dir": str(tmp_path / "runs"),
        "run-name": "private",
        "node-wait-seconds": 60,
        "unlearn-clients": "1",
        "unlearn-methods": "federaser,fedaccum,fedretrain",
        "certified-head": True,
        "certified-removals": 3,
        "certified-eval-every": 2,
    }
    previous = os.umask(0o022)
    try:
        simulate(overrides, num_supernodes=4)
    finally:
        os.umask(previous)

    run_dir = tmp_path / "runs" / "private"
    found = {
        path.relative_to(tmp_path): stat.S_IMODE(path.lstat().st_mode)
        for path in [tmp_path / "runs", run_dir, *run_dir.rglob("*")]
    }
    names = {str(path) for path in found}
    # the run really wrote what the claim is about: models, tables, figures, logs, store, ledger
    for expected in (
        "runs/private/config.json",
        "runs/private/metrics.csv",
        "runs/private/model_final.safetensors",
        "runs/private/unlearning.md",
        "runs/private/unlearning_log.jsonl",
        "runs/private/training.png",
        "runs/private/certified_removal.jsonl",
        "runs/private/certified_removal.png",
        "runs/private/store/index.sqlite",
        "runs/private/store/blobs/round_000002/client_000000.safetensors",
    ):
        assert expected in names, sorted(names)
    wrong = {
        str(path): oct(mode)
        for path, mode in found.items()
        if mode != (0o700 if (tmp_path / path).is_dir() else 0o600)
    }
    assert wrong == {}
    assert not [p for p in run_dir.rglob("*") if p.is_symlink() or p.name.endswith(".tmp")]
