"""The history rewrite is a journalled swap: a crash at any step is rolled forward on reopening,
and the run never ends with the old history, no store, or the old model beside the new history."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from fedunlearn.store.run_directory import UNLEARNING_LOG, RunDirectory
from fedunlearn.store.update_store import UpdateStore
from server.unlearning import adoption as history
from server.unlearning import journal as request_journal


def _request(tmp_path, *, adopted="federaser", methods=("federaser", "fedaccum", "fedretrain")):
    """A run after request 1 finished, not adopted yet: its old store, the staging trajectory,
    the pre-request model and every method's model."""
    run = RunDirectory.create(tmp_path / "run", {})
    old = UpdateStore(run.store_path)
    old.write_round(1, {"w": torch.zeros(2)}, {0: ({"w": torch.ones(2)}, 5)})
    staging = history.open_staging(run, 1, old, adopted)
    staging.write_round(1, {"w": torch.zeros(2)}, {0: ({"w": torch.full((2,), 3.0)}, 5)})
    old.close()
    staging.close()
    for name, value in [("initial", 0.0), ("final", 9.0), ("scrub_newton", 8.0),
                        *[(m, float(i + 1)) for i, m in enumerate(methods)]]:  # fmt: skip
        run.save_model(f"model_{name}", {"w": torch.full((2,), value)})
    run.save_model("certified_head", {"certified_head.weights": torch.ones(1, 2)})
    run.append_log(
        UNLEARNING_LOG,
        {"request": 1, "suffix": "", "targets": [1], "methods": list(methods), "adopted": adopted},
    )
    return run


def _state(run: RunDirectory) -> dict:
    store = UpdateStore(run.store_path, readonly=True)
    files = sorted(p.name for p in run.path.iterdir())
    return {
        "files": files,
        "update": store.read_update(1, 0)["w"].tolist(),
        "final": load_file(str(run.path / "model_final.safetensors"))["w"].tolist(),
    }


def test_adoption_swaps_in_the_trajectory_and_deletes_what_the_old_history_computed(tmp_path):
    run = _request(tmp_path)
    lines = []
    history.adopt(run, keep_original=False, log=lines.append)
    state = _state(run)
    assert state["update"] == [3.0, 3.0] and state["final"] == [1.0, 1.0]  # FedEraser's
    assert [f for f in state["files"] if f.endswith(".safetensors")] == [
        "model_federaser.safetensors",
        "model_fedretrain.safetensors",
        "model_final.safetensors",
        "model_initial.safetensors",
    ]
    assert not any(
        f.startswith((".discarded", "original", "store.request")) for f in state["files"]
    )
    assert history.JOURNAL not in state["files"] and "deleted" in lines[0]
    assert history.pending_request(run) is None and history.is_adopted(run, [1])
    history.adopt(run, keep_original=False)  # nothing left to adopt: nothing changes
    assert _state(run) == state


def test_keep_original_moves_the_old_history_aside_and_says_what_it_keeps(tmp_path):
    run = _request(tmp_path, adopted="fedretrain")
    lines = []
    history.adopt(run, keep_original=True, log=lines.append)
    archive = run.path / "original-1"
    assert UpdateStore(archive / "store", readonly=True).read_update(1, 0)["w"].tolist() == [1, 1]
    assert sorted(p.name for p in archive.glob("*.safetensors")) == [
        "certified_head.safetensors",
        "model_fedaccum.safetensors",
        "model_final.safetensors",
        "model_scrub_newton.safetensors",
    ]
    assert _state(run)["final"] == [3.0, 3.0]  # FedRetrain's
    assert "determine the forgotten clients' updates" in lines[0]
    assert oct(archive.stat().st_mode & 0o777) == "0o700"


