"""End to end, in process: scrubbing a cohort from a federated digits model with every method.

Four virtual clients train, then class 3 (every client holds some) is forgotten by the Newton,
Fisher and baseline methods, against FedRetrain without class 3; then a whole client is forgotten.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fedunlearn.config import SCRUB_METHODS


def _simulate(simulate, tmp_path, name, **overrides):
    overrides = {
        "num-clients": 4,
        "rounds": 3,
        "retain": False,
        "output-dir": str(tmp_path),
        "run-name": name,
        "node-wait-seconds": 60,
        "unlearn-clients": "",
        "scrub": True,
        "scrub-baseline-rounds": 1,
        **overrides,
    }
    simulate(overrides, num_supernodes=4)
    return tmp_path / name


def test_class_scrubbing_runs_every_method_and_reads_them_out(tmp_path, simulate):
    run = _simulate(simulate, tmp_path, "class", **{"scrub-forget": "class:3"})
    table = pd.read_csv(run / "scrubbing.csv").set_index("method")
    assert list(table.index) == ["original", "retrain", *SCRUB_METHODS]
    assert (run / "scrubbing.md").is_file()
    for figure in ("scrubbing_entropy.png", "scrubbing_relearn.png", "scrubbing_tradeoff.png"):
        assert (run / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for method in ["retrain", *SCRUB_METHODS]:
        assert (run / f"model_scrub_{method}.safetensors").is_file()
    # FedRetrain never saw class 3: it cannot predict it; the original model knows it well.
    assert table.loc["retrain", "error_f"] == 1.0
    assert table.loc["original", "error_f"] < 0.3
    assert table.loc["retrain", "error_test_class"] == 1.0
    # Relearning: the original is already below the threshold, the retrained model is not.
    assert table.loc["original", "relearn_epochs"] == 0.0
    assert table.loc["retrain", "forget_loss_start"] > 0.3
    # The gap column is measured against FedRetrain.
    assert table.loc["retrain", "error_f_gap_to_retrain"] == 0.0
    expected_gap = abs(table.loc["newton", "error_f"] - 1.0)
    assert table.loc["newton", "error_f_gap_to_retrain"] == pytest.approx(expected_gap)

    tradeoff = pd.read_csv(run / "scrubbing_tradeoff.csv")
    assert set(tradeoff["method"]) == {"newton", "fisher", "fisher-sqrt", "fisher-reference"}
    for _, rows in tradeoff.groupby("method"):
        rows = rows.sort_values("lam")
        nats = rows["information_nats"].to_numpy()
        assert len(rows) == 5 and np.isfinite(nats).all() and (nats > 0).all()
        assert (np.diff(nats) < 0).all()  # more noise, less information left
    # The table's information column is the trade-off's value at the configured lambda.
    lam = table.loc["newton", "lam"]
    at = tradeoff[(tradeoff["method"] == "newton") & np.isclose(tradeoff["lam"], lam)]
    assert table.loc["newton", "information_nats"] == pytest.approx(at["information_nats"].iloc[0])

    log = [json.loads(line) for line in (run / "scrubbing.jsonl").read_text().splitlines()]
    assert log[-1]["forget"] == "class:3" and log[-1]["holders"] == [0, 1, 2, 3]


def test_whole_client_scrubbing_leaves_that_client_out_and_skips_hiding(tmp_path, simulate):
    run = _simulate(
        simulate,
        tmp_path,
        "client",
        **{
            "scrub-forget": "client:2",
            "scrub-methods": "newton,finetune,negative-gradient,hiding",
            "rounds": 2,
        },
    )
    table = pd.read_csv(run / "scrubbing.csv").set_index("method")
    assert list(table.index) == ["original", "retrain", "newton", "finetune", "negative-gradient"]
    log = [json.loads(line) for line in (run / "scrubbing.jsonl").read_text().splitlines()]
    assert log[-1]["holders"] == [2]
    # Only the client holding D_f runs the negative gradient; retraining and fine-tuning leave it out.
    clients = {method: entry["clients"] for method, entry in log[-1]["details"].items()}
    assert clients == {"retrain": [0, 1, 3], "finetune": [0, 1, 3], "negative-gradient": [2]}
    assert "error_test_other" not in table.columns  # only a class cohort has "other classes"
