"""FedEraser's retention schedule, computed once: t_1 = 1, t_{j+1} = t_j + Δt."""

from __future__ import annotations

import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.registry import run_retention
from fedunlearn.store.retention import INTERVAL
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.federaser import IntervalRetention, is_retained_round
from strategies.retaining import RetainingFedAvg


@pytest.mark.parametrize(
    ("interval", "expected"),
    [(1, list(range(1, 12))), (2, [1, 3, 5, 7, 9, 11]), (5, [1, 6, 11]), (20, [1])],
)
def test_retained_rounds_are_one_then_every_delta_t(interval, expected):
    assert [t for t in range(0, 12) if is_retained_round(t, interval)] == expected


@pytest.mark.parametrize("interval", [0, -1, 1.5, True, "2"])
def test_an_interval_below_one_is_refused_naming_it(interval):
    with pytest.raises(ConfigError, match="retain-interval"):
        IntervalRetention(interval)
    if interval != "2":  # the config reads a command line's text as its number
        with pytest.raises(ConfigError, match="retain-interval"):
            ExperimentConfig.from_run_config({"retain-interval": interval})


def test_a_strategy_with_a_store_and_no_policy_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="policies"):
        RetainingFedAvg(UpdateStore(tmp_path / "store"))
    with pytest.raises(ConfigError, match="policies"):
        RetainingFedAvg(None, [IntervalRetention(1), IntervalRetention(2)])


@pytest.mark.parametrize("interval", [1, 3, 4])
def test_config_and_strategy_follow_the_same_schedule(tmp_path, interval):
    config = ExperimentConfig.from_run_config({"retain-interval": interval, "rounds": 13})
    strategy = RetainingFedAvg(UpdateStore(tmp_path / "store"), run_retention(config))
    schedule = [t for t in range(1, 14) if is_retained_round(t, interval)]
    policy = strategy.policies[INTERVAL]
    kept = [t for t in range(1, 14) if policy.select(t, {}, {0: {}}, {0: 1}).keep_global]
    assert kept == schedule
    assert not any(strategy.retained(t) for t in range(1, 14))  # nothing trained yet
