"""U-LiRA is at chance on populations that cannot be told apart and near certain on separable
ones; offline RMIA is the reference's formula and, with one reference model, finds members at low
false-positive rates that offline LiRA misses."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from fedunlearn.errors import ConfigError
from fedunlearn.judge import attack_summary, rmia_member_scores, rmia_scores, ulira
from fedunlearn.membership.lira import lira_offline


def test_ulira_is_at_chance_on_one_distribution_and_certain_on_separable_ones():
    rng = np.random.default_rng(0)
    levels = rng.normal(0, 3, 300)
    same = ulira(levels + rng.normal(0, 1, (16, 300)), levels + rng.normal(0, 1, (16, 300)))
    assert abs(same.accuracy - 0.5) < 0.03
    assert same.tpr_at_1pct < 0.05
    apart = ulira(levels + 5 + rng.normal(0, 1, (16, 300)), levels + rng.normal(0, 1, (16, 300)))
    assert apart.accuracy > 0.97 and apart.tpr_at_1pct > 0.9
    assert apart.scores.shape == (32, 300) and apart.labels.sum() == 16


def test_ulira_holds_each_model_out_of_the_gaussians_it_is_tested_against():
    # A lone outlier among unlearned models: fitted with it, its own Gaussian would be wide enough
    # to claim it; held out, the retrained Gaussian explains it better.
    unlearned = np.array([[0.0], [0.1], [-0.1], [5.0]])
    retrained = np.array([[4.0], [5.0], [6.0], [5.5]])
    result = ulira(unlearned, retrained)
    assert result.scores[3, 0] < 0 and np.all(result.scores[:3, 0] > 0)


def test_rmia_counts_population_samples_with_a_smaller_relative_likelihood():
    # a = 0.3: Pr(·) = 0.65 · mean over reference models + 0.35. Population z: p(z|θ) = 0.5, 0.9,
    # 0.2 under the target, 0.5, 1.0, 0.0 under the reference: ratios 0.5/0.675 = 0.741,
    # 0.9/1.0 = 0.9, 0.2/0.35 = 0.571. A candidate with p(x|θ) = 0.9 and 0.5 under the reference:
    # 0.9/0.675 = 1.333 beats all three; with p(x|θ) = 0.45: 0.667 beats only 0.571.
    target_z, reference_z = np.array([0.5, 0.9, 0.2]), np.array([[0.5, 1.0, 0.0]])
    strong = rmia_scores(np.array([0.9]), target_z, np.array([[0.5]]), reference_z)
    weak = rmia_scores(np.array([0.45]), target_z, np.array([[0.5]]), reference_z)
    assert strong[0] == 1.0 and weak[0] == pytest.approx(1 / 3)
    # γ = 2 asks for twice the relative likelihood: 1.333 / 2 = 0.667 beats only 0.571.
    assert rmia_scores(np.array([0.9]), target_z, np.array([[0.5]]), reference_z, gamma=2.0)[
        0
    ] == pytest.approx(1 / 3)


def _overfit_world(seed: int, n: int = 2000):
    """Members memorised (confident on every one); easy examples vary wildly across models in
    logit space while their probabilities stay near 1 (saturated softmax)."""
    r = np.random.default_rng(seed)
    d_f, d_p = r.normal(2, 4, n), r.normal(2, 4, 2 * n)
    spread = lambda d: 0.3 + 0.6 * np.maximum(d, 0)  # noqa: E731
    reference_f = d_f + spread(d_f) * r.normal(size=(2, n))
    reference_p = d_p + spread(d_p) * r.normal(size=(2, 2 * n))
    target_f = np.maximum(d_f, 0) + 8 + 0.3 * r.normal(size=n)
    target_p = d_p + spread(d_p) * r.normal(size=2 * n)
    return target_f, target_p, reference_f, reference_p


def test_rmia_with_one_reference_model_beats_offline_lira_at_low_false_positive_rates():
    target_f, target_p, reference_f, reference_p = _overfit_world(0)
    members, nonmembers = rmia_member_scores(
        expit(target_f)[None],
        expit(target_p)[None],
        expit(reference_f[:1]),
        expit(reference_p[:1]),
    )
    rmia_tpr = attack_summary(members, nonmembers)[1]
    # LiRA needs two reference models for a variance; it gets both and still finds fewer.
    lira = lira_offline(np.r_[target_f, target_p], np.c_[reference_f, reference_p])
    lira_tpr = attack_summary(lira[: len(target_f)], lira[len(target_f) :])[1]
    assert rmia_tpr > 3 * lira_tpr and rmia_tpr > 0.01


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ((np.zeros((2, 3)), np.zeros((4, 3))), "unlearned"),
        ((np.zeros((4, 3)), np.full((4, 3), np.nan)), "retrained"),
    ],
)
def test_ulira_refuses_bad_inputs(arguments, parameter):
    with pytest.raises(ConfigError) as error:
        ulira(*arguments)
    assert error.value.parameter == parameter


def test_rmia_refuses_bad_inputs():
    good = dict(
        target_x=np.array([0.5]),
        target_z=np.array([0.5, 0.2]),
        reference_x=np.array([[0.5]]),
        reference_z=np.array([[0.5, 0.2]]),
    )
    for key, value, parameter in (
        ("target_x", np.array([np.nan]), "target_x"),
        ("target_z", np.array([1.5, 0.2]), "target_z"),
        ("reference_x", np.array([[0.5, 0.5]]), "reference_x"),
    ):
        with pytest.raises(ConfigError) as error:
            rmia_scores(**{**good, key: value})
        assert error.value.parameter == parameter
    with pytest.raises(ConfigError) as error:
        rmia_scores(**good, offline_a=1.0)
    assert error.value.parameter == "offline_a"
