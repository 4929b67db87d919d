"""Tests of the likelihood-ratio attack (Carlini et al. 2022) on synthetic confidences."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from fedunlearn.errors import ConfigError
from fedunlearn.membership.lira import (
    PROB_FLOOR,
    LiraReference,
    lira_offline,
    lira_online,
    logit_confidence,
)

N_EXAMPLES = 2000
N_REFERENCES = 8
SHIFT = 2.0


def _synthetic(seed: int = 0, shift: float = SHIFT, m: int = N_REFERENCES):
    """Per-example offsets μ_i ~ N(0, 3²); members φ ~ N(μ_i + shift, 1), others N(μ_i, 1)."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 3.0, size=N_EXAMPLES)
    member = rng.random(N_EXAMPLES) < 0.5
    target = mu + shift * member + rng.normal(size=N_EXAMPLES)
    ref_out = mu + rng.normal(size=(m, N_EXAMPLES))
    ref_in = mu + shift + rng.normal(size=(m, N_EXAMPLES))
    return member, target, ref_in, ref_out


# ------------------------------------------------------------------------- logit_confidence


def test_logit_confidence_matches_log_odds_on_moderate_values():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(5), size=200)
    labels = rng.integers(0, 5, size=200)
    p = probs[np.arange(200), labels]
    np.testing.assert_allclose(logit_confidence(probs, labels), np.log(p / (1 - p)), rtol=1e-9)


def test_logit_confidence_is_finite_at_zero_and_one():
    probs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    phi = logit_confidence(probs, np.array([0, 0, 2]))
    assert np.all(np.isfinite(phi))
    bound = -np.log(PROB_FLOOR)
    np.testing.assert_allclose(phi, [bound, -bound, -bound])


def test_logit_confidence_keeps_resolution_near_one():
    # 1 − p_y is summed from the other classes, not subtracted: φ = log(1e10) even though
    # 1 − (1 − 1e-10) carries a relative rounding error in float64.
    probs = np.array([[1.0 - 1e-10, 0.5e-10, 0.5e-10]])
    np.testing.assert_allclose(logit_confidence(probs, np.array([0])), [np.log(1e10)], rtol=1e-5)


@pytest.mark.parametrize(
    ("probs", "labels", "parameter"),
    [
        (np.full(3, 1 / 3), np.array([0]), "probs"),
        (np.array([[0.5, np.nan]]), np.array([0]), "probs"),
        (np.array([[1.5, -0.5]]), np.array([0]), "probs"),
        (np.array([[2.0, 3.0]]), np.array([0]), "probs"),  # logits, not probabilities
        (np.array([[0.5, 0.5]]), np.array([0, 1]), "labels"),
        (np.array([[0.5, 0.5]]), np.array([2]), "labels"),
        (np.array([[0.5, 0.5]]), np.array([0.0]), "labels"),
    ],
)
def test_logit_confidence_rejects_bad_input(probs, labels, parameter):
    with pytest.raises(ConfigError) as error:
        logit_confidence(probs, labels)
    assert error.value.parameter == parameter


# ------------------------------------------------------------------------- attacks


def test_offline_beats_global_threshold_under_per_example_offsets():
    member, target, _, ref_out = _synthetic()
    auc_lira = roc_auc_score(member, lira_offline(target, ref_out))
    auc_threshold = roc_auc_score(member, target)  # one threshold on φ for all examples
    assert auc_lira > 0.85
    assert auc_threshold < 0.75
    assert auc_lira > auc_threshold + 0.1


def test_offline_per_example_variance_also_works():
    member, target, _, ref_out = _synthetic(m=16)
    scores = lira_offline(target, ref_out, global_variance=False)
    assert roc_auc_score(member, scores) > 0.85


def test_online_at_least_as_good_as_offline():
    member, target, ref_in, ref_out = _synthetic(seed=2)
    auc_offline = roc_auc_score(member, lira_offline(target, ref_out))
    auc_online = roc_auc_score(member, lira_online(target, ref_in, ref_out))
    assert auc_offline > 0.85
    assert auc_online > 0.85
    assert auc_online >= auc_offline - 0.01


@pytest.mark.parametrize("online", [False, True])
def test_identical_distributions_give_chance(online):
    member, target, _, ref_out = _synthetic(seed=3, shift=0.0)
    if online:
        # IN references shifted, but the target's members are not: no signal remains either way.
        _, _, ref_in, _ = _synthetic(seed=4)
        scores = lira_online(target, ref_in, ref_out)
    else:
        scores = lira_offline(target, ref_out)
    assert abs(roc_auc_score(member, scores) - 0.5) < 0.05


