"""The challenge's forgetting score: a model population that cannot be told from the retrained one
scores the most, a separable one the least, and F is the reference definition's number."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.judge import (
    bucket_scores,
    challenge_confidence,
    final_score,
    forgetting_score,
    per_example_epsilons,
)


def test_identical_populations_score_the_maximum_and_separable_ones_the_floor():
    rng = np.random.default_rng(0)
    retrained = rng.normal(0.0, 1.0, (16, 30)) + rng.normal(0, 3, 30)
    same = forgetting_score(retrained.copy(), retrained)
    assert same.f == 1.0 and np.all(same.epsilons < 0.5)
    separable = forgetting_score(retrained + 20.0, retrained)
    assert separable.f == 0.0 and np.all(separable.epsilons == 50.0)


def test_same_distribution_sits_well_above_the_floor_and_matches_another_draw():
    # Finite samples: the best of ~160,000 thresholds finds a few models in a tail, so even two
    # draws of one distribution show ε ≈ log(N_tail ratio) ~ 1-2: the reference's ceiling ~0.2.
    rng = np.random.default_rng(1)
    levels = rng.normal(0, 3, 200)
    draw = lambda: levels + rng.normal(0, 1, (32, 200))  # noqa: E731
    first, second = forgetting_score(draw(), draw()).f, forgetting_score(draw(), draw()).f
    shifted = forgetting_score(draw() + 2.0, draw()).f
    assert 0.1 < first < 0.35 and abs(first - second) < 0.08
    assert shifted < first / 3


def test_f_equals_a_hand_computation_from_the_reference_definition():
    # One example, N = 4 models each: retrained {0, 1, 2, 3}, unlearned {1.5, 2.5, 3.5, 4.5}.
    # Every FPR and FNR is a multiple of 1/4; one of them 0 discards the threshold, and no rule
    # separates the overlapping sets perfectly, so ε ≤ log(1 − δ − 1/4) − log(1/4). The single
    # rule "φ ≥ 2.25" attains it (unlearned positive, its median 3 > 1.5): TPR 3/4, FPR 1/4.
    delta = 1e-5
    unlearned = np.array([[1.5], [2.5], [3.5], [4.5]])
    retrained = np.array([[0.0], [1.0], [2.0], [3.0]])
    expected_epsilon = math.log(1 - delta - 0.25) - math.log(0.25)
    assert per_example_epsilons(unlearned, retrained)[0] == pytest.approx(expected_epsilon)
    # ⌈log(N − 1)⌉ = ⌈log 3⌉ = 2: buckets [0, .5), [.5, 1), [1, 1.5), [1.5, 2) worth 1, 1/2, 1/4,
    # 1/8; ε = log 3 ≈ 1.0986 falls in [1, 1.5): 1/4 point.
    assert forgetting_score(unlearned, retrained).f == 0.25


def test_bucket_points_halve_per_half_unit_and_stop_at_log_n_minus_1():
    # N = 32: ⌈log 31⌉ = 4, eight buckets.
    eps = np.array([0.0, 0.49, 0.5, 1.2, 3.99, 4.0, 50.0])
    assert list(bucket_scores(eps, 32)) == [1.0, 1.0, 0.5, 0.25, 0.5**7, 0.0, 0.0]
    assert list(bucket_scores(np.array([0.0]), 2)) == [0.0]  # log 1 = 0: no bucket at all


def test_a_population_far_peakier_than_the_other_gets_the_cap():
    rng = np.random.default_rng(2)
    retrained = rng.normal(0, 1, (8, 1))
    unlearned = np.full((8, 1), retrained.mean())
    unlearned[0, 0] += 1e-4  # range 1e-4 against ~3: below the reference's 1% ratio
    assert per_example_epsilons(unlearned, retrained)[0] == 50.0


def test_the_confidence_is_the_references_logit_scaling():
    logits = np.array([[[2.0, 0.0, 0.0], [0.0, 0.0, 200.0]]], dtype=np.float32)
    phi = challenge_confidence(logits, np.array([0, 2]))
    p = np.exp(2.0) / (np.exp(2.0) + 2.0)
    assert phi[0, 0] == pytest.approx(math.log(p + 1e-45) - math.log(1 - p + 1e-45), rel=1e-6)
    assert phi[0, 1] == pytest.approx(-math.log(1e-45), rel=1e-6)  # saturated, as the reference


def test_final_score_scales_f_by_the_utility_ratios():
    assert final_score(0.5, [0.8, 0.8], [1.0], [0.45, 0.45], [0.9]) == pytest.approx(0.2)
    with pytest.raises(ConfigError) as error:
        final_score(0.5, [0.8], [0.0], [0.5], [0.5])
    assert error.value.parameter == "retrained_retain_accuracy"


@pytest.mark.parametrize(
    ("unlearned", "retrained", "parameter"),
    [
        (np.zeros((1, 3)), np.zeros((4, 3)), "unlearned"),
        (np.zeros((4, 3)), np.zeros((4, 2)), "retrained"),
        (np.full((4, 3), np.nan), np.zeros((4, 3)), "unlearned"),
        (np.zeros(3), np.zeros((4, 3)), "unlearned"),
    ],
)
def test_bad_confidences_are_refused_naming_the_parameter(unlearned, retrained, parameter):
    with pytest.raises(ConfigError) as error:
        per_example_epsilons(unlearned, retrained)
    assert error.value.parameter == parameter
