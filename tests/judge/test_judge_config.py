"""A judge run's configuration: what it needs and what it refuses, each refusal naming the key."""

from __future__ import annotations

import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError

JUDGE = {"judge-models": 4, "unlearn-clients": "0"}


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"judge-models": 2}, "judge-models"),
        ({"judge-models": 100_000}, "judge-models"),
        ({"unlearn-clients": "0,1"}, "unlearn-clients"),
        ({"unlearn-clients": ""}, "unlearn-clients"),
        ({"unlearn-methods": "federaser"}, "unlearn-methods"),
        ({"calibration-layerwise": False}, "calibration-layerwise"),
        ({"certified-head": True}, "certified-head"),
        ({"scrub": True, "scrub-forget": "client:0"}, "scrub"),
        ({"mia": True}, "mia"),
        ({"resume": True}, "resume"),
        ({"dp-noise-multiplier": 1.0}, "dp-noise-multiplier"),
        ({"judge-metrics": "ulira"}, "judge-metrics"),
        ({"judge-metrics": "forgetting-score,nope"}, "judge-metrics"),
        ({"judge-backdoor": True, "judge-backdoor-fraction": 0.0}, "judge-backdoor-fraction"),
        ({"judge-backdoor": True, "judge-backdoor-class": 10}, "judge-backdoor-class"),
        ({"model-seed": -2}, "model-seed"),
    ],
)
def test_a_judge_run_refuses_what_would_mix_its_models(extra, key):
    with pytest.raises(ConfigError) as refused:
        ExperimentConfig.from_run_config({**JUDGE, **extra})
    assert refused.value.parameter == key


def test_a_judge_run_reads_its_group_and_model_seed_defaults_to_seed():
    config = ExperimentConfig.from_run_config({**JUDGE, "seed": 7})
    assert config.judge.models == 4 and config.training_seed == 7
    assert config.judge_metric_names[0] == "forgetting-score"
    assert ExperimentConfig.from_run_config({"model-seed": 3}).training_seed == 3
