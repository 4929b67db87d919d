"""The field's baselines end to end on digits (rapid retraining, FedQUIT, FedAU, PGA, FedOSD):
each runs and leaves a row, and the leaving client receives no message but its own unlearning step,
during the request and after it."""

from __future__ import annotations

import dataclasses
import json
import math

from fake_grid import SpyGrid
from flwr.serverapp import ServerApp

from fedunlearn.config import ExperimentConfig
from fedunlearn.registry import UNLEARNING
from fedunlearn.store.update_store import UpdateStore
from server.training.original import train_federated
from server.unlearning import journal as request_journal
from server.unlearning.adoption import adopt
from server.unlearning.request import run_unlearning

BASELINES = [spec.name for spec in UNLEARNING if spec.name not in ("federaser", "fedaccum")]
#: The objective of each participating method's step on the leaving client.
TARGET_STEPS = {"fedquit": {"fedquit"}, "pga": {"pga"}, "fedosd": {"fedosd-unlearning"}}


def test_every_baseline_runs_and_the_target_receives_only_its_own_step(tmp_path, simulate):
    methods = [m for m in BASELINES if m in UNLEARNING]
    participating = [m for m in methods if UNLEARNING[m].target_participates]
    assert set(participating) <= set(TARGET_STEPS)
    overrides = {
        "num-clients": 4,
        "rounds": 4,
        "local-epochs": 1,
        "retain-interval": 1,
        "output-dir": str(tmp_path),
        "run-name": "baselines",
        "unlearn-clients": "0",
        "unlearn-methods": ",".join(methods),
        "allow-target-participation": True,
        "post-training-rounds": 1,
        "rapid-rounds": 2,
        "fedosd-rounds": 2,
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
        spy.phase = "request-1"
        seen["table"] = run_unlearning(spy, outcome, [0], log=lambda _: None)
        outcome.store.close()
        adopt(outcome.run, keep_original=False, log=lambda _: None)
        request_journal.close(outcome.run)
        second = dataclasses.replace(
            outcome,
            store=UpdateStore(outcome.run.store_path),
            final_state=outcome.run.load_model("model_final"),
            config=config.replace(unlearn_clients="1", unlearn_methods="fedretrain"),
        )
        spy.phase = "request-2"
        run_unlearning(spy, second, [1], log=lambda _: None)

    simulate(overrides, num_supernodes=4, server_app=app)
    target = seen["members"].node_of_partition[0]
    to_target = [(phase, obj) for phase, node, obj in seen["spy"].objectives if node == target]
    during = [obj for phase, obj in to_target if phase == "request-1"]
    allowed = set().union(*(TARGET_STEPS[m] for m in participating))
    # Only the participating methods' own steps reach it; nothing in the next request.
    assert set(during) <= allowed and len(during) >= len(participating)
    assert not [p for p, _ in to_target if p == "request-2"]
    table = seen["table"].set_index("method")
    assert set(methods) <= set(table.index)
    assert (table.loc["fedau", "client_epochs"] == 0) if "fedau" in methods else True
    # PGA says how far the target's ascent went: it moved, and the distances obey the triangle
    # inequality through w_ref (start: w_ref to its own model; end: the unlearned one to it).
    first = json.loads((tmp_path / "baselines" / "unlearning_log.jsonl").open().readline())
    if "pga" in methods:
        ascent = first["details"]["pga"]["ascent"]["0"]
        start, end = math.sqrt(ascent["start_distance2"]), math.sqrt(ascent["end_distance2"])
        assert ascent["moved"] > 0
        assert abs(start - end) - 1e-4 <= ascent["moved"] <= start + end + 1e-4
