"""Known answers and synthetic behaviour of the membership-inference attacks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.membership.attacks import (
    THRESHOLD_SCORES,
    ShadowModelAttack,
    confidence_scores,
    disjoint_indices,
    entropy_scores,
    loss_scores,
    split_held_out,
    threshold_attacks,
)

K = 10


def synthetic_outputs(
    n: int, boost: float, rng: np.random.Generator, k: int = K
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax outputs with the true label's logit raised by ``boost``: higher = member-like."""
    labels = rng.integers(0, k, size=n)
    logits = rng.normal(0.0, 1.0, size=(n, k))
    logits[np.arange(n), labels] += boost + rng.normal(0.0, 0.5, size=n)
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(axis=1, keepdims=True), labels


# ------------------------------------------------------------------------------ score functions


def test_scores_on_hand_made_probs():
    probs = np.array(
        [
            [1.0, 0.0, 0.0, 0.0],  # one-hot, correct
            [0.25, 0.25, 0.25, 0.25],  # uniform
            [0.0, 1.0, 0.0, 0.0],  # one-hot, wrong
            [0.5, 0.5, 0.0, 0.0],
        ]
    )
    labels = np.array([0, 2, 0, 1])
    np.testing.assert_allclose(
        loss_scores(probs, labels), [0.0, math.log(0.25), math.log(1e-12), math.log(0.5)]
    )
    np.testing.assert_allclose(confidence_scores(probs, labels), [1.0, 0.25, 0.0, 0.5])
    expected_entropy = [0.0, -math.log(4), 0.0, -math.log(2)]
    np.testing.assert_allclose(entropy_scores(probs, labels), expected_entropy, atol=1e-10)
    np.testing.assert_allclose(entropy_scores(probs), expected_entropy, atol=1e-10)
    assert set(THRESHOLD_SCORES) == {"loss", "confidence", "entropy"}
    for score in THRESHOLD_SCORES.values():
        assert score(probs, labels).shape == (4,)


def test_scores_accept_float32_softmax_outputs():
    rng = np.random.default_rng(0)
    probs, labels = synthetic_outputs(50, 2.0, rng)
    probs32 = probs.astype(np.float32)
    np.testing.assert_allclose(loss_scores(probs32, labels), loss_scores(probs, labels), atol=1e-5)


@pytest.mark.parametrize(
    ("probs", "labels", "parameter"),
    [
        (np.array([0.5, 0.5]), np.array([0]), "probs"),  # 1-D
        (np.zeros((0, 3)), np.zeros(0, dtype=int), "probs"),  # empty
        (np.array([[0.5, 0.6]]), np.array([0]), "probs"),  # row sum 1.1
        (np.array([[1.5, -0.5]]), np.array([0]), "probs"),  # outside [0, 1]
        (np.array([[np.nan, 1.0]]), np.array([0]), "probs"),
        (np.array([[0.5, 0.5]]), np.array([2]), "labels"),  # out of range
        (np.array([[0.5, 0.5]]), np.array([0, 1]), "labels"),  # wrong length
        (np.array([[0.5, 0.5]]), np.array([0.0]), "labels"),  # not integers
    ],
)
def test_scores_reject_bad_arguments(probs, labels, parameter):
    for score in THRESHOLD_SCORES.values():
        with pytest.raises(ConfigError) as raised:
            score(probs, labels)
        assert raised.value.parameter == parameter


# ----------------------------------------------------------------------------- threshold attacks


def test_threshold_attacks_separate_peaked_members_from_flat_nonmembers():
    rng = np.random.default_rng(1)
    member_probs, member_labels = synthetic_outputs(500, 6.0, rng)
    nonmember_probs, nonmember_labels = synthetic_outputs(500, 1.0, rng)
    results = threshold_attacks(member_probs, member_labels, nonmember_probs, nonmember_labels)
    assert set(results) == {"loss", "confidence", "entropy"}
    for name, summary in results.items():
        assert set(summary) == {"auc", "tpr_at_1pct_fpr", "tpr_at_0.1pct_fpr"}
        assert summary["auc"] > 0.9, name
        assert 0.0 <= summary["tpr_at_0.1pct_fpr"] <= summary["tpr_at_1pct_fpr"] <= 1.0


