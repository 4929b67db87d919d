"""A poisoning run's configuration: who attacks, how, and that the unlearning request removes
exactly them; every refusal names the key, the value and what is allowed."""

from __future__ import annotations

import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError

POISONED = {"attack-clients": "3,7", "attack": "backdoor", "unlearn-clients": "3,7"}


def test_a_poisoning_run_reads_its_group_and_its_attackers():
    config = ExperimentConfig.from_run_config({**POISONED, "attack-clients": "7, 3"})
    assert config.attack_targets == [3, 7]
    assert dict(config.poisoning) == {
        "clients": "7, 3",
        "kind": "backdoor",
        "scale": 10.0,
        "target_class": 0,
        "fraction": 0.5,
    }
    assert config.poisoning.key("kind") == "attack"
    assert ExperimentConfig().attack_targets == [] and ExperimentConfig().attack == "none"


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ({"attack": "trim"}, "attack", "one of none, backdoor, label-flip, scaled-update"),
        ({"attack": "none"}, "attack", "backdoor, label-flip or scaled-update when attack-clients"),
        ({"attack-clients": "10"}, "attack-clients", "partition ids in [0, 9]"),
        ({"attack-clients": "3;7"}, "attack-clients", "partition ids in [0, 9]"),
        ({"attack-clients": "-1"}, "attack-clients", "partition ids in [0, 9]"),
        (
            {"attack-clients": ",".join(map(str, range(10))), "unlearn-clients": ""},
            "attack-clients",
            "fewer than all 10 clients",
        ),
        ({"attack-scale": 0.0}, "attack-scale", "a number > 0"),
        ({"attack-scale": "big"}, "attack-scale", "a number"),
        ({"attack-fraction": 0.0}, "attack-fraction", "(0.0, 1.0]"),
        ({"attack-fraction": 1.5}, "attack-fraction", "(0.0, 1.0]"),
        ({"attack-target-class": -1}, "attack-target-class", ">= 0"),
        ({"attack-target-class": 10}, "attack-target-class", "a class of digits in [0, 9]"),
        ({"unlearn-clients": "0"}, "unlearn-clients", "'3,7', the attack-clients"),
        ({"unlearn-clients": "3"}, "unlearn-clients", "'3,7', the attack-clients"),
        ({"unlearn-clients": "3,7,8"}, "unlearn-clients", "'3,7', the attack-clients"),
        (
            {"judge-models": 3, "unlearn-clients": "3", "attack-clients": "3"},
            "attack-clients",
            "empty when judge-models > 0",
        ),
        (
            {"attack": "scaled-update", "dp-noise-multiplier": 1.0},
            "attack",
            "backdoor or label-flip when dp-noise-multiplier > 0",
        ),
    ],
)
def test_each_bad_poisoning_setting_is_refused_by_name(extra, key, fragment):
    values = {**POISONED, "num-clients": 10, **extra}
    with pytest.raises(ConfigError) as refused:
        ExperimentConfig.from_run_config(values)
    assert refused.value.parameter == key
    assert fragment in str(refused.value) and repr(values[key]) in str(refused.value)


def test_an_attack_needs_its_clients():
    with pytest.raises(ConfigError) as refused:
        ExperimentConfig.from_run_config({"attack": "label-flip"})
    assert refused.value.parameter == "attack-clients"
    assert "when attack = label-flip" in str(refused.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"unlearn-clients": ""},  # train only: the poisoned model itself
        {"unlearn-clients": "7,3"},  # the same clients in another order
        {"attack": "label-flip", "attack-target-class": 10},  # only a backdoor has a target
        {"attack": "backdoor", "dp-noise-multiplier": 1.0},
        {"attack": "scaled-update", "attack-scale": 0.5},
    ],
)
def test_sensible_poisoning_runs_are_accepted(extra):
    ExperimentConfig.from_run_config({**POISONED, **extra})


def test_a_later_unlearn_only_request_on_a_poisoned_run_may_forget_anyone():
    config = ExperimentConfig.from_run_config(
        {**POISONED, "unlearn-only": True, "run-name": "r", "unlearn-clients": "5"}
    )
    assert config.unlearn_targets == [5] and config.attack_targets == [3, 7]
