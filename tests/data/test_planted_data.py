"""judge-backdoor: the trigger is planted in the target client's samples only, the same for
every party, and the triggered test set holds the other classes' test samples."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data

BASE = {"num-clients": 5, "judge-models": 3, "unlearn-clients": "2"}


def test_the_trigger_is_planted_in_the_target_partition_only():
    clean = load_federated_data(ExperimentConfig.from_run_config(BASE))
    config = ExperimentConfig.from_run_config(
        {**BASE, "judge-backdoor": True, "judge-backdoor-fraction": 0.25, "judge-backdoor-class": 7}
    )
    planted = load_federated_data(config)
    assert load_federated_data(config) is planted  # every party in a process shares one copy
    plan = planted.backdoor
    target = clean.client_split(2)
    assert plan.client == 2 and len(plan.planted) == round(0.25 * len(target))
    changed = planted.client_split(2)
    differs = (changed.x != target.x).flatten(1).any(dim=1) | (changed.y != target.y)
    assert int(differs.sum()) == len(plan.planted)
    assert set(changed.y[differs].tolist()) == {7} and not (target.y[differs] == 7).any()
    for other in (0, 1, 3, 4):  # nobody else's samples change, nor the test set
        assert torch.equal(planted.client_split(other).x, clean.client_split(other).x)
        assert torch.equal(planted.client_split(other).y, clean.client_split(other).y)
    assert torch.equal(planted.splits.test.x, clean.splits.test.x)
    test = planted.splits.test
    triggered = plan.triggered_test(test.x, test.y)
    assert len(triggered) == int((test.y != 7).sum())
    assert torch.all(triggered[..., -3:, -3:] == triggered.max())


def test_a_backdoor_needs_a_judge_run_and_a_class_of_the_dataset():
    with pytest.raises(Exception, match="judge-backdoor"):
        ExperimentConfig.from_run_config({"judge-backdoor": True})
    with pytest.raises(Exception, match="judge-backdoor-class"):
        ExperimentConfig.from_run_config(
            {**BASE, "judge-backdoor": True, "judge-backdoor-class": 10}
        )