def test_threshold_attacks_are_at_chance_on_one_distribution():
    rng = np.random.default_rng(2)
    member_probs, member_labels = synthetic_outputs(3000, 3.0, rng)
    nonmember_probs, nonmember_labels = synthetic_outputs(3000, 3.0, rng)
    results = threshold_attacks(member_probs, member_labels, nonmember_probs, nonmember_labels)
    for name, summary in results.items():
        assert summary["auc"] == pytest.approx(0.5, abs=0.03), name


def test_threshold_attacks_reject_mismatched_inputs():
    rng = np.random.default_rng(3)
    probs, labels = synthetic_outputs(10, 2.0, rng)
    narrow, narrow_labels = synthetic_outputs(10, 2.0, rng, k=5)
    with pytest.raises(ConfigError) as raised:
        threshold_attacks(probs, labels, narrow, narrow_labels)
    assert raised.value.parameter == "nonmember_probs"
    with pytest.raises(ConfigError) as raised:
        threshold_attacks(probs, labels[:5], probs, labels)
    assert raised.value.parameter == "member_labels"


# ------------------------------------------------------------------------- shadow-model attack


@pytest.fixture(scope="module")
def fitted_attack() -> ShadowModelAttack:
    rng = np.random.default_rng(10)
    shadow_members, _ = synthetic_outputs(600, 6.0, rng)
    shadow_nonmembers, _ = synthetic_outputs(900, 1.0, rng)  # larger side is subsampled
    attack = ShadowModelAttack(seed=0, n_estimators=50)
    assert attack.fit(shadow_members, shadow_nonmembers) is attack
    assert attack.n_train_per_side_ == 600 and attack.n_classes_ == K
    return attack


def test_shadow_attack_finds_members_of_a_separable_target(fitted_attack):
    rng = np.random.default_rng(11)
    target, _ = synthetic_outputs(300, 6.0, rng)
    unseen, _ = synthetic_outputs(800, 1.0, rng)
    result = fitted_attack.evaluate(target, unseen)
    assert result["n_members"] == 300 and result["n_nonmembers"] == 300
    assert result["f1"] > 0.8
    assert result["precision"] > 0.8 and result["recall"] > 0.8
    assert result["auc"] > 0.9
    member_probability = fitted_attack.member_probability(target)
    assert member_probability.shape == (300,)
    assert np.all((member_probability >= 0) & (member_probability <= 1))
    predicted = fitted_attack.predict(unseen)
    assert predicted.dtype == np.bool_ and predicted.shape == (800,)
    assert predicted.mean() < 0.2


def test_shadow_attack_is_at_chance_when_members_look_like_nonmembers(fitted_attack):
    rng = np.random.default_rng(12)
    # An "unlearned" target: its former members now look like the unseen data.
    target, _ = synthetic_outputs(1000, 3.5, rng)
    unseen, _ = synthetic_outputs(1000, 3.5, rng)
    result = fitted_attack.evaluate(target, unseen)
    assert result["auc"] == pytest.approx(0.5, abs=0.05)
    # Whatever share it flags, it flags about as many non-members: precision near 1/2.
    assert result["precision"] == pytest.approx(0.5, abs=0.06)


def test_shadow_attack_is_seeded_deterministic():
    rng = np.random.default_rng(13)
    members, _ = synthetic_outputs(200, 4.0, rng)
    nonmembers, _ = synthetic_outputs(300, 1.0, rng)
    target, _ = synthetic_outputs(100, 4.0, rng)
    unseen, _ = synthetic_outputs(250, 1.0, rng)
    results = [
        ShadowModelAttack(seed=5, n_estimators=20).fit(members, nonmembers).evaluate(target, unseen)
        for _ in range(2)
    ]
    assert results[0] == results[1]


