"""A method is one module plus one registry line: once registered, the run config accepts it, the
phase runs, times and tabulates it, and the membership audit attacks it; an unknown name is still
refused with the registered ones listed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedunlearn import config as config_module
from fedunlearn.config import ExperimentConfig, MethodKey, parameter_table
from fedunlearn.config.fields import AT_LEAST_1
from fedunlearn.errors import ConfigError
from fedunlearn.registry import (
    AUDITED,
    NEEDS,
    SCRUBBING,
    UNLEARNING,
    MethodSpec,
    Registry,
    audited_models,
)


def zero_head(context, name):
    """A toy scrub: the trained model with its last layer zeroed (predicts nothing)."""
    state = {key: value.clone() for key, value in context.outcome.final_state.items()}
    state["head.weight"].zero_()
    state["head.bias"].zero_()
    return state, {"zeroed": ["head.weight", "head.bias"]}


def keep_trained(context, name):
    """A toy unlearning method that forgets nothing: the trained model, unchanged."""
    return {key: value.clone() for key, value in context.outcome.final_state.items()}


def test_a_registered_method_is_listed_validated_and_audited():
    with SCRUBBING.registered("zero-head", zero_head, needs=("trained-model",)) as spec:
        assert spec == SCRUBBING["zero-head"] and spec.model_file == "model_scrub_zero-head"
        assert spec.resolve() is zero_head
        assert config_module.SCRUB_METHODS[-1] == "zero-head"
        config = ExperimentConfig.from_run_config({"scrub-methods": "newton, Zero-Head"})
        assert config.scrubbing_methods == ["newton", "zero-head"]
        assert "zero-head" in dict(audited_models())
    # Gone again: refused, and the error lists what is allowed.
    assert "zero-head" not in SCRUBBING and "zero-head" not in dict(audited_models())
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_run_config({"scrub-methods": "zero-head"})
    assert error.value.parameter == "scrub-methods" and "fisher-reference" in str(error.value)


def test_registered_unlearning_methods_drive_validation_and_adoption():
    with UNLEARNING.registered("keep-trained", keep_trained, adoptable=True):
        assert config_module.ADOPTABLE_METHODS == ("federaser", "fedretrain", "keep-trained")
        config = ExperimentConfig.from_run_config(
            {"unlearn-methods": "keep-trained", "retain": False}
        )
        assert config.methods == ["keep-trained"] and config.adoption_candidates == ["keep-trained"]
        assert list(dict(audited_models()))[:2] == ["original", "fedretrain"]
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_run_config({"unlearn-methods": "keep-trained"})
    assert "federaser, fedaccum, fedretrain" in str(error.value)
    # What a method needs drives the checks: without retained updates, FedEraser cannot run.
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_run_config({"unlearn-methods": "federaser", "retain": False})
    assert error.value.parameter == "retain"


def test_the_registry_refuses_duplicates_bad_names_and_unknown_needs():
    registry = Registry("toy", "toy-methods", model_prefix="model_toy_")
    registry.register("a", "some.module:function")
    with pytest.raises(ConfigError):
        registry.register("a", "some.module:other")
    for bad in ("", "A", "a,b", " a", "a b", "../x", "a/b", "-a", "a" * 65, 3):
        with pytest.raises(ConfigError):
            registry.register(bad, "m:f")
    with pytest.raises(ConfigError):
        registry.register("b", "m:f", needs=("everything",))
    with pytest.raises(ConfigError):
        registry.register("c", "no-colon")
    assert registry.names() == ("a",) and registry.unregister("a").name == "a"
    with pytest.raises(ConfigError) as error:
        registry["a"]
    assert error.value.parameter == "toy-methods"
    assert registry.parse("") == [] and not registry
    with pytest.raises(ConfigError):
        registry.parse("", allow_empty=False)
    assert set(NEEDS) >= {n for spec in [*UNLEARNING, *SCRUBBING, *AUDITED] for n in spec.needs}
    with pytest.raises(ConfigError):
        MethodSpec("x", None).resolve()


def test_a_method_declares_its_own_keys_on_its_entry():
    """Crab's keys are on Crab's entry: the table lists them in the unlearning group, as Crab's."""
    crab = {item.key for item in UNLEARNING["crab"].keys}
    assert crab == {row.key for row in parameter_table() if row.method == "crab"}
    assert {"crab-window", "crab-round-ratio", "crab-rollback"} <= crab
    assert {row.group for row in parameter_table() if row.method} == {"unlearning"}
    config = ExperimentConfig.from_run_config({"crab-window": 4})
    assert config.crab_window == config.unlearning.crab_window == 4
    assert config.replace(crab_window=2).crab_window == 2
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"crab-window": -1})
    assert info.value.parameter == "crab-window" and ">= 0" in str(info.value)


