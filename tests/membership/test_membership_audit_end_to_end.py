"""End to end, in process: every model of a run attacked and judged against FedRetrain.

Four virtual clients train on digits; client 1 is forgotten by FedEraser, FedAccum, FedRetrain and
three scrubbing methods and the certified head; two reference models trained without client 1 serve offline LiRA.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError


def test_every_model_is_attacked_and_judged_against_fedretrain(tmp_path, simulate):
    overrides = {
        "num-clients": 4,
        "rounds": 3,
        "output-dir": str(tmp_path),
        "run-name": "mia",
        "node-wait-seconds": 60,
        "unlearn-clients": "1",
        "scrub": True,
        "scrub-forget": "client:1",
        "scrub-baseline-rounds": 1,
        "scrub-methods": "newton,fisher-reference,finetune",
        "certified-head": True,
        "certified-remove-clients": "1",
        "certified-removals": 4,
        "mia": True,
    }
    simulate(overrides, num_supernodes=4)
    run = tmp_path / "mia"
    table = pd.read_csv(run / "membership.csv").set_index("method")
    assert list(table.index) == [
        "original",
        "fedretrain",
        "federaser",
        "fedaccum",
        "newton",
        "fisher-reference",
        "finetune",
        "certified-head-trained",
        "certified-head",
    ]
    for column in (
        "test_accuracy",
        "target_accuracy",
        "shadow_precision",
        "shadow_recall",
        "shadow_f1",
        "shadow_auc",
        "loss_auc",
        "loss_tpr@1%",
        "confidence_tpr@0.1%",
        "entropy_auc",
        "lira_auc",
        "lira_tpr@0.1%",
        "shadow_f1_gap",
        "lira_auc_gap",
        "verdict",
        "seconds",
    ):
        assert column in table.columns, column
    assert table.loc["fedretrain", "verdict"] == "as retrained"
    assert table.loc["fedretrain", "lira_auc_gap"] == 0.0
    assert table[["loss_auc", "lira_auc", "shadow_f1"]].notna().all().all()
    assert table.loc["federaser", "seconds"] > 0
    # The final certified head is read back from its file on the final model's features, the
    # trained one is handed over in memory (never written: with the data it determines b); their
    # accuracies are the ones the plug-in measured, before and after the requests. The audit came
    # before the history was rewritten: then every model computed from the pre-request model (the
    # head, the scrubbed models, the original) was deleted.
    assert not (run / "certified_head_trained.safetensors").exists()
    [adopted] = [json.loads(line) for line in (run / "history_log.jsonl").open()]
    assert "certified_head.safetensors" in adopted["moved"]
    assert {"model_scrub_newton.safetensors", "model_final.safetensors"} <= set(adopted["moved"])
    assert not (run / "certified_head.safetensors").exists()
    certified = json.loads((run / "certified_summary.json").read_text())
    assert table.loc["certified-head-trained", "test_accuracy"] == pytest.approx(
        certified["test_accuracy_trained"]
    )
    assert table.loc["certified-head", "test_accuracy"] == pytest.approx(
        certified["test_accuracy_final"]
    )
    assert (run / "membership_roc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("values", "parameter"),
    [
        ({"mia": True, "unlearn-clients": "0,1"}, "unlearn-clients"),
        ({"mia": True, "unlearn-clients": ""}, "unlearn-clients"),
        ({"mia": True, "unlearn-methods": "federaser,fedaccum"}, "unlearn-methods"),
        ({"mia": True, "scrub": True, "scrub-forget": "client:3"}, "scrub-forget"),
        ({"mia-reference-models": 1}, "mia-reference-models"),
        ({"mia": True, "certified-head": True}, "certified-remove-clients"),
        (
            {"mia": True, "certified-head": True, "certified-remove-clients": "2"},
            "certified-remove-clients",
        ),
    ],
)
def test_an_audit_that_could_not_be_judged_is_refused_up_front(values, parameter):
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_run_config(values)
    assert error.value.parameter == parameter


def test_non_members_come_from_training_samples_no_client_holds():
    import numpy as np

    from fedunlearn.data.federated_data import load_federated_data
    from server.audit.membership import _held_out

    subset = load_federated_data(
        ExperimentConfig.from_run_config({"num-clients": 4, "train-samples": 400})
    )
    x, y, name = _held_out(subset, n_target=100)
    assert name == "unused training samples"
    held = set(map(tuple, x.flatten(1).numpy().round(6)))
    for part in subset.partitions:  # none of them is any client's sample
        members = subset.splits.train.x[torch.as_tensor(part)].flatten(1).numpy().round(6)
        assert not held & set(map(tuple, members))
    assert len(y) == len(subset.splits.train) - 400

    whole = load_federated_data(ExperimentConfig.from_run_config({"num-clients": 4}))
    x, y, name = _held_out(whole, n_target=len(whole.partitions[0]))
    assert name == "test split" and np.array_equal(y.numpy(), whole.splits.test.y.numpy())