def test_shadow_attack_errors_before_fit_and_on_shape_mismatch(fitted_attack):
    rng = np.random.default_rng(14)
    probs, _ = synthetic_outputs(20, 2.0, rng)
    narrow, _ = synthetic_outputs(20, 2.0, rng, k=5)
    unfitted = ShadowModelAttack()
    for call in (
        lambda: unfitted.predict(probs),
        lambda: unfitted.member_probability(probs),
        lambda: unfitted.evaluate(probs, probs),
    ):
        with pytest.raises(ConfigError, match="fit"):
            call()
    with pytest.raises(ConfigError) as raised:
        fitted_attack.predict(narrow)
    assert raised.value.parameter == "probs"
    with pytest.raises(ConfigError) as raised:
        fitted_attack.evaluate(probs, narrow)
    assert raised.value.parameter == "unseen_probs"
    with pytest.raises(ConfigError) as raised:
        ShadowModelAttack().fit(probs, narrow)
    assert raised.value.parameter == "nonmember_probs"
    with pytest.raises(ConfigError) as raised:
        ShadowModelAttack().fit(probs[0], probs)
    assert raised.value.parameter == "member_probs"


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"n_estimators": 0}, "n_estimators"),
        ({"max_depth": 0}, "max_depth"),
        ({"learning_rate": 0.0}, "learning_rate"),
    ],
)
def test_shadow_attack_rejects_bad_settings(kwargs, parameter):
    with pytest.raises(ConfigError) as raised:
        ShadowModelAttack(**kwargs)
    assert raised.value.parameter == parameter


# ------------------------------------------------------------------------- held-out bookkeeping


def test_disjoint_indices_raises_naming_the_overlapping_sets():
    disjoint_indices([0, 1], [2, 3], np.array([4]), names=["shadow", "attack_train", "attack_eval"])
    with pytest.raises(ConfigError) as raised:
        disjoint_indices([0, 1], [2, 3, 7], [7, 8], names=["shadow", "attack_train", "attack_eval"])
    assert raised.value.parameter == "attack_train/attack_eval"
    assert "7" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        disjoint_indices([0, 1], [1], names=["a", "b", "c"])
    assert raised.value.parameter == "names"


def test_split_held_out_is_a_seeded_disjoint_cover():
    train, evaluation = split_held_out(101, seed=3)
    assert train.size == 51 and evaluation.size == 50  # 50.5 rounds up
    disjoint_indices(train, evaluation, names=["train", "eval"])
    np.testing.assert_array_equal(np.sort(np.concatenate([train, evaluation])), np.arange(101))
    again = split_held_out(101, seed=3)
    np.testing.assert_array_equal(again[0], train)
    np.testing.assert_array_equal(again[1], evaluation)
    other = split_held_out(101, seed=4)
    assert not np.array_equal(other[0], train)
    small, rest = split_held_out(10, seed=0, fraction=0.2)
    assert small.size == 2 and rest.size == 8


@pytest.mark.parametrize(
    ("args", "parameter"),
    [
        ((1, 0), "n"),
        ((10, -1), "seed"),
        ((10, 0, 0.0), "fraction"),
        ((10, 0, 1.0), "fraction"),
        ((10, 0, 0.01), "fraction"),  # rounds to an empty training part
    ],
)
def test_split_held_out_rejects_bad_arguments(args, parameter):
    with pytest.raises(ConfigError) as raised:
        split_held_out(*args)
    assert raised.value.parameter == parameter


def test_loss_scores_keep_confident_samples_apart():
    # p_y = 1 - 1e-17 and 1 - 1e-19 both round to 1.0 in float64; their losses still differ.
    probs = np.array([[1.0, 1e-17], [1.0, 1e-19], [0.5, 0.5]])
    scores = loss_scores(probs, np.array([0, 0, 0]))
    np.testing.assert_allclose(scores[:2], [-1e-17, -1e-19], rtol=1e-9)
    assert scores[0] < scores[1] and scores[2] == pytest.approx(math.log(0.5))
