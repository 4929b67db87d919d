"""End to end on digits: the recovery methods forget a client from what the run retained for them,
never message it, and spend fewer client-epochs than retraining."""

from __future__ import annotations

import json

from fake_grid import SpyGrid
from flwr.serverapp import ServerApp
from safetensors.torch import load_file

from fedunlearn.config import ExperimentConfig
from fedunlearn.store.history import history
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.model_state import state_sha256
from fedunlearn.unlearning.sensitivity import SensitivityAccumulator
from server.training.original import train_federated
from server.unlearning.adoption import adopt
from server.unlearning.request import run_unlearning


def test_fedrecover_and_crab_recover_close_to_retraining_at_a_fraction_of_its_cost(
    tmp_path, simulate
):
    overrides = {
        "num-clients": 4,
        "rounds": 12,
        "local-epochs": 1,
        "retain-interval": 3,
        "output-dir": str(tmp_path),
        "run-name": "recover",
        "unlearn-clients": "0",
        "unlearn-methods": "federaser,fedrecover,crab,fedretrain",
        "fedrecover-warmup": 3,
        "fedrecover-correction-period": 4,
        "fedrecover-final-tuning": 1,
        "node-wait-seconds": 60,
    }
    seen = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        spy = SpyGrid(grid)
        config = ExperimentConfig.from_run_config(overrides)
        outcome = train_federated(spy, config, log=lambda _: None)
        seen["views"] = {
            need: (history(outcome.store, need).rounds(), history(outcome.store, need).clients(1))
            for need in ("retained-updates", "round-history")
        }
        seen["crab_rounds"] = history(outcome.store, "selected-history").rounds()
        seen["members"], seen["spy"] = outcome.members, spy
        spy.phase = "unlearn"
        seen["table"] = run_unlearning(
            spy, outcome, outcome.config.unlearn_targets, log=lambda _: None
        )

    simulate(overrides, num_supernodes=4, server_app=app)

    # FedEraser reads its Δt schedule, FedRecover every round, from one store.
    assert seen["views"]["retained-updates"] == ([1, 4, 7, 10], [0, 1, 2, 3])
    assert seen["views"]["round-history"] == (list(range(1, 13)), [0, 1, 2, 3])
    node = seen["members"].node_of_partition
    assert not [s for s in seen["spy"].sent if s[0] == "unlearn" and s[1] == node[0]]
    table = seen["table"].set_index("method")
    retrain, recover = table.loc["fedretrain"], table.loc["fedrecover"]
    assert retrain["client_epochs"] == 12 * 3 * 1  # 12 rounds, 3 remaining clients, 1 epoch
    # exact rounds: warm-up 1-3, correction 7 and 11, final tuning 12 (plus any fix)
    assert 6 * 3 <= recover["client_epochs"] < retrain["client_epochs"]
    assert abs(recover["test_accuracy"] - retrain["test_accuracy"]) < 0.05
    assert recover["retained_mb"] > table.loc["federaser", "retained_mb"] > 0
    assert table.loc["fedretrain", "retained_mb"] == 0
    assert recover["communication_mb"] > 0
    # Crab keeps a selection, less than FedRecover's every round, rolls back to its first kept
    # round and re-runs the kept rounds after it (the remaining kept clients, 1 epoch each)
    crab = table.loc["crab"]
    kept = seen["crab_rounds"]
    assert 1 < len(kept) < 12
    assert 0 < crab["retained_mb"] < recover["retained_mb"]
    log = tmp_path / "recover" / "unlearning_log.jsonl"
    (request,) = [json.loads(line) for line in log.open()]
    details = request["details"]["crab"]
    assert details["rule"] == "authors" and details["kept_rounds"] == kept
    assert details["rollback_round"] == kept[0] and details["rerun_rounds"] == kept[1:]
    assert 0 < crab["client_epochs"] == details["exact_client_rounds"] < retrain["client_epochs"]
    assert abs(crab["test_accuracy"] - retrain["test_accuracy"]) < 0.1
    # every row says what its method did; a row within flag-gap and away from the original is
    # not flagged, and the flags the log records are the table's
    assert crab["did"].startswith(f"rolled back to round {kept[0]} (authors rule), re-ran rounds")
    assert crab["rollback_round"] == kept[0]
    assert recover["did"].endswith("redone by the guard") and "estimated" in recover["did"]
    assert table.loc["federaser", "did"].startswith("4 retained round(s): 3 calibrated")
    recorded = request["flags"]
    assert recorded == {m: f for m, f in table["flag"].items() if isinstance(f, str) and f}
    flagged = set(recorded)
    assert not {"fedrecover", "fedretrain"} & flagged
    below = 100 * (retrain["test_accuracy"] - crab["test_accuracy"])
    assert ("crab" in flagged) == (below > 5), (below, recorded)
    assert request["adopted"] == "fedretrain"  # FedEraser's trajectory would not serve Crab's need
    assert "federaser was no candidate" in request["adoption"]


def test_sifu_rolls_back_within_budget_certifies_and_forgets_the_client_in_its_bounds(
    tmp_path, simulate
):
    overrides = {
        "num-clients": 4,
        "rounds": 6,
        "local-epochs": 1,
        "momentum": 0.0,
        "lr": 0.01,
        "output-dir": str(tmp_path),
        "run-name": "sifu",
        "unlearn-clients": "0",
        "unlearn-methods": "sifu,fedretrain",
        "sifu-smoothness": 0.0,
        "sifu-sigma": 0.05,
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
        seen["kept"] = (outcome.store.rounds(), outcome.store.clients())
        spy.phase = "unlearn"
        seen["table"] = run_unlearning(
            spy, outcome, outcome.config.unlearn_targets, log=lambda _: None
        )
        outcome.store.close()  # adopted keeping the original: the client goes from its bounds
        adopt(outcome.run, keep_original=True, log=lambda _: None)
        original = UpdateStore(outcome.run.path / "original-1" / "store", readonly=True)
        seen["state"] = original.metadata["retention-state"]

    simulate(overrides, num_supernodes=4, server_app=app)

    assert seen["kept"] == ([1, 2, 3, 4, 5, 6], [])  # global models only: no update kept
    node = seen["members"].node_of_partition
    assert not [s for s in seen["spy"].sent if s[0] == "unlearn" and s[1] == node[0]]
    ledger = [json.loads(line) for line in (tmp_path / "sifu" / "certified_removal.jsonl").open()]
    (certificate,) = ledger
    assert certificate["method"] == "sifu" and certificate["ids"] == [0]
    assert certificate["certified"] and certificate["beta_after"] <= certificate["budget"]
    assert 1 <= certificate["rollback_round"] <= 7
    saved = load_file(tmp_path / "sifu" / "original-1" / "model_sifu.safetensors")
    assert certificate["weights_sha256"] == state_sha256(saved)
    table = seen["table"].set_index("method")
    retrained = 6 - certificate["rollback_round"] + 1
    assert table.loc["sifu", "client_epochs"] == retrained * 3
    # the bounds forget the client: no per-client entry of client 0 is left in any saved state
    for saved_state in seen["state"].values():
        bounds = SensitivityAccumulator.from_json(saved_state["sensitivity-bounds"])
        assert 0 not in bounds.clients() and bounds.forgotten == 1
