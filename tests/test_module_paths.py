"""Every ``"module:function"`` string the code resolves on use names a callable that exists: the
method registries' implementations and the unlearning methods' retention policies (a typo would
surface only when a run reaches that method). Also every message type a
registered method declares is one of :mod:`fedunlearn.messages`'."""

from __future__ import annotations

import pytest

from fedunlearn.messages import MESSAGE_TYPES, action
from fedunlearn.registry import AUDITED, JUDGE_METRICS, SCRUBBING, UNLEARNING
from fedunlearn.store.retention import RetentionPolicy

REGISTRIES = {"unlearning": UNLEARNING, "scrubbing": SCRUBBING, "audited": AUDITED}
REGISTRIES["judge-metrics"] = JUDGE_METRICS
SPECS = [
    pytest.param(spec, id=f"{kind}:{spec.name}")
    for kind, registry in REGISTRIES.items()
    for spec in registry
    if isinstance(spec.implementation, str)
]


def test_the_registries_name_their_implementations_as_module_paths():
    kinds = {param.id.split(":")[0] for param in SPECS}
    assert kinds == {"unlearning", "scrubbing", "judge-metrics"}  # audited models: no code


@pytest.mark.parametrize("spec", SPECS)
def test_a_registered_module_path_resolves_to_a_callable(spec):
    function = spec.resolve()
    assert callable(function), spec.implementation
    module, _, name = spec.implementation.partition(":")
    assert function.__name__ == name and function.__module__ == module


POLICIES = [
    pytest.param(spec, id=spec.name) for spec in UNLEARNING if isinstance(spec.retention, str)
]


def test_the_unlearning_registry_names_some_policies_as_module_paths():
    assert POLICIES


@pytest.mark.parametrize("spec", POLICIES)
def test_a_registered_policy_path_resolves_to_a_retention_policy(spec):
    policy = spec.policy()
    assert isinstance(policy, type) and issubclass(policy, RetentionPolicy), spec.retention
    module, _, name = spec.retention.partition(":")
    assert policy.__name__ == name and policy.__module__ == module


@pytest.mark.parametrize(
    "spec",
    [spec for registry in REGISTRIES.values() for spec in registry],
    ids=lambda spec: spec.name,
)
def test_a_registered_method_sends_only_known_message_types(spec):
    assert set(spec.messages) <= set(MESSAGE_TYPES), spec.messages


def test_every_message_type_is_unique_and_a_query_or_train_action_names_its_handler():
    assert len(set(MESSAGE_TYPES)) == len(MESSAGE_TYPES)
    assert action("train.calibrate") == "calibrate" and action("query.prune_stats") == "prune_stats"
    with pytest.raises(ValueError, match="bare category"):
        action("train")