def test_offline_score_is_the_gaussian_log_cdf():
    # Two references per example, 0 and 2: mean 1, sample variance 2 for every example.
    ref_out = np.array([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]) + np.array([0.0, 5.0, -3.0])
    target = np.array([1.0, 7.0, -4.0])
    expected = norm.logcdf(target, loc=ref_out.mean(axis=0), scale=np.sqrt(2.0))
    np.testing.assert_allclose(lira_offline(target, ref_out), expected)
    np.testing.assert_allclose(lira_offline(target, ref_out, global_variance=False), expected)
    # A target exactly at the OUT mean sits at the median: log(1/2).
    np.testing.assert_allclose(lira_offline(np.array([1.0, 6.0, -2.0]), ref_out), np.log(0.5))


def test_global_variance_is_mean_of_per_example_variances():
    ref_out = np.array([[0.0, 0.0], [2.0, 4.0]])  # variances 2 and 8 → pooled 5
    target = np.array([3.0, 3.0])
    expected = norm.logcdf(target, loc=[1.0, 2.0], scale=np.sqrt(5.0))
    np.testing.assert_allclose(lira_offline(target, ref_out), expected)
    per_example = norm.logcdf(target, loc=[1.0, 2.0], scale=np.sqrt([2.0, 8.0]))
    np.testing.assert_allclose(lira_offline(target, ref_out, global_variance=False), per_example)


def test_online_score_is_the_gaussian_log_likelihood_ratio():
    ref_in = np.array([[2.0, 3.0], [4.0, 5.0]])
    ref_out = np.array([[0.0, -1.0], [1.0, 0.0]])
    target = np.array([2.5, 0.5])
    expected = norm.logpdf(target, [3.0, 4.0], np.sqrt(2.0)) - norm.logpdf(
        target, [0.5, -0.5], np.sqrt(0.5)
    )
    np.testing.assert_allclose(lira_online(target, ref_in, ref_out), expected)


def test_min_std_floors_constant_references():
    ref_out = np.zeros((3, 2))
    scores = lira_offline(np.array([-1.0, 1.0]), ref_out, min_std=0.5)
    np.testing.assert_allclose(scores, norm.logcdf([-2.0, 2.0]))


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: lira_offline(np.zeros(3), np.zeros((4, 2))), "reference_out_phi"),
        (lambda: lira_offline(np.zeros(3), np.zeros(3)), "reference_out_phi"),
        (lambda: lira_offline(np.zeros(3), np.zeros((1, 3))), "reference_out_phi"),
        (lambda: lira_offline(np.zeros((3, 1)), np.zeros((4, 3))), "target_phi"),
        (lambda: lira_offline(np.array([0.0, np.nan]), np.zeros((4, 2))), "target_phi"),
        (
            lambda: lira_offline(np.zeros(2), np.array([[0.0, 1.0], [np.nan, 0.0]])),
            "reference_out_phi",
        ),
        (lambda: lira_offline(np.zeros(2), np.zeros((4, 2)), min_std=0.0), "min_std"),
        (lambda: lira_online(np.zeros(2), np.zeros((1, 2)), np.zeros((4, 2))), "reference_in_phi"),
        (lambda: lira_online(np.zeros(2), np.zeros((4, 3)), np.zeros((4, 2))), "reference_in_phi"),
        (lambda: lira_online(np.zeros(2), np.zeros((4, 2)), np.zeros((1, 2))), "reference_out_phi"),
        (
            lambda: lira_online(np.zeros(2), np.full((2, 2), np.inf), np.zeros((2, 2))),
            "reference_in_phi",
        ),
    ],
)
def test_attacks_reject_bad_input(call, parameter):
    with pytest.raises(ConfigError) as error:
        call()
    assert error.value.parameter == parameter


# ------------------------------------------------------------------------- LiraReference


def test_reference_accumulation_equals_direct_calls():
    member, target, ref_in, ref_out = _synthetic(seed=5)
    reference = LiraReference()
    all_in = np.ones(N_EXAMPLES, dtype=bool)
    for row in ref_out:
        reference.add_model(row)
    for row in ref_in:
        reference.add_model(row, in_mask=all_in)
    assert reference.n_models == 2 * N_REFERENCES
    assert np.all(reference.in_counts() == N_REFERENCES)
    assert np.all(reference.out_counts() == N_REFERENCES)
    for global_variance in (True, False):
        np.testing.assert_allclose(
            reference.scores(target, global_variance=global_variance),
            lira_offline(target, ref_out, global_variance=global_variance),
        )
        np.testing.assert_allclose(
            reference.scores(target, online=True, global_variance=global_variance),
            lira_online(target, ref_in, ref_out, global_variance=global_variance),
        )


