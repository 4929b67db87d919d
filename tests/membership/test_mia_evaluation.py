"""The audit judges each model by its distance to FedRetrain, on outputs with a known answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.membership.evaluation import (
    MembershipAudit,
    ModelOutputs,
    judge,
    mean_std,
    softmax_outputs,
)
from fedunlearn.membership.lira import logit_confidence

K = 5


def _outputs(rng, n, confidence):
    """Softmax rows whose true-label probability is around ``confidence``."""
    labels = rng.integers(0, K, size=n)
    p_true = np.clip(rng.normal(confidence, 0.05, size=n), 0.05, 0.999)
    rest = rng.dirichlet(np.ones(K - 1), size=n) * (1 - p_true)[:, None]
    probs = np.zeros((n, K))
    for i, y in enumerate(labels):
        probs[i, y] = p_true[i]
        probs[i, [k for k in range(K) if k != y]] = rest[i]
    return probs, labels


def _model(rng, target_confidence, unseen_confidence=0.6, n=400):
    target = _outputs(rng, n, target_confidence)
    unseen = _outputs(rng, n, unseen_confidence)
    return ModelOutputs(target[0], target[1], unseen[0], unseen[1])


@pytest.fixture
def audit():
    rng = np.random.default_rng(0)
    members, _ = _outputs(rng, 600, 0.95)
    nonmembers, _ = _outputs(rng, 600, 0.6)
    return MembershipAudit(members, nonmembers, seed=0)


def test_original_leaks_retrained_is_the_judge_and_overdone_forgetting_is_conspicuous(audit):
    rng = np.random.default_rng(1)
    original = audit.audit("original", _model(rng, 0.95), extra={"test_accuracy": 0.9})
    retrained = audit.audit("fedretrain", _model(rng, 0.6))
    overdone = audit.audit("overdone", _model(rng, 0.3))
    assert original["shadow_f1"] > 0.8 and original["loss_auc"] > 0.95
    assert abs(retrained["loss_auc"] - 0.5) < 0.06
    assert overdone["loss_auc"] < 0.2  # lower than chance: the target stands out the other way
    table = audit.table().set_index("method")
    assert table.loc["original", "verdict"] == "leaks membership"
    assert table.loc["fedretrain", "verdict"] == "as retrained"
    assert table.loc["overdone", "verdict"] == "Streisand effect"
    assert table.loc["fedretrain", "loss_auc_gap"] == 0.0
    expected = original["loss_auc"] - retrained["loss_auc"]
    assert table.loc["original", "loss_auc_gap"] == pytest.approx(expected)
    assert table.loc["original", "test_accuracy"] == 0.9
    assert set(audit.curves["original"]) == {"loss"}
    # 400 members and non-members: gaps under twice a no-signal AUC's std (0.041) are noise
    assert table.loc["original", "tolerance"] == pytest.approx(2 * np.sqrt(801 / (12 * 400 * 400)))


def test_small_gaps_are_sampling_noise_unless_a_tolerance_is_given():
    table = pd.DataFrame(
        {
            "method": ["fedretrain", "a"],
            "loss_auc": [0.50, 0.53],
            "n_members": [135, 135],
            "n_nonmembers": [135, 135],
        }
    )
    assert list(judge(table)["verdict"]) == ["as retrained", "as retrained"]  # 0.03 < 0.07
    assert list(judge(table, tolerance=0.02)["verdict"]) == ["as retrained", "leaks membership"]


def test_offline_lira_uses_reference_models_trained_without_the_target(audit):
    rng = np.random.default_rng(2)
    outputs = _model(rng, 0.95)
    n = len(outputs.target_labels) + len(outputs.unseen_labels)
    labels = np.concatenate([outputs.target_labels, outputs.unseen_labels])
    reference = []
    for _ in range(4):  # models without the target: every sample looks like held-out data
        probs = np.vstack([_outputs(rng, n // 2, 0.6)[0], _outputs(rng, n - n // 2, 0.6)[0]])
        reference.append(logit_confidence(probs, labels))
    row = audit.audit("original", outputs, lira_reference_phi=np.stack(reference))
    assert row["lira_auc"] > 0.9 and 0.0 <= row["lira_tpr@0.1%"] <= 1.0
    assert set(audit.curves["original"]) == {"loss", "lira"}


def test_judge_and_mean_std_refuse_what_they_cannot_judge(audit):
    rng = np.random.default_rng(3)
    audit.audit("original", _model(rng, 0.95))
    with pytest.raises(ConfigError) as error:
        audit.table()
    assert error.value.parameter == "reference"
    with pytest.raises(ConfigError) as error:
        audit.audit("original", _model(rng, 0.95))
    assert error.value.parameter == "name"
    with pytest.raises(ConfigError):
        mean_std([])
    with pytest.raises(ConfigError) as error:
        judge(pd.DataFrame({"method": ["fedretrain"], "loss_auc": [0.5]}), tolerance=-1)
    assert error.value.parameter == "tolerance"


def test_mean_and_std_over_seeds_per_method():
    seeds = [
        pd.DataFrame({"method": ["a", "b"], "auc": [0.5, 0.7], "verdict": ["x", "y"]}),
        pd.DataFrame({"method": ["a", "b"], "auc": [0.7, 0.7], "verdict": ["x", "y"]}),
    ]
    table = mean_std(seeds).set_index("method")
    assert list(table.index) == ["a", "b"]
    assert table.loc["a", "auc"] == pytest.approx(0.6)
    assert table.loc["a", "auc_std"] == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert table.loc["b", "auc_std"] == 0.0 and table.loc["a", "seeds"] == 2


def test_softmax_outputs_are_probabilities():
    model = torch.nn.Linear(3, 4)
    probs = softmax_outputs(model, torch.randn(10, 3), batch_size=3)
    assert probs.shape == (10, 4) and np.allclose(probs.sum(axis=1), 1.0)
    with pytest.raises(ConfigError):
        softmax_outputs(model, torch.randn(0, 3))


def test_a_model_of_another_kind_is_attacked_with_its_own_shadow(audit):
    # A model whose members sit at confidence 0.5 and non-members at 0.3: its outputs look nothing
    # like the original's (0.95 / 0.6), so the original's attack calls everything a non-member,
    # while a shadow fitted on this kind of model finds the members.
    rng = np.random.default_rng(2)
    other = _model(rng, 0.5, unseen_confidence=0.3)
    own = audit.fit_shadow(_outputs(rng, 600, 0.5)[0], _outputs(rng, 600, 0.3)[0])
    with_original = audit.audit("other-with-original-shadow", other)
    with_own = audit.audit("other", other, shadow=own)
    assert with_original["shadow_recall"] < 0.1
    assert with_own["shadow_f1"] > 0.8
    expected = own.evaluate(other.target_probs, other.unseen_probs)
    assert with_own["shadow_f1"] == pytest.approx(expected["f1"])
