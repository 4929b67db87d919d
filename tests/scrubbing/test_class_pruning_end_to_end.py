"""End to end, in process: class 3 of a federated digits model forgotten by class-discriminative
pruning (Wang et al., WWW 2022): the clients' channel statistics, the pruning, and two rounds of
fine-tuning without class 3, against FedRetrain without it."""

from __future__ import annotations

import json

import pandas as pd


def test_pruning_and_fine_tuning_forget_the_class_and_keep_the_others(tmp_path, simulate):
    simulate(
        {
            "num-clients": 4,
            "rounds": 3,
            "local-epochs": 2,
            "retain": False,
            "output-dir": str(tmp_path),
            "run-name": "prune",
            "node-wait-seconds": 60,
            "unlearn-clients": "",
            "scrub": True,
            "scrub-forget": "class:3",
            "scrub-methods": "class-pruning",
            "prune-finetune-rounds": 2,
            "prune-finetune-epochs": 1,
        },
        num_supernodes=4,
    )
    run = tmp_path / "prune"
    table = pd.read_csv(run / "scrubbing.csv").set_index("method")
    assert list(table.index) == ["original", "retrain", "class-pruning"]
    assert (run / "model_scrub_class-pruning.safetensors").is_file()
    original, pruned = table.loc["original"], table.loc["class-pruning"]
    # The original knows class 3; the pruned and fine-tuned model has forgotten it ...
    assert original["error_test_class"] < 0.2
    assert pruned["error_test_class"] >= 0.9 and pruned["error_f"] >= 0.9
    # ... and the other classes keep the original's error, within a point.
    assert pruned["error_test_other"] <= original["error_test_other"] + 0.01
    # Retraining's time is in the same table, so a speed-up can be read off it.
    assert table.loc["retrain", "seconds"] > 0 and pruned["seconds"] > 0

    log = [json.loads(line) for line in (run / "scrubbing.jsonl").read_text().splitlines()]
    details = log[-1]["details"]["class-pruning"]
    # digits-cnn's 64 feature units: 30 % of them (prune-ratio's default), rounded up, is 20.
    assert details["layer"] == "body.4" and len(details["channels"]) == 20
    assert len(set(details["channels"])) == 20 and all(0 <= c < 64 for c in details["channels"])
    assert details["rounds"] == 2 and details["client_epochs"] == 8  # 4 clients x 2 rounds x 1
    assert details["query_messages"] == 4
