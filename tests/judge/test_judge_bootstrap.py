"""Bootstrap intervals contain the statistic, shrink as data grows, and refuse what they cannot
resample."""

from __future__ import annotations

import numpy as np
import pytest

from fedunlearn.errors import ConfigError
from fedunlearn.judge import bootstrap_interval, bootstrap_two_samples, mean_interval
from fedunlearn.membership.metrics import roc_auc


def test_intervals_contain_the_value_and_shrink_with_more_data():
    rng = np.random.default_rng(0)
    widths = []
    for n in (20, 2000):
        values = rng.normal(1.0, 1.0, n)
        estimate = bootstrap_interval(values, np.mean, resamples=500, rng=rng)
        assert estimate.low <= estimate.value <= estimate.high
        assert estimate.value == pytest.approx(values.mean())
        fast = mean_interval(values, resamples=500, rng=rng)
        assert fast.value == estimate.value and fast.high - fast.low == pytest.approx(
            estimate.high - estimate.low, rel=0.3
        )
        widths.append(estimate.high - estimate.low)
    assert widths[1] < widths[0] / 5  # ~ 1/sqrt(100)


def test_two_sample_auc_interval_resamples_members_and_nonmembers_separately():
    rng = np.random.default_rng(1)
    members, nonmembers = rng.normal(1, 1, 300), rng.normal(0, 1, 700)
    estimate = bootstrap_two_samples(members, nonmembers, roc_auc, resamples=300, rng=rng)
    assert estimate.value == roc_auc(members, nonmembers)
    assert estimate.low < estimate.value < estimate.high and estimate.high - estimate.low < 0.1


@pytest.mark.parametrize(
    ("values", "options", "parameter"),
    [
        (np.array([1.0]), {}, "values"),
        (np.arange(5.0), {"resamples": 0}, "resamples"),
        (np.arange(5.0), {"level": 1.0}, "level"),
    ],
)
def test_bad_inputs_are_refused_naming_the_parameter(values, options, parameter):
    with pytest.raises(ConfigError) as error:
        bootstrap_interval(values, np.mean, rng=np.random.default_rng(0), **options)
    assert error.value.parameter == parameter
    with pytest.raises(ConfigError) as error:
        mean_interval(np.array([1.0, np.nan]), rng=np.random.default_rng(0))
    assert error.value.parameter == "values"


def test_the_weighted_roc_bootstrap_is_the_statistic_of_the_resampled_arrays():
    """roc_bootstrap never builds a resample; its replicates must still be roc_auc and tpr_at_fpr
    of the explicitly resampled rows, ties included (scores rounded to force many)."""
    from fedunlearn.judge.bootstrap import _row_counts, _weighted_roc
    from fedunlearn.membership.metrics import roc_auc, tpr_at_fpr

    rng = np.random.default_rng(3)
    members = np.round(rng.normal(0.4, 1.0, size=(40, 3)), 1)
    nonmembers = np.round(rng.normal(0.0, 1.0, size=(1500, 3)), 1)
    _, inverse = np.unique(
        np.concatenate([members.ravel(), nonmembers.ravel()]), return_inverse=True
    )
    groups = (inverse[: members.size], inverse[members.size :], int(inverse.max()) + 1)
    for _ in range(5):
        count_m, count_z = _row_counts(40, rng), _row_counts(1500, rng)
        auc, tpr = _weighted_roc(groups, np.repeat(count_m, 3), np.repeat(count_z, 3), 0.001)
        m = np.repeat(members, count_m.astype(int), axis=0).ravel()
        z = np.repeat(nonmembers, count_z.astype(int), axis=0).ravel()
        assert auc == pytest.approx(roc_auc(m, z), abs=1e-12)
        assert tpr == pytest.approx(tpr_at_fpr(m, z, 0.001), abs=1e-12)
    from fedunlearn.judge.bootstrap import roc_bootstrap

    auc, tpr = roc_bootstrap(members, nonmembers, rng=np.random.default_rng(0))
    assert auc.value == pytest.approx(roc_auc(members.ravel(), nonmembers.ravel()))
    assert auc.low <= auc.value <= auc.high and 0.5 < auc.value
    assert tpr.value == pytest.approx(tpr_at_fpr(members.ravel(), nonmembers.ravel(), 0.001))
