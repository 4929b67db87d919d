"""Flags and adoption: a row that must not read as a result is flagged, and a request never
adopts (by ``auto``) a model below tolerance or flagged."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedunlearn.unlearning.forgetting import MIN_SIGNAL_POINTS, MIN_TARGET_SAMPLES
from fedunlearn.unlearning.verdicts import (
    AdoptionRefused,
    choose_adoption,
    flag_rows,
    forgetting_labels,
    training_flag,
)


def _table(**rows) -> pd.DataFrame:
    """``method=(test_accuracy, l2_to_fedretrain[, test_loss[, l2_to_original]])``."""
    out = []
    for method, values in rows.items():
        accuracy, l2, loss, original = (*values, 0.1, 1.0)[:4]
        out.append(
            {
                "method": method,
                "test_accuracy": accuracy,
                "l2_to_fedretrain": l2,
                "test_loss": loss,
                "l2_to_original": original,
            }
        )
    return pd.DataFrame(out)


def _flags(table, gap=5.0, attack_forgotten=True) -> dict[str, str]:
    return dict(zip(table["method"], flag_rows(table, gap, attack_forgotten)))


# ------------------------------------------------------------------ the original's training
def test_the_suites_collapsed_mnist_training_is_flagged():
    # results of MNIST, lr 0.05, Dirichlet(0.1), seed 2: learned to 0.4875, then 0.0982
    curve = [0.0878, 0.1142, 0.4875, 0.1135, *[0.0982] * 7]
    assert training_flag(curve).startswith("training collapsed: final test accuracy 0.0982")


def test_a_training_that_learned_nothing_or_diverged_is_flagged():
    assert training_flag([0.1311, 0.11, 0.1022]).startswith("training learned nothing")
    assert training_flag([0.1, 0.8, math.nan]).startswith("training diverged")


@given(
    initial=st.floats(0.0, 0.3),
    best=st.floats(0.4, 1.0),
    share=st.floats(0.5, 1.0),
    wiggle=st.lists(st.floats(0.0, 1.0), max_size=8),
)
def test_a_training_that_learned_and_kept_half_its_best_is_not_flagged(
    initial, best, share, wiggle
):
    # label shards oscillate: a final round well below the best is still a trained model
    final = max(share * best, initial + 0.06)
    curve = [initial, *[w * best for w in wiggle], best, final]
    assert training_flag(curve) == ""


# ------------------------------------------------------------------ flags
def test_the_issues_rows_are_flagged():
    table = _table(
        fedavg=(0.981, 2.159),
        fedrecover=(0.096, 6.5e7),  # diverged, 88.5 points below
        crab=(0.975, 2.164, 0.1, 0.2),  # close in accuracy, but it stayed by the original
        federaser=(0.576, 1.2),  # 36 points below
        sifu=(0.979, 0.9),
        fedretrain=(0.981, 0.0),
    )
    flags = _flags(table)
    assert "88.5 points below fedretrain" in flags["fedrecover"]
    assert flags["crab"].startswith("forgot nothing") and "L2 0.2 from it" in flags["crab"]
    assert "40.5 points below" in flags["federaser"]
    assert flags["sifu"] == flags["fedavg"] == flags["fedretrain"] == ""


def test_a_non_finite_row_is_flagged_diverged_whatever_else():
    table = _table(fedavg=(0.9, 1.0), fedrecover=(0.9, 0.5, math.nan), fedretrain=(0.9, 0.0))
    assert _flags(table)["fedrecover"].startswith("diverged")
    table = _table(fedavg=(0.9, 1.0), fedretrain=(0.1, 0.0, math.inf))
    assert _flags(table)["fedretrain"].startswith("diverged")


def test_without_fedretrain_rows_are_held_to_the_original():
    table = _table(
        fedavg=(0.95, math.nan), federaser=(0.85, math.nan), crab=(0.94, math.nan, 0.2, 0.0)
    )
    flags = _flags(table)
    assert "10.0 points below original" in flags["federaser"]
    assert flags["crab"] == "forgot nothing: it is the original model"


@given(
    reference=st.floats(0.0, 1.0),
    accuracy=st.floats(0.0, 1.0),
    gap=st.floats(0.0, 100.0),
    span=st.floats(0.0, 10.0),
    moved=st.floats(0.0, 10.0),
)
def test_a_row_below_the_gap_or_by_the_original_is_never_unflagged(
    reference, accuracy, gap, span, moved
):
    table = _table(
        fedavg=(reference, span, 0.1, 0.0),
        method=(accuracy, 1.0, 0.1, moved),
        fedretrain=(reference, 0.0, 0.1, span),
    )
    flag = _flags(table, gap)["method"]
    must = 100 * (reference - accuracy) > gap or moved <= 0.25 * span
    assert bool(flag) == must


def test_models_retrained_elsewhere_are_not_said_to_have_forgotten_nothing():
    """The digits-shards run: SIFU retrained from a noised M^1 lands farther from FedRetrain
    (2.03) than the original is (1.43), and farther still from the original (2.29)."""
    table = _table(
        fedavg=(0.647, 1.43, 0.1, 0.0), sifu=(0.76, 2.03, 0.1, 2.29), fedretrain=(0.80, 0.0)
    )
    assert _flags(table)["sifu"] == ""


# ------------------------------------------------------------------ adoption
def _adopt(table, candidates=("federaser", "fedretrain"), explicit=None, tolerance=1.0, gap=5.0):
    return choose_adoption(
        table, flag_rows(table, gap), list(candidates), explicit=explicit, tolerance=tolerance
    )


def test_the_shards_case_adopts_fedretrain_and_says_why():
    # FedEraser on digits label shards, forget clients 2 and 5: 0.576 against FedRetrain's 0.938
    table = _table(fedavg=(0.95, 3.0), federaser=(0.576, 2.0), fedretrain=(0.938, 0.0))
    adoption = _adopt(table, gap=100.0)  # not even flagged: the tolerance alone refuses it
    assert adoption.method == "fedretrain"
    assert "federaser is 36.20 points below fedretrain (adopt-tolerance 1)" in adoption.reason


def test_fedeaser_within_tolerance_is_adopted():
    table = _table(fedavg=(0.98, 3.0), federaser=(0.9745, 1.0), fedretrain=(0.98, 0.0))
    adoption = _adopt(table)
    assert adoption.method == "federaser" and "within adopt-tolerance 1" in adoption.reason
    assert _adopt(table, tolerance=0.5).method == "fedretrain"


@given(federaser=st.floats(0.0, 1.0), fedretrain=st.floats(0.0, 1.0), tolerance=st.floats(0, 100))
def test_auto_never_adopts_a_model_below_tolerance(federaser, fedretrain, tolerance):
    table = _table(fedavg=(1.0, 3.0), federaser=(federaser, 1.0), fedretrain=(fedretrain, 0.0))
    adoption = _adopt(table, tolerance=tolerance, gap=100.0)
    if adoption.method == "federaser":
        assert 100 * (fedretrain - federaser) <= tolerance


def test_without_fedretrain_a_flagged_model_is_refused_and_the_error_says_what_to_do():
    table = _table(fedavg=(0.95, math.nan), federaser=(0.6, math.nan))
    with pytest.raises(AdoptionRefused) as refused:
        _adopt(table, candidates=["federaser"])
    assert refused.value.parameter == "unlearn-methods"
    assert "federaser is flagged (35.0 points below original" in str(refused.value)
    assert "Nothing was adopted or deleted" in str(refused.value)
    unflagged = _table(fedavg=(0.95, math.nan), federaser=(0.94, math.nan))
    assert _adopt(unflagged, candidates=["federaser"]).method == "federaser"


def test_a_diverged_fedretrain_is_not_adopted_either():
    table = _table(fedavg=(0.95, 1.0), federaser=(0.2, 2.0), fedretrain=(0.1, 0.0, math.nan))
    with pytest.raises(AdoptionRefused, match="fedretrain is flagged \\(diverged"):
        _adopt(table)


def test_an_explicit_choice_is_adopted_and_a_flag_is_said():
    table = _table(fedavg=(0.95, 3.0), federaser=(0.576, 2.0), fedretrain=(0.938, 0.0))
    adoption = _adopt(table, candidates=["federaser"], explicit="federaser")
    assert adoption.method == "federaser"
    assert "unlearn-adopt names it; it is FLAGGED (36.2 points below" in adoption.reason


def _attacked(table: pd.DataFrame, **success) -> pd.DataFrame:
    return table.assign(attack_success=[success.get(m, math.nan) for m in table["method"]])


def test_a_method_that_kept_the_backdoor_is_flagged_however_far_it_moved():
    # The MNIST recovery run: FedRetrain 0.25% backdoor success; PGA left 25.6% at accuracy within
    # a point, a model far from the original (no "forgot nothing" by L2).
    table = _table(fedavg=(0.984, 5.2), fedretrain=(0.982, 0.0), pga=(0.977, 4.0, 0.1, 4.9))
    table = _attacked(table, fedavg=0.999, fedretrain=0.0025, pga=0.2563)
    flags = _flags(table)
    assert flags["pga"].startswith("kept the attack: success 0.2563, 25.4 points")
    assert "points above fedretrain" in flags["pga"]
    assert flags["fedretrain"] == flags["fedavg"] == ""
    # Not a request that forgets an attacker: the attack's success is no measure of forgetting.
    assert dict(zip(table["method"], flag_rows(table, 5.0)))["pga"] == ""


def test_the_backdoors_success_replaces_the_l2_guess_of_forgot_nothing():
    # FedOSD on MNIST: backdoor 99.9% -> 2.8% with a small, targeted change (L2 1.25 from the
    # original against 5.24 between the original and FedRetrain) read as "forgot nothing".
    table = _table(fedavg=(0.984, 5.24), fedretrain=(0.982, 0.0), fedosd=(0.979, 5.0, 0.1, 1.25))
    assert _flags(table, 5.0)["fedosd"].startswith("forgot nothing")  # no attack measured
    attacked = _attacked(table, fedavg=0.999, fedretrain=0.0028, fedosd=0.0283)
    assert dict(zip(attacked["method"], flag_rows(attacked, 5.0, True)))["fedosd"] == ""
    # A NaN success (scaled-update: no trigger to test) leaves the L2 test in place.
    nan = _attacked(table, fedavg=math.nan, fedretrain=math.nan, fedosd=math.nan)
    assert dict(zip(nan["method"], flag_rows(nan, 5.0, True)))["fedosd"].startswith("forgot")


@given(
    kept=st.floats(0, 1),
    retrained=st.floats(0, 0.8),
    gap=st.floats(0, 50),
    accuracy_below=st.floats(0, 0.5),
)
def test_a_row_more_than_the_gap_above_on_attack_or_below_on_accuracy_is_always_flagged(
    kept, retrained, gap, accuracy_below
):
    # the original holds the backdoor (1.0) at least 20 points above FedRetrain: measurable
    table = _table(fedavg=(0.98, 3.0), fedretrain=(0.98, 0.0), m=(0.98 - accuracy_below, 2.0))
    table = _attacked(table, fedavg=1.0, fedretrain=retrained, m=kept)
    flag = dict(zip(table["method"], flag_rows(table, gap, True)))["m"]
    if 100 * accuracy_below > gap + 1e-9 or 100 * (kept - retrained) > gap + 1e-9:
        assert flag != ""
    elif 100 * accuracy_below < gap - 1e-9 and 100 * (kept - retrained) < gap - 1e-9:
        assert flag == ""


@given(
    original=st.floats(0, 1),
    retrained=st.floats(0, 1),
    kept=st.floats(0, 1),
    gap=st.floats(0, 50),
    samples=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_no_row_passes_where_the_signal_cannot_measure_forgetting(
    original, retrained, kept, gap, samples
):
    # any calibration the API accepts: a row passes only where the original learned the backdoor
    # at least 20 points above FedRetrain, the target holds at least 20 samples, and the row's
    # success is within the gap of FedRetrain's
    table = _table(fedavg=(0.98, 3.0), fedretrain=(0.98, 0.0), m=(0.98, 2.0))
    table = _attacked(table, fedavg=original, fedretrain=retrained, m=kept)
    if samples is not None:
        table = table.assign(target_samples=samples)
    flags = dict(zip(table["method"], flag_rows(table, gap, True)))
    labels = dict(zip(table["method"], forgetting_labels(table, gap, True)))
    measurable = round(100 * (original - retrained), 9) >= MIN_SIGNAL_POINTS and (
        samples is None or samples >= MIN_TARGET_SAMPLES
    )
    passes = measurable and round(100 * (kept - retrained), 9) <= gap
    assert (flags["m"] == "") == passes
    assert (labels["m"] == "as fedretrain") == passes
    if not measurable:
        assert (
            flags["m"].startswith("forgetting not measurable") and labels["m"] == "not measurable"
        )
    assert flags["fedretrain"] == flags["fedavg"] == "" == labels["fedretrain"]


def test_the_identity_forgot_nothing_and_fedretrain_and_a_partial_forgetter_read_as_such():
    # The digits suite's point, papers' regime: the original 0.931, FedRetrain 0.0025.
    table = _table(
        fedavg=(0.98, 2.0), fedretrain=(0.98, 0.0), identity=(0.98, 2.0, 0.1, 0.0),
        pga=(0.978, 2.5), federaser=(0.98, 2.2),
    )  # fmt: skip
    table = _attacked(
        table, fedavg=0.931, fedretrain=0.0025, identity=0.931, pga=0.148, federaser=0.0025
    ).assign(target_samples=135)
    flags, labels = _flags(table), dict(zip(table["method"], forgetting_labels(table, 5.0, True)))
    assert flags["identity"].startswith("forgot nothing: backdoor success 0.9310")
    assert labels == {"fedavg": "", "fedretrain": "", "identity": "forgot nothing",
                      "pga": "kept part", "federaser": "as fedretrain"}  # fmt: skip
    assert flags["pga"].startswith("kept the attack: success 0.1480, 14.6 points above")
    assert flags["federaser"] == flags["fedretrain"] == ""
    # the same table with a one-sample target: nothing passes, the reason is said
    tiny = dict(zip(table["method"], flag_rows(table.assign(target_samples=1), 5.0, True)))
    assert tiny["federaser"] == (
        "forgetting not measurable: the target holds 1 sample(s), fewer than 20"
    )
