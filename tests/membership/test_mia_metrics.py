"""Known answers for the membership-inference metrics (AUC, exact TPR at FPR, P/R/F1)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from fedunlearn.errors import ConfigError
from fedunlearn.membership.metrics import (
    precision_recall_f1,
    roc_auc,
    roc_points,
    threshold_summary,
    tpr_at_fpr,
)

MEMBERS = [0.9, 0.8, 0.4]
NONMEMBERS = [0.85, 0.3, 0.2, 0.1]


def test_perfectly_separable_scores_give_auc_one_and_full_tpr_at_any_fpr():
    members = np.linspace(2.0, 3.0, 50)
    nonmembers = np.linspace(0.0, 1.0, 70)
    assert roc_auc(members, nonmembers) == 1.0
    for fpr in (0.0, 0.001, 0.01, 0.5, 1.0):
        assert tpr_at_fpr(members, nonmembers, fpr) == 1.0
    assert threshold_summary(members, nonmembers) == {
        "auc": 1.0,
        "tpr_at_1pct_fpr": 1.0,
        "tpr_at_0.1pct_fpr": 1.0,
    }
    # Reversed: every member below every non-member.
    assert roc_auc(nonmembers, members) == 0.0
    assert tpr_at_fpr(nonmembers, members, 0.5) == 0.0


def test_identical_distributions_give_auc_near_one_half():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(size=20_000), rng.normal(size=20_000)
    assert roc_auc(members, nonmembers) == pytest.approx(0.5, abs=0.02)
    # At chance, TPR at FPR <= f is about f.
    assert tpr_at_fpr(members, nonmembers, 0.1) == pytest.approx(0.1, abs=0.02)


def test_tpr_at_fpr_hand_case():
    # Thresholds (member iff score >= t), with (TP, FP) out of (3, 4):
    #   t=inf: (0, 0); 0.9: (1, 0); 0.85: (1, 1); 0.8: (2, 1); 0.4: (3, 1); 0.3: (3, 2); ...
    assert tpr_at_fpr(MEMBERS, NONMEMBERS, 0.0) == pytest.approx(1 / 3)
    assert tpr_at_fpr(MEMBERS, NONMEMBERS, 0.2) == pytest.approx(1 / 3)  # 0.2 * 4 < 1 FP
    assert tpr_at_fpr(MEMBERS, NONMEMBERS, 0.25) == 1.0  # t = 0.4 lets only 0.85 through
    assert tpr_at_fpr(MEMBERS, NONMEMBERS, 1.0) == 1.0
    # Pairs a member wins: 0.9 beats 4, 0.8 beats 3, 0.4 beats 3 -> 10 of 12.
    assert roc_auc(MEMBERS, NONMEMBERS) == pytest.approx(10 / 12)


def test_tpr_at_fpr_moves_ties_together():
    members = [0.9, 0.5, 0.5]
    nonmembers = [0.5, 0.1]
    # t = 0.5 catches both tied members but also the tied non-member (FPR 1/2).
    assert tpr_at_fpr(members, nonmembers, 0.0) == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, nonmembers, 0.49) == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, nonmembers, 0.5) == 1.0
    # AUC: 0.9 beats both (2); each 0.5 ties one (1/2) and beats one (1) -> 5 of 6.
    assert roc_auc(members, nonmembers) == pytest.approx(5 / 6)
    # All scores tied: nothing can be called a member without FPR 1.
    assert tpr_at_fpr([1.0, 1.0], [1.0, 1.0, 1.0], 0.99) == 0.0
    assert tpr_at_fpr([1.0, 1.0], [1.0, 1.0, 1.0], 1.0) == 1.0
    assert roc_auc([1.0, 1.0], [1.0, 1.0, 1.0]) == 0.5


def test_tpr_at_fpr_absorbs_float_rounding_of_the_budget():
    # Members 1..100 interleave with non-members 0.5..99.5: t = k lets 101 - k members and
    # 100 - k non-members through, so FP <= b allows TPR (b + 1) / 100.
    members, nonmembers = np.arange(1.0, 101.0), np.arange(100.0) + 0.5
    # 0.29 * 100 = 28.999999999999996 in floating point; still 29 false positives are allowed.
    assert tpr_at_fpr(members, nonmembers, 0.29) == pytest.approx(0.30)
    assert tpr_at_fpr(members, nonmembers, 0.28) == pytest.approx(0.29)
    assert tpr_at_fpr(members, nonmembers, 0.0) == pytest.approx(0.01)


def test_roc_auc_equals_sklearn_and_tpr_matches_brute_force_on_random_data():
    rng = np.random.default_rng(1)
    for trial in range(5):
        # Rounded scores so that there are many ties.
        members = np.round(rng.normal(0.3, 1.0, size=200 + trial), 1)
        nonmembers = np.round(rng.normal(0.0, 1.0, size=150), 1)
        truth = np.r_[np.ones(members.size), np.zeros(nonmembers.size)]
        expected = roc_auc_score(truth, np.r_[members, nonmembers])
        assert roc_auc(members, nonmembers) == pytest.approx(expected, abs=1e-12)
        for fpr in (0.0, 0.01, 0.1, 0.37):
            best = 0.0
            for t in np.r_[np.unique(np.r_[members, nonmembers]), np.inf]:
                if np.mean(nonmembers >= t) <= fpr:
                    best = max(best, float(np.mean(members >= t)))
            assert tpr_at_fpr(members, nonmembers, fpr) == pytest.approx(best)


def test_roc_points_span_zero_to_one_and_match_sklearn():
    fpr, tpr = roc_points(MEMBERS, NONMEMBERS)
    assert fpr[0] == 0.0 and tpr[0] == 0.0 and fpr[-1] == 1.0 and tpr[-1] == 1.0
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    truth = np.r_[np.ones(3), np.zeros(4)]
    ref_fpr, ref_tpr, _ = roc_curve(truth, np.r_[MEMBERS, NONMEMBERS], drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr)
    np.testing.assert_allclose(tpr, ref_tpr)
    # Hand values: (0,0), (0,1/3), (1/4,1/3), (1/4,2/3), (1/4,1), (1/2,1), (3/4,1), (1,1).
    np.testing.assert_allclose(fpr, [0, 0, 0.25, 0.25, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(tpr, [0, 1 / 3, 1 / 3, 2 / 3, 1, 1, 1, 1])


def test_precision_recall_f1_hand_case():
    # 3 of 4 members flagged, 1 of 4 non-members flagged: P = 3/4, R = 3/4, F1 = 3/4.
    result = precision_recall_f1([True, True, True, False], [True, False, False, False])
    assert result == pytest.approx({"precision": 0.75, "recall": 0.75, "f1": 0.75})
    # 1 of 2 members, 3 of 3 non-members: P = 1/4, R = 1/2, F1 = 2 * (1/8) / (3/4) = 1/3.
    result = precision_recall_f1(np.array([1, 0]), np.array([1, 1, 1]))
    assert result == pytest.approx({"precision": 0.25, "recall": 0.5, "f1": 1 / 3})


def test_precision_recall_f1_degenerate_cases():
    assert precision_recall_f1([False, False], [False]) == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
    }
    assert precision_recall_f1([False], [True, True]) == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
    }
    assert precision_recall_f1([True, True], []) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


@pytest.mark.parametrize(
    ("members", "nonmembers", "parameter"),
    [
        ([], [0.1], "member_scores"),
        ([0.1], [], "nonmember_scores"),
        ([[0.1, 0.2]], [0.1], "member_scores"),
        ([0.1], [np.nan], "nonmember_scores"),
        ([np.inf], [0.1], "member_scores"),
        (["a"], [0.1], "member_scores"),
    ],
)
def test_bad_scores_raise_config_error_naming_the_argument(members, nonmembers, parameter):
    for function in (roc_auc, roc_points, threshold_summary):
        with pytest.raises(ConfigError) as raised:
            function(members, nonmembers)
        assert raised.value.parameter == parameter
    with pytest.raises(ConfigError) as raised:
        tpr_at_fpr(members, nonmembers, 0.1)
    assert raised.value.parameter == parameter


@pytest.mark.parametrize("fpr", [-0.01, 1.01, float("nan"), "0.1", None, True])
def test_bad_fpr_raises(fpr):
    with pytest.raises(ConfigError) as raised:
        tpr_at_fpr(MEMBERS, NONMEMBERS, fpr)
    assert raised.value.parameter == "fpr"


def test_bad_predictions_raise():
    with pytest.raises(ConfigError) as raised:
        precision_recall_f1([], [True])
    assert raised.value.parameter == "predicted_members_among_members"
    with pytest.raises(ConfigError) as raised:
        precision_recall_f1([True], [0.3])
    assert raised.value.parameter == "predicted_members_among_nonmembers"
    with pytest.raises(ConfigError) as raised:
        precision_recall_f1([[True]], [True])
    assert raised.value.parameter == "predicted_members_among_members"