def test_reference_with_random_halves_attacks_well():
    # The paper's setup: each reference model trains on a random half of the examples.
    rng = np.random.default_rng(6)
    mu = rng.normal(0.0, 3.0, size=N_EXAMPLES)
    member = rng.random(N_EXAMPLES) < 0.5
    target = mu + SHIFT * member + rng.normal(size=N_EXAMPLES)
    reference = LiraReference(n_examples=N_EXAMPLES)
    for _ in range(16):
        in_mask = rng.random(N_EXAMPLES) < 0.5
        reference.add_model(mu + SHIFT * in_mask + rng.normal(size=N_EXAMPLES), in_mask=in_mask)
    counts = reference.out_counts()
    assert counts.min() < counts.max()  # variable numbers of observations per example
    offline = reference.scores(target)
    online = reference.scores(target, online=True)
    valid = np.isfinite(offline) & np.isfinite(online)
    assert valid.mean() > 0.99
    assert roc_auc_score(member[valid], offline[valid]) > 0.85
    assert roc_auc_score(member[valid], online[valid]) > 0.85


def test_reference_variable_counts_nan_and_pooled_fallback():
    reference = LiraReference()
    # Example 0: OUT in all three models; example 1: OUT once; example 2: never OUT.
    reference.add_model(np.array([0.0, 10.0, 5.0]), in_mask=np.array([False, False, True]))
    reference.add_model(np.array([2.0, 11.0, 6.0]), in_mask=np.array([False, True, True]))
    reference.add_model(np.array([4.0, 12.0, 7.0]), in_mask=np.array([False, True, True]))
    np.testing.assert_array_equal(reference.out_counts(), [3, 1, 0])
    np.testing.assert_array_equal(reference.in_counts(), [0, 2, 3])
    target = np.array([3.0, 9.0, 6.0])
    for global_variance in (True, False):
        # Only example 0 has ≥ 2 OUT observations: pooled variance = its variance, 4.
        scores = reference.scores(target, global_variance=global_variance)
        np.testing.assert_allclose(scores[:2], norm.logcdf([3.0, 9.0], loc=[2.0, 10.0], scale=2.0))
        assert np.isnan(scores[2])
    online = reference.scores(target, online=True)
    assert np.isnan(online[0]) and np.isnan(online[2])  # no IN / no OUT observation
    # Example 1: IN mean 11.5; pooled IN variance over examples 1 and 2:
    # (0.5 + 2) / (1 + 2) = 5/6; OUT: mean 10, pooled variance 4.
    expected = norm.logpdf(9.0, 11.5, np.sqrt(5 / 6)) - norm.logpdf(9.0, 10.0, 2.0)
    np.testing.assert_allclose(online[1], expected)


def test_reference_rejects_bad_input():
    reference = LiraReference()
    with pytest.raises(ConfigError) as error:
        reference.scores(np.zeros(2))
    assert error.value.parameter == "reference"
    reference.add_model(np.zeros(3))
    with pytest.raises(ConfigError) as error:
        reference.scores(np.zeros(3))  # one model: no variance can be estimated
    assert error.value.parameter == "out_phi"
    with pytest.raises(ConfigError) as error:
        reference.add_model(np.zeros(4))
    assert error.value.parameter == "phi_row"
    with pytest.raises(ConfigError) as error:
        reference.add_model(np.array([0.0, np.nan, 1.0]))
    assert error.value.parameter == "phi_row"
    with pytest.raises(ConfigError) as error:
        reference.add_model(np.zeros(3), in_mask=np.array([1, 0, 1]))
    assert error.value.parameter == "in_mask"
    reference.add_model(np.ones(3))
    with pytest.raises(ConfigError) as error:
        reference.scores(np.zeros(2))
    assert error.value.parameter == "target_phi"
    with pytest.raises(ConfigError) as error:
        reference.scores(np.zeros(3), online=True)  # no IN observations at all
    assert error.value.parameter == "in_phi"
    with pytest.raises(ConfigError) as error:
        reference.scores(np.zeros(3), min_std=-1.0)
    assert error.value.parameter == "min_std"


def test_logit_confidence_resolves_confidences_beyond_1e_minus_12():
    probs = np.array([[1.0 - 1e-15, 1e-15], [1.0 - 1e-20, 1e-20], [1.0, 1e-30]])
    phi = logit_confidence(probs, np.array([0, 0, 0]))
    np.testing.assert_allclose(phi, [np.log(1e15), np.log(1e20), np.log(1e30)], rtol=1e-6)
