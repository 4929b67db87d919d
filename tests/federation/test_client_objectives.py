"""A client objective is named once, on the registry entry of the method that asks for it: the real
ClientApp runs an objective that a method registered at run time declares (on D_f when its entry's
clients hold the forgotten data), refuses an unknown one naming those it knows, and the server and
the clients spell no registered objective's name themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from federation_grid import K, node_context
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from clients.client_app import create_client_app
from clients.client_state import client_setup
from clients.objectives import objective_of
from clients.scrub_queries import forget_mask
from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.registry import (
    DEFAULT_OBJECTIVE,
    SCRUBBING,
    UNLEARNING,
    MethodSpec,
    client_objectives,
)
from fedunlearn.seeding import derive_seed
from fedunlearn.training.models import build_dataset_model
from server.training.rounds import train_config_record

pytestmark = pytest.mark.usefixtures("flower_task_identity")

ROOT = Path(__file__).resolve().parents[2]
RUN = {"num-clients": K, "unlearn-clients": "", "local-epochs": 1}
SEEN: list[int] = []  # the number of samples each call of the toy objective trained on


def zeroing_step(model, x, y, config, setup, settings, attached=None) -> float:
    """A toy client objective: every parameter set to zero; its loss, the samples it was given."""
    SEEN.append(len(x))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    return float(len(x))


def keep_trained(context, name):
    """A toy unlearning method's server side (never called here)."""
    return dict(context.outcome.final_state)


def _reply(partition: int, objective: str, **config) -> Message:
    """Client ``partition``'s reply to a round-1 training message asking for ``objective``."""
    run_config = ExperimentConfig.from_run_config(RUN)
    model = build_dataset_model("auto", "digits", (1, 8, 8), 10, seed=derive_seed(0, "m"))
    record = {**train_config_record(run_config), "server-round": 1, "objective": objective}
    message = Message(
        RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "config": ConfigRecord({**record, **config}),
            }
        ),
        dst_node_id=100 + partition,
        message_type="train",
    )
    return create_client_app()(message, node_context(partition, K, RUN))


def test_the_client_app_runs_the_objective_a_method_registered_at_run_time_declares():
    SEEN.clear()
    with UNLEARNING.registered(
        "toy-zeroing", keep_trained, messages=("train",), objectives={"toy-zero": zeroing_step}
    ) as spec:
        assert spec.objective() == "toy-zero" and client_objectives()["toy-zero"] is spec
        reply = _reply(1, spec.objective())
    state = reply.content["arrays"].to_torch_state_dict()
    assert all(not tensor.any() for tensor in state.values())
    assert reply.content["metrics"]["train-loss"] == SEEN[0] > 0
    assert "toy-zero" not in client_objectives()


def test_an_objective_of_a_method_whose_clients_hold_the_forgotten_data_runs_on_d_f():
    SEEN.clear()
    entry = dict(needs=("trained-model",), messages=("train",), options={"clients": "forgotten"})
    with SCRUBBING.registered("toy-ascent", objectives={"toy-ascent": zeroing_step}, **entry):
        _reply(2, "toy-ascent", forget="class:3")
    setup = client_setup(node_context(2, K, RUN))
    assert SEEN == [int(forget_mask(setup, "class:3").sum())]
    assert 0 < SEEN[0] < len(setup.data)


def test_an_unknown_objective_is_refused_naming_the_objectives_the_registry_declares():
    with pytest.raises(ConfigError) as info:
        objective_of({"objective": "toy-zero"})
    message = str(info.value)
    assert message.startswith("invalid objective='toy-zero': one of train, ")
    for name in client_objectives():
        assert name in message
    with UNLEARNING.registered("toy-zeroing", keep_trained, objectives={"toy-zero": zeroing_step}):
        assert objective_of({"objective": "toy-zero"}) == "toy-zero"
    with pytest.raises(ConfigError, match="invalid objective='toy-zero'"):
        _reply(0, "toy-zero")


def test_the_built_in_objectives_are_declared_on_their_entries_and_resolve_to_client_steps():
    declared = client_objectives()
    assert {"pga", "fedquit", "rapid-retraining", "negative-gradient", "random-labels"} < set(
        declared
    )
    assert UNLEARNING["fedosd"].objective("unlearning") == "fedosd-unlearning"
    assert UNLEARNING["fedosd"].objective("gradient") == "fedosd-gradient"
    assert SCRUBBING["finetune"].objective() == DEFAULT_OBJECTIVE
    forgotten = {name for name, spec in declared.items() if spec.on_forgotten()}
    assert forgotten == {"negative-gradient", "random-labels"}
    for name, spec in declared.items():
        step = spec.client_step(name)
        module, _, function = spec.objectives[name].partition(":")
        assert callable(step) and (step.__module__, step.__name__) == (module, function)


def test_an_objective_is_declared_by_one_entry_and_never_named_train():
    with pytest.raises(ConfigError, match="objectives='pga': an objective pga does not declare"):
        UNLEARNING.register("toy-copy", keep_trained, objectives={"pga": zeroing_step})
    assert "toy-copy" not in UNLEARNING
    with SCRUBBING.registered("toy-copy", objectives={"pga": zeroing_step}):
        with pytest.raises(ConfigError, match="an objective of one entry, not of pga or toy-copy"):
            client_objectives()
    with pytest.raises(ConfigError, match="a name other than 'train'"):
        MethodSpec("toy", objectives={"train": zeroing_step})
    with pytest.raises(ConfigError, match="'module:function' or a callable"):
        MethodSpec("toy", objectives={"toy-step": "no_colon"})
    with pytest.raises(ConfigError, match="one objective of fedosd"):
        UNLEARNING["fedosd"].objective()


def _string_literals(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_no_objective_name_is_spelled_outside_the_registry():
    """Only the registry entries write an objective's name; the server reads it from the entry
    and the ClientApp looks it up there (``train``, the default, is everyone's)."""
    names = set(client_objectives())
    spelled = {
        str(path.relative_to(ROOT)): sorted(_string_literals(path) & names)
        for package in ("server", "clients", "strategies")
        for path in (ROOT / package).rglob("*.py")
    }
    assert names and {path: found for path, found in spelled.items() if found} == {}
