"""A stacked comparison (``stack-models``) is N single runs: each member's models and its rows of
``unlearning.csv`` are those of the single run with the member's ``model-seed``, and the forgotten
client receives no message once training is over."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from fake_grid import SpyGrid
from flwr.serverapp import ServerApp

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.store.run_directory import RunDirectory
from server.training.original import train_federated
from server.training.rounds import stack_seeds
from server.unlearning.request import run_unlearning
from server.unlearning.stacked import run_stacked_comparison

COMMON = {
    "num-clients": 3,
    "rounds": 3,
    "local-epochs": 1,
    "retain-interval": 1,
    "unlearn-clients": "0",
    "unlearn-methods": "federaser,fedaccum,fedretrain,keep-training",
    # client 0 plants a backdoor: every row carries the forgetting signal and its verdict
    "attack": "backdoor",
    "attack-clients": "0",
    "node-wait-seconds": 60,
}
METHODS = ("fedavg", "federaser", "fedaccum", "fedretrain", "keep-training")
#: Columns a member's row must share with its single run (accuracies within two test samples).
MEASURED = (
    "test_accuracy",
    "target_accuracy",
    "attack_success",
    "keep_training_test_accuracy",
    "keep_training_attack_success",
)


def _app(stacked, singles, seen):
    """One ServerApp: the stacked run, then each single run (train, then the request)."""
    app = ServerApp()

    @app.main()
    def main(grid, context):
        spy = SpyGrid(grid)

        def log(line):  # the stacked run says when training is over
            if line.startswith("stack: forgetting"):
                spy.phase = "unlearning"

        seen["table"] = run_stacked_comparison(
            spy, ExperimentConfig.from_run_config(stacked), log=log
        )
        seen["spy"] = spy
        for overrides in singles:
            config = ExperimentConfig.from_run_config(overrides)
            outcome = train_federated(grid, config, log=lambda _: None)
            run_unlearning(grid, outcome, outcome.config.unlearn_targets, log=lambda _: None)

    return app


def test_a_stacked_comparison_is_n_single_runs_row_by_row(tmp_path, simulate):
    stacked = {**COMMON, "stack-models": 2, "output-dir": str(tmp_path), "run-name": "stack"}
    seeds = stack_seeds(ExperimentConfig.from_run_config(stacked))
    singles = [
        {**COMMON, "model-seed": seed, "output-dir": str(tmp_path), "run-name": f"s{member}"}
        for member, seed in enumerate(seeds)
    ]
    seen = {}
    simulate(stacked, num_supernodes=3, server_app=_app(stacked, singles, seen))
    run = RunDirectory.open(tmp_path / "stack")
    table = pd.read_csv(tmp_path / "stack" / "unlearning.csv")
    assert list(table.columns[:2]) == ["member", "model_seed"]
    worst, apart = 0.0, math.inf
    for member, seed in enumerate(seeds):
        alone = RunDirectory.open(tmp_path / f"s{member}")
        for name in ("model_final", "model_federaser", "model_fedaccum", "model_fedretrain"):
            stack_state, expected = run.load_model(name), alone.load_model(name)
            for key, value in expected.items():
                own = stack_state[f"members.{member}.{key}"]
                other = stack_state[f"members.{1 - member}.{key}"]
                worst = max(worst, float((own - value).abs().max()))
                apart = min(apart, float((other - value).abs().max()))
        rows = table[table["member"] == member].set_index("method")
        single = pd.read_csv(tmp_path / f"s{member}" / "unlearning.csv").set_index("method")
        assert set(rows.index) == set(METHODS) == set(single.index)
        assert (rows["model_seed"] == seed).all()
        for method in METHODS:
            mine, theirs = rows.loc[method], single.loc[method]
            for column in MEASURED:
                assert mine[column] == pytest.approx(theirs[column], abs=0.005, nan_ok=True), (
                    member,
                    method,
                    column,
                )
            assert mine["client_epochs"] == theirs["client_epochs"]
            assert mine["communication_mb"] == pytest.approx(theirs["communication_mb"], rel=0.05)
            assert mine["forgetting"] == theirs["forgetting"] or (
                pd.isna(mine["forgetting"]) and pd.isna(theirs["forgetting"])
            )
    # Equal up to float summation order (the judge's stack: 1e-3 measured at worst); the two
    # members differ by far more, so a member trained with the other's seed could not pass.
    assert worst < 5e-3 and apart > 20 * worst, (worst, apart)
    assert (tmp_path / "stack" / "stack.json").is_file()

    # After training, client 0 (whichever node holds partition 0) is sent nothing at all.
    spy = seen["spy"]
    unlearning = [s for s in spy.sent if s[0] == "unlearning"]
    assert unlearning and {spy.partition_of[node] for _, node, _ in unlearning} == {1, 2}


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"stack-models": 1}, "stack-models"),
        ({"stack-models": 3, "judge-models": 3}, "stack-models"),
        ({"stack-models": 3, "unlearn-methods": "federaser,crab,fedretrain"}, "unlearn-methods"),
        ({"stack-models": 3, "unlearn-methods": "fedretrain,pga"}, "unlearn-methods"),
        ({"stack-models": 3, "certified-head": True}, "certified-head"),
        ({"stack-models": 3, "scrub": True}, "scrub"),
        ({"stack-models": 3, "fraction-train": 0.5}, "fraction-train"),
        ({"stack-models": 3, "strategy": "fedprox"}, "strategy"),
    ],
)
def test_a_stack_that_would_read_n_models_as_one_is_refused(keys, named):
    base = {"unlearn-clients": "0", "unlearn-methods": "federaser,fedretrain"}
    with pytest.raises(ConfigError) as raised:
        ExperimentConfig.from_run_config({**base, **keys})
    assert named in str(raised.value)