def test_a_crash_anywhere_in_the_swap_is_rolled_forward_on_reopening(tmp_path, monkeypatch):
    """Every os.replace / os.unlink of the swap (renames, atomic writes, deletions) fails once in
    turn: reopening always finishes the same swap."""
    real = {"replace": os.replace, "unlink": os.unlink}
    calls = {"n": 0, "crash_at": 0}

    def failing(name):
        def wrapper(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == calls["crash_at"]:
                raise OSError("power cut")
            return real[name](*args, **kwargs)

        return wrapper

    for name in real:
        monkeypatch.setattr(os, name, failing(name))
    reference = _request(tmp_path / "reference")
    calls["n"] = 0
    history.adopt(reference, keep_original=False)
    total, expected = calls["n"], _state(reference)
    assert total > 10
    for crash_at in range(1, total + 1):
        run = _request(tmp_path / f"crash-{crash_at}")
        calls.update(n=0, crash_at=crash_at)
        with pytest.raises(OSError, match="power cut"):
            history.adopt(run, keep_original=False)
        calls.update(crash_at=0)
        reopened = RunDirectory.open(run.path)
        history.finish_pending(reopened)
        history.adopt(reopened, keep_original=False)  # had the crash come before the journal
        assert _state(reopened) == expected, crash_at
        assert [e["request"] for e in history.adopted_requests(reopened)] == [1]


def test_a_missing_adopted_model_is_refused_before_anything_moves(tmp_path):
    run = _request(tmp_path)
    (run.path / "model_federaser.safetensors").unlink()
    with pytest.raises(Exception, match="unlearn-adopt"):
        history.adopt(run, keep_original=False)
    assert (run.path / "model_final.safetensors").is_file() and run.store_path.is_dir()


# ------------------------------------------------------------------ choosing what to adopt
def _candidates_staged(tmp_path):
    from types import SimpleNamespace

    from fedunlearn.config import ExperimentConfig
    from server.unlearning.request import UnlearningContext

    run = RunDirectory.create(tmp_path / "run", {})
    old = UpdateStore(run.store_path)
    old.write_round(1, {"w": torch.zeros(2)}, {0: ({"w": torch.ones(2)}, 5)})
    candidates = ["federaser", "fedretrain"]
    request_journal.begin(run, 1, [0])
    for method in candidates:
        history.open_staging(run, 1, old, method).close()
    config = ExperimentConfig.from_run_config({})
    outcome = SimpleNamespace(run=run, config=config)
    context = UnlearningContext(None, None, [0], [], print, candidates)
    return run, outcome, context


def _comparison(federaser: float, fedretrain: float):
    import pandas as pd

    return pd.DataFrame(
        {
            "method": ["fedavg", "federaser", "fedretrain"],
            "test_accuracy": [0.95, federaser, fedretrain],
            "flag": ["", "", ""],
        }
    )


def test_the_candidate_not_adopted_leaves_no_staging_store(tmp_path):
    from server.unlearning.request import _adopt_one

    run, outcome, context = _candidates_staged(tmp_path)
    lines = []
    adoption = _adopt_one(outcome, context, _comparison(0.576, 0.938), 1, lines.append)
    assert adoption.method == "fedretrain"
    assert [p.name for p in run.path.glob("store.request-*")] == ["store.request-1-fedretrain"]
    assert "federaser is 36.20 points below fedretrain" in lines[-1]


def test_a_refused_adoption_removes_every_staging_store_and_touches_nothing_else(tmp_path):
    from fedunlearn.unlearning.verdicts import AdoptionRefused
    from server.unlearning.request import _adopt_one

    run, outcome, context = _candidates_staged(tmp_path)
    ledger = run.path / "certified_removal.jsonl"
    run.append_log(ledger.name, {"method": "certified-head"})  # an earlier request's certificate
    kept_ledger = ledger.read_bytes()
    request_journal.begin(run, 1, [0])
    run.append_log(ledger.name, {"method": "sifu", "request": 1})  # this request's: not kept
    table = _comparison(0.2, 0.1)
    table["flag"] = ["", "75.0 points below original (flag-gap 5)", "diverged: ..."]
    transient = ("store.request", request_journal.JOURNAL)
    before = sorted(p.name for p in run.path.iterdir() if not p.name.startswith(transient))
    with pytest.raises(AdoptionRefused):
        _adopt_one(outcome, context, table, 1, print)
    assert not list(run.path.glob("store.request-*"))
    assert sorted(p.name for p in run.path.iterdir()) == before
    assert ledger.read_bytes() == kept_ledger
    assert UpdateStore(run.store_path, readonly=True).read_update(1, 0)["w"].tolist() == [1.0, 1.0]
