"""The forgetting signal and keep-training, through the real ClientApp in this process (no Ray): the
forgotten client planted a backdoor, so every row of the comparison says whether it forgot.

* a method that is the identity (it returns the trained model) is flagged "forgot nothing", and
  FedRetrain is not;
* keep-training spends exactly the client-epochs of the method it is told to match, a budget that
  is not a multiple of one round's (PGA's: the leaving client's ascent plus post-training), and its
  curve of backdoor success starts at the original's;
* PGA's paper stop reads the server's validation samples (here digits' test samples: every
  training sample is a client's), and the request's log says where they came from.
"""

from __future__ import annotations

import json

import pytest
from federation_grid import ClientAppGrid, K

from fedunlearn.config import ExperimentConfig
from fedunlearn.registry import UNLEARNING
from fedunlearn.unlearning.forgetting import MIN_SIGNAL_POINTS
from fedunlearn.unlearning.keep_training import round_plan
from server.training.original import train_federated
from server.unlearning.request import LOG_NAME, run_unlearning

pytestmark = pytest.mark.usefixtures("flower_task_identity")

VALUES = {
    "num-clients": K,
    "rounds": 5,
    "local-epochs": 2,
    "lr": 0.05,
    "retain-interval": 1,
    "attack-clients": "0",
    "attack": "backdoor",
    "unlearn-clients": "0",
    "unlearn-methods": "identity,pga,fedretrain,keep-training",
    "allow-target-participation": True,
    "keep-training-budget": "pga",
    "post-training-rounds": 2,
    "pga-epochs": 5,
    "unlearn-adopt": "fedretrain",
}


def identity(context, name):
    """A method that forgets nothing: the trained model itself."""
    return dict(context.outcome.final_state), {"did": "nothing: the trained model"}


def test_the_identity_forgot_nothing_fedretrain_did_and_keep_training_spent_pgas_budget(tmp_path):
    values = {**VALUES, "output-dir": str(tmp_path), "run-name": "signal"}
    with UNLEARNING.registered("identity", identity, default=False):
        config = ExperimentConfig.from_run_config(values)
        grid = ClientAppGrid(values)
        lines: list[str] = []
        outcome = train_federated(grid, config, log=lines.append)
        table = run_unlearning(grid, outcome, [0], log=lines.append).set_index("method")

    original, retrained = (
        table.loc["fedavg", "attack_success"],
        table.loc["fedretrain", "attack_success"],
    )
    assert 100 * (original - retrained) >= MIN_SIGNAL_POINTS  # the original learned the backdoor
    assert table.loc["identity", "attack_success"] == original
    assert table.loc["identity", "forgetting"] == "forgot nothing"
    assert table.loc["identity", "flag"].startswith("forgot nothing: backdoor success")
    assert table.loc["fedretrain", "flag"] == "" and table.loc["fedretrain", "forgetting"] == ""
    assert table.loc["identity", "target_samples"] == len(outcome.data.client_split(0).x)

    # keep-training: PGA's client-epochs exactly, 5 ascent epochs + 2 rounds x 3 clients x 2
    pga = table.loc["pga", "client_epochs"]
    assert pga == 5 + 2 * (K - 1) * 2
    assert table.loc["keep-training", "client_epochs"] == pga
    assert sum(r.client_epochs for r in round_plan(pga, K - 1, 2)) == pga
    entry = json.loads((outcome.run.path / LOG_NAME).read_text().splitlines()[-1])
    curve = entry["details"]["keep-training"]["curve"]
    assert curve[0]["client_epochs"] == 0 and curve[0]["attack_success"] == pytest.approx(original)
    assert curve[-1]["client_epochs"] == pga
    assert curve[-1]["attack_success"] == pytest.approx(
        table.loc["keep-training", "attack_success"]
    )
    # every method is read against keep-training at (at least) its own cost
    assert table.loc["pga", "keep_training_attack_success"] == pytest.approx(
        curve[-1]["attack_success"]
    )

    # PGA's paper stop: the validation samples are test samples here, and the log says so
    ascent = entry["details"]["pga"]["ascent"]["0"]
    assert ascent["tau"] == pytest.approx(ascent["reference_validation_accuracy"] - 0.10)
    assert any("validation samples (test samples) sent with the ascent request" in line
               for line in lines), lines  # fmt: skip
    # the worst remaining client is one of the remaining clients
    assert table.loc["identity", "worst_client"] in range(1, K)
    assert (outcome.run.path / "client_accuracy.csv").is_file()
