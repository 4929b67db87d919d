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