def test_a_method_registered_at_run_time_brings_its_keys():
    every = MethodKey("toy-every", 2, AT_LEAST_1, "rounds between the toy's snapshots")
    with UNLEARNING.registered("toy", keep_trained, default=False, keys=(every,)):
        config = ExperimentConfig.from_run_config({"toy-every": 3, "unlearn-methods": "fedretrain,toy"})
        assert config.toy_every == 3 and ExperimentConfig().toy_every == 2
        assert "toy-every" in ExperimentConfig.keys()
        with pytest.raises(ConfigError) as info:
            ExperimentConfig.from_run_config({"toy-every": 0})
        assert (info.value.parameter, info.value.value) == ("toy-every", 0)
        assert ">= 1" in str(info.value)
        with pytest.raises(ConfigError, match="crab does not declare"):
            UNLEARNING.register("copycat", keep_trained, keys=(UNLEARNING["crab"].keys[0],))
    assert "toy-every" not in ExperimentConfig.keys()
    with pytest.raises(ConfigError, match="unknown key"):
        ExperimentConfig.from_run_config({"toy-every": 3})
    with pytest.raises(ConfigError, match="no keys"):
        Registry("thing", "things").register("x", keys=(every,))


def test_every_built_in_entry_resolves_to_a_server_function():
    for spec in [*UNLEARNING, *SCRUBBING]:
        assert callable(spec.resolve()), spec.name
    assert UNLEARNING.names(adoptable=True) == ("federaser", "fedretrain")
    assert [s.name for s in AUDITED if s.certifies] == ["certified-head-trained", "certified-head"]


def _toys_on_clients():
    """A client mod: clients validate the run config too, in their own (Ray worker) processes,
    where only the toys' names are needed. Nested, so that it travels to them by value."""

    def mod(message, context, call_next):
        from fedunlearn.registry import SCRUBBING, UNLEARNING

        for registry, name in ((UNLEARNING, "keep-trained"), (SCRUBBING, "zero-head")):
            if name not in registry:
                registry.register(name, "test_registry:never_called_on_a_client")
        return call_next(message, context)

    return mod


def test_a_toy_method_runs_end_to_end_into_the_tables_and_the_audit(tmp_path, simulate):
    overrides = {
        "num-clients": 3,
        "rounds": 2,
        "retain": False,
        "output-dir": str(tmp_path),
        "run-name": "toy",
        "node-wait-seconds": 60,
        "unlearn-clients": "1",
        "unlearn-methods": "fedretrain,keep-trained",
        "scrub": True,
        "scrub-forget": "client:1",
        "scrub-methods": "zero-head",
        "mia": True,
    }
    with (
        UNLEARNING.registered("keep-trained", keep_trained),
        SCRUBBING.registered("zero-head", zero_head, needs=("trained-model",)),
    ):
        simulate(overrides, num_supernodes=3, client_mods=[_toys_on_clients()])
    run = tmp_path / "toy"
    unlearning = pd.read_csv(run / "unlearning.csv").set_index("method")
    assert list(unlearning.index) == ["fedavg", "fedretrain", "keep-trained"]
    # Forgetting nothing: the same predictions as the trained model.
    assert unlearning.loc["keep-trained", "prediction_difference"] == 0.0
    assert unlearning.loc["keep-trained", "seconds"] >= 0.0
    scrubbing = pd.read_csv(run / "scrubbing.csv").set_index("method")
    assert list(scrubbing.index) == ["original", "retrain", "zero-head"]
    # A zeroed head scores every class alike: argmax picks class 0 for every sample.
    assert 0.8 < scrubbing.loc["zero-head", "error_test"] < 1.0
    [entry] = [json.loads(line) for line in (run / "scrubbing.jsonl").open()]
    assert entry["methods"] == ["zero-head"]
    assert entry["details"]["zero-head"] == {"zeroed": ["head.weight", "head.bias"]}
    assert entry["seconds"]["zero-head"] >= 0.0
    membership = pd.read_csv(run / "membership.csv").set_index("method")
    assert list(membership.index) == ["original", "fedretrain", "keep-trained", "zero-head"]
    assert membership.loc["zero-head", "seconds"] == pytest.approx(entry["seconds"]["zero-head"])
