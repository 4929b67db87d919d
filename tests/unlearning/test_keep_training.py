"""Keep-training's budget arithmetic and its reading at a method's cost, and the per-client
accuracy every row reports (the clients that stay)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.unlearning.keep_training import PlannedRound, at_client_epochs, round_plan
from fedunlearn.unlearning.metrics import class_accuracies, client_accuracy


@given(budget=st.integers(0, 5000), clients=st.integers(1, 50), epochs=st.integers(1, 20))
def test_the_plan_spends_the_budget_exactly_in_rounds_no_larger_than_the_runs(
    budget, clients, epochs
):
    plan = round_plan(budget, clients, epochs)
    assert sum(r.client_epochs for r in plan) == budget
    assert all(1 <= r.epochs <= epochs and 1 <= r.clients <= clients for r in plan)
    # whole rounds first; at most two partial rounds at the end
    partial = [r for r in plan if r != PlannedRound(epochs, clients)]
    assert len(partial) <= 2 and plan[: len(plan) - len(partial)] == [
        PlannedRound(epochs, clients)
    ] * (len(plan) - len(partial))


def test_federasers_main_job_budget_is_four_rounds_and_a_half():
    # 9 calibrated rounds x 9 clients x 5 epochs = 405: 4 rounds of 9 x 10, then 9 x 5
    assert round_plan(405, 9, 10) == [PlannedRound(10, 9)] * 4 + [PlannedRound(5, 9)]
    # PGA's 5 ascent epochs + 2 rounds x 9 x 2: 41 = 2 rounds of 9 x 2, then 5 clients x 1
    assert round_plan(41, 9, 2) == [PlannedRound(2, 9)] * 2 + [PlannedRound(1, 5)]
    # 50 = 2 rounds of 9 x 2, then 9 x 1, then 5 clients x 1
    assert round_plan(50, 9, 2) == [PlannedRound(2, 9)] * 2 + [
        PlannedRound(1, 9),
        PlannedRound(1, 5),
    ]
    assert round_plan(0, 9, 10) == []


@pytest.mark.parametrize("budget", [-1, 2.5, math.nan, math.inf, "10"])
def test_a_budget_that_is_no_whole_number_of_client_epochs_is_refused(budget):
    with pytest.raises(ConfigError, match="keep-training budget"):
        round_plan(budget, 9, 10)
    with pytest.raises(ConfigError, match="clients"):
        round_plan(10, 0, 10)


def test_keep_training_is_read_at_no_less_than_a_methods_cost():
    curve = [
        {"client_epochs": 0, "test_accuracy": 0.9, "attack_success": 0.8},
        {"client_epochs": 90, "test_accuracy": 0.91, "attack_success": 0.5},
        {"client_epochs": 180, "test_accuracy": 0.92, "attack_success": 0.2},
    ]
    assert at_client_epochs(curve, 0)["attack_success"] == 0.8
    assert at_client_epochs(curve, 36)["client_epochs"] == 90  # the first point past 36
    assert at_client_epochs(curve, 90)["client_epochs"] == 90
    assert at_client_epochs(curve, 180)["attack_success"] == 0.2
    assert at_client_epochs(curve, 181) is None  # beyond its budget: no reading


class _Fixed(nn.Module):
    """Predicts class ``predictions[i]`` for the i-th input (inputs are their own index)."""

    def __init__(self, predictions):
        super().__init__()
        self.predictions = torch.as_tensor(predictions)
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return nn.functional.one_hot(self.predictions[x.long().flatten()], 3).float()


def test_a_clients_accuracy_weights_the_class_accuracies_by_its_labels():
    y = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2])
    model = _Fixed([0, 1, 1, 1, 0, 0, 2, 0])  # class 0: 1/2, class 1: 2/4, class 2: 1/2
    x = torch.arange(8).float()[:, None]
    classes = class_accuracies(model, x, y, 4)
    assert classes[:3] == [0.5, 0.5, 0.5] and math.isnan(classes[3])
    model = _Fixed([0, 0, 1, 1, 1, 1, 0, 0])  # class 0: 1, class 1: 1, class 2: 0
    classes = class_accuracies(model, x, y, 3)
    assert client_accuracy(classes, [10, 0, 0]) == 1.0  # holds class 0 only
    assert client_accuracy(classes, [0, 0, 4]) == 0.0  # holds class 2 only
    assert client_accuracy(classes, [1, 1, 2]) == pytest.approx(0.5)
    assert math.isnan(client_accuracy([math.nan, 1.0], [3, 0]))  # nothing known of its classes


def test_keep_training_is_refused_with_the_method_whose_budget_it_spends():
    from fedunlearn.config import ExperimentConfig
    from fedunlearn.registry import UNLEARNING
    from server.unlearning.going_on import without_budget as _without_budget

    methods = "fedretrain,rapid-retraining,keep-training"
    config = ExperimentConfig.from_run_config(
        {"unlearn-methods": methods, "keep-training-budget": "rapid-retraining"}
    )
    specs = [UNLEARNING[m] for m in ("fedretrain", "keep-training")]
    lines = []
    kept, refused = _without_budget(config, specs, {"rapid-retraining": "offline"}, lines.append)
    assert [s.name for s in kept] == ["fedretrain"]
    assert refused["keep-training"] == (
        "its budget is rapid-retraining's client-epochs, and rapid-retraining was refused"
    )
    assert lines == [f"keep-training refused for this request: {refused['keep-training']}"]
    # a budget in rounds, or a budget method that runs: keep-training goes on
    rounds = config.replace(keep_training_rounds=3)
    assert _without_budget(rounds, specs, {"rapid-retraining": "x"}, print)[0] == specs
    assert _without_budget(config, specs, {}, print) == (specs, {})


def test_a_budget_method_outside_the_request_is_refused_before_anything_runs():
    from fedunlearn.config import ExperimentConfig

    with pytest.raises(ConfigError, match="keep-training-budget"):
        ExperimentConfig.from_run_config(
            {"unlearn-methods": "federaser,keep-training", "keep-training-budget": "fedretrain"}
        )
    ExperimentConfig.from_run_config(
        {"unlearn-methods": "federaser,keep-training", "keep-training-rounds": 2}
    )
