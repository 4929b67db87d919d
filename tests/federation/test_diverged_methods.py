"""A method whose rounds diverge in the clients' training: its row is the model the diverged round
sent, flagged "diverged", the other methods' rows stand, and no request adopts it — not by
``auto``, not when named (its trajectory stops where it diverged). Through the real ClientApp in
this process (no Ray), the remaining clients' replies made NaN from FedRetrain's second round."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from federation_grid import ClientAppGrid

from fedunlearn.config import ExperimentConfig
from fedunlearn.unlearning.verdicts import AdoptionRefused, choose_adoption, flag_rows
from server.method_runner import MethodRunner
from server.training.original import train_federated
from server.training.rounds import DivergedRound
from server.unlearning.request import run_unlearning

pytestmark = pytest.mark.usefixtures("flower_task_identity")


# ------------------------------------------------------------------ the method loop
class _Run:
    def __init__(self):
        self.saved = {}

    def save_model(self, name, state):
        self.saved[name] = state


def _spec(name, implementation):
    return SimpleNamespace(name=name, resolve=lambda: implementation, model_file=None, needs=())


def test_a_diverged_method_gets_the_model_its_round_sent_and_the_next_method_still_runs():
    sent = {"w": torch.full((2,), 3.0)}

    def diverges(context, name):
        raise DivergedRound("fedretrain round 2: 3 of 3 replies refused ...", state=sent)

    lines, run = [], _Run()
    runner = MethodRunner(run, log=lines.append, flag_divergence=True)  # the request's runner
    runner.run_all(
        [_spec("fedretrain", diverges), _spec("fedaccum", lambda c, n: {"w": torch.ones(2)})],
        SimpleNamespace(),
    )
    assert runner.models["fedretrain"] is sent and run.saved["model_fedretrain"] is sent
    assert runner.details["fedretrain"]["diverged"].startswith("fedretrain round 2: 3 of 3")
    assert torch.equal(runner.models["fedaccum"]["w"], torch.ones(2))
    assert any("its row is the model that round sent" in line for line in lines)


def test_a_phase_whose_table_flags_nothing_still_ends_on_a_divergence():
    # scrubbing's and the judge's tables do not read "diverged": a row there would pass silently
    def diverges(context, name):
        raise DivergedRound("retrain round 2 ...", state={"w": torch.zeros(1)})

    runner = MethodRunner(_Run(), log=lambda _: None, label="scrub ")
    with pytest.raises(DivergedRound, match="retrain round 2"):
        runner.run_all([_spec("finetune", diverges)], SimpleNamespace())
    assert runner.models == {}


def test_the_judge_takes_a_method_that_diverged_out_and_says_so():
    from server.audit.judge import drop_diverged

    runner, lines = MethodRunner(_Run(), log=lambda _: None), []
    runner.models = {"original": {}, "pga": {}, "fedquit": {}}
    runner.seconds = {"original": 1.0, "pga": 2.0, "fedquit": 3.0}
    runner.details = {"pga": {"diverged": "pga round 1: 9 of 9 refused"}, "fedquit": {"did": "x"}}
    assert drop_diverged(runner, lines.append) == {"pga": "pga round 1: 9 of 9 refused"}
    assert set(runner.models) == set(runner.seconds) == {"original", "fedquit"}
    assert lines == ["judge: FLAGGED pga: diverged (pga round 1: 9 of 9 refused); it is not judged"]


def test_a_divergence_without_the_model_sent_still_ends_the_phase():
    def diverges(context, name):
        raise DivergedRound("no model to report")

    runner = MethodRunner(_Run(), log=lambda _: None, flag_divergence=True)
    with pytest.raises(DivergedRound, match="no model to report"):
        runner.run_all([_spec("fedretrain", diverges)], SimpleNamespace())
    assert "fedretrain" not in runner.models


# ------------------------------------------------------------------ flags and adoption
def _table(**accuracy) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "method": m,
                "test_accuracy": a,
                "test_loss": 0.1,
                "l2_to_fedretrain": 1.0,
                "l2_to_original": 1.0,
            }
            for m, a in accuracy.items()
        ]
    )


def test_a_diverged_fedretrain_is_no_reference_and_every_other_row_is_held_to_the_original():
    # FedRetrain's last finite model (0.30) would flag FedEraser (0.93) for nothing, and pass a
    # 0.28 model: the rows are held to the original (0.95) instead.
    table = _table(fedavg=0.95, federaser=0.93, fedaccum=0.28, fedretrain=0.30)
    flags = dict(zip(table["method"], flag_rows(table, 5.0, diverged={"fedretrain": "round 2"})))
    assert flags["fedretrain"] == "diverged: round 2"
    assert flags["federaser"] == ""
    assert flags["fedaccum"].startswith("67.0 points below original")
    plain = dict(zip(table["method"], flag_rows(table, 5.0)))
    assert plain["fedaccum"] == "" and plain["fedretrain"] == ""  # what the flag prevents


@pytest.mark.parametrize("loss", [0.1, math.nan])
def test_a_diverged_model_is_not_adopted_even_when_named(loss):
    table = _table(fedavg=0.95, federaser=0.93, fedretrain=0.95).assign(test_loss=[0.1, 0.1, loss])
    diverged = {"fedretrain": "round 2"} if loss == 0.1 else {}
    flags = flag_rows(table, 5.0, diverged=diverged)
    with pytest.raises(AdoptionRefused, match=r"fedretrain is flagged \(diverged") as refused:
        choose_adoption(table, flags, ["fedretrain"], explicit="fedretrain", tolerance=1.0)
    assert refused.value.parameter == "unlearn-adopt"
    # another model named explicitly, flagged for its accuracy only, is still the user's choice
    low = table.assign(test_accuracy=[0.95, 0.5, 0.95])
    flags = flag_rows(low, 5.0, diverged=diverged)
    assert (
        choose_adoption(low, flags, [], explicit="federaser", tolerance=1.0).method == "federaser"
    )


# ------------------------------------------------------------------ end to end, in process
class DivergingGrid(ClientAppGrid):
    """The real ClientApp; once ``phase`` is "unlearn", every training reply from round
    ``from_round`` on carries a NaN weight (the remaining clients' training diverged)."""

    phase, from_round = "training", 2

    def answer(self, message):
        reply = super().answer(message)
        config = message.content.config_records.get("config")
        late = config is not None and int(config.get("server-round", 0)) >= self.from_round
        if self.phase == "unlearn" and message.metadata.message_type == "train" and late:
            arrays = reply.content["arrays"].to_torch_state_dict()
            first = next(iter(arrays))
            arrays[first] = torch.full_like(arrays[first], math.nan)
            from flwr.app import ArrayRecord

            reply.content["arrays"] = ArrayRecord(arrays)
        return reply


def test_fedretrain_diverging_leaves_the_other_rows_and_the_request_is_refused_whole(tmp_path):
    # named in unlearn-adopt (auto refuses a flagged row anyway: test_verdicts)
    values = {
        "num-clients": 4,
        "rounds": 2,
        "local-epochs": 1,
        "output-dir": str(tmp_path),
        "run-name": "diverged",
        "unlearn-clients": "0",
        "unlearn-methods": "fedaccum,fedretrain",
        "unlearn-adopt": "fedretrain",
        "node-wait-seconds": 5,
    }
    grid = DivergingGrid(values)
    outcome = train_federated(grid, ExperimentConfig.from_run_config(values), log=lambda _: None)
    blobs = sorted(p.name for p in (outcome.run.path / "store").rglob("*") if p.is_file())
    grid.phase, lines = "unlearn", []
    with pytest.raises(AdoptionRefused, match=r"fedretrain is flagged \(diverged: fedretrain"):
        run_unlearning(grid, outcome, [0], log=lines.append)
    table = pd.read_csv(outcome.run.path / "unlearning.csv").set_index("method")
    assert table.loc["fedretrain", "flag"].startswith("diverged: fedretrain round 2: 3 of 3")
    assert table.loc["fedaccum", "test_accuracy"] > 0.5  # its row stands, measured
    assert not str(table.loc["fedaccum", "flag"]).startswith("diverged")
    assert any("FLAGGED fedretrain: diverged" in line for line in lines)
    # nothing decided, nothing deleted: the store is as training left it, no request logged
    outcome.store.close()
    after = sorted(p.name for p in (outcome.run.path / "store").rglob("*") if p.is_file())
    assert after == blobs
    log = outcome.run.path / "unlearning_log.jsonl"
    assert not log.exists() or not [json.loads(line) for line in log.open() if line.strip()]


def test_a_model_with_non_finite_values_is_flagged_diverged_not_a_result():
    """FedAccum's uncalibrated sum on a BatchNorm model once left a running variance negative and
    its loss NaN: a method whose model holds NaN or inf gets the "diverged" detail, as a method
    whose rounds diverged, so its row is flagged and no request adopts it."""
    broken = {"bn.running_var": torch.tensor([0.1, float("nan")]), "steps": torch.tensor(3)}
    lines, run = [], _Run()
    runner = MethodRunner(run, log=lines.append, flag_divergence=True)
    runner.run_all(
        [
            _spec("fedaccum", lambda c, n: broken),
            _spec("federaser", lambda c, n: {"w": torch.ones(2)}),
        ],
        SimpleNamespace(),
    )
    assert (
        "non-finite values (NaN or inf) in bn.running_var" in runner.details["fedaccum"]["diverged"]
    )
    assert "federaser" not in runner.details
    assert any("fedaccum: its model holds non-finite" in line for line in lines)
