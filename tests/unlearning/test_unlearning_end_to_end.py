"""End to end on digits: train 4 clients, forget one, then another; the forgotten receive nothing."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
from fake_grid import SpyGrid
from flwr.serverapp import ServerApp

from fedunlearn.config import ExperimentConfig
from fedunlearn.store.update_store import UpdateStore
from server.training.original import train_federated
from server.unlearning import journal as request_journal
from server.unlearning.adoption import adopt
from server.unlearning.request import LOG_NAME, run_unlearning


def adopted(outcome):
    """``outcome`` once its request's history is adopted, as the ServerApp ends a request."""
    outcome.store.close()
    adopt(outcome.run, keep_original=False, log=lambda _: None)
    request_journal.close(outcome.run)
    return dataclasses.replace(
        outcome,
        store=UpdateStore(outcome.run.store_path),
        final_state=outcome.run.load_model("model_final"),
    )


def test_forget_one_client_then_another(tmp_path, simulate):
    overrides = {
        "num-clients": 4,
        "rounds": 10,
        "local-epochs": 2,
        "retain-interval": 1,
        "calibration-ratio": 0.5,
        "output-dir": str(tmp_path),
        "run-name": "e2e",
        "unlearn-clients": "0",
        "node-wait-seconds": 60,
    }
    seen = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        spy = SpyGrid(grid)
        config = ExperimentConfig.from_run_config(overrides)
        outcome = train_federated(spy, config, log=lambda _: None)
        seen["members"], seen["spy"] = outcome.members, spy
        spy.phase = "unlearn-0"
        seen["first"] = run_unlearning(
            spy, outcome, outcome.config.unlearn_targets, log=lambda _: None
        )
        seen["clients before adoption"] = outcome.store.clients()
        spy.phase = "unlearn-1"
        second = dataclasses.replace(adopted(outcome), config=config.replace(unlearn_clients="1"))
        seen["second"] = run_unlearning(
            spy, second, second.config.unlearn_targets, log=lambda _: None
        )
        seen["store_clients"] = adopted(second).store.clients()  # used from this thread

    simulate(overrides, num_supernodes=4, server_app=app)

    node = seen["members"].node_of_partition
    sent = seen["spy"].sent
    # The forgotten client receives no message while it is being unlearned, nor afterwards.
    assert not [s for s in sent if s[0] != "training" and s[1] == node[0]]
    assert not [s for s in sent if s[0] == "unlearn-1" and s[1] == node[1]]
    assert {kind for phase, _, kind in sent if phase != "training"} == {"train.calibrate", "train"}

    first = seen["first"].set_index("method")
    assert list(first.index) == ["fedavg", "federaser", "fedaccum", "fedretrain"]
    assert first.loc["fedretrain", "test_accuracy"] > 0.8
    assert (
        abs(first.loc["federaser", "test_accuracy"] - first.loc["fedretrain", "test_accuracy"])
        < 0.05
    )
    assert first.loc["fedretrain", "last_layer_angle_deg"] < 1e-3
    assert first.loc["fedaccum", "test_accuracy"] < first.loc["federaser", "test_accuracy"]

    # The targets' updates go with the old history at adoption; the log says who was forgotten,
    # how and when.
    assert seen["clients before adoption"] == [0, 1, 2, 3]
    assert seen["store_clients"] == [2, 3]
    run_dir = tmp_path / "e2e"
    log = [json.loads(line) for line in (run_dir / LOG_NAME).read_text().splitlines()]
    assert [entry["targets"] for entry in log] == [[0], [1]]
    assert log[1]["previously_unlearned"] == [0]
    assert log[0]["deleted_blobs"] == 10 and log[0]["parameters"]["calibration_ratio"] == 0.5
    assert pd.read_csv(run_dir / "unlearning-2.csv")["method"].tolist() == list(first.index)
    for name in (
        "unlearning.png",
        "last_layer_angles.png",
        "model_federaser-2.safetensors",  # request 1's models went with its history
        "model_fedretrain-2.safetensors",
    ):
        assert (run_dir / name).stat().st_size > 0


def test_a_norms_history_through_flower_keeps_t1_whole_and_forgets(tmp_path, simulate):
    overrides = {
        "num-clients": 3,
        "rounds": 4,
        "local-epochs": 1,
        "retain-interval": 1,
        "retain-mode": "norms",
        "output-dir": str(tmp_path),
        "run-name": "norms",
        "unlearn-clients": "0",
        "unlearn-methods": "federaser,fedretrain",
        "node-wait-seconds": 60,
    }
    seen = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        config = ExperimentConfig.from_run_config(overrides)
        outcome = train_federated(grid, config, log=lambda _: None)
        store = outcome.store
        seen["before"] = [store.read_round(t).norms_only for t in store.rounds()]
        seen["result"] = run_unlearning(
            grid, outcome, outcome.config.unlearn_targets, log=lambda _: None
        )
        store.close()  # adopted keeping the original: the targets' norms go from it too
        adopt(outcome.run, keep_original=True, log=lambda _: None)
        kept = UpdateStore(outcome.run.path / "original-1" / "store")
        seen["after"] = (kept.clients(), kept.total_bytes(), kept.bytes_per_round())

    simulate(overrides, num_supernodes=3, server_app=app)
    assert seen["before"] == [[], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
    clients, total, per_round = seen["after"]
    assert clients == [1, 2] and total == sum(per_round.values())
    assert all(per_round[t] < per_round[1] / 1000 for t in (2, 3, 4))
    result = seen["result"].set_index("method")
    assert list(result.index) == ["fedavg", "federaser", "fedretrain"]
    assert result.loc["federaser", "test_accuracy"] > 0.7
