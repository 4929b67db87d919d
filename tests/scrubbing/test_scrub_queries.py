"""A client's answer to query.scrub_stats: sums over exactly its share of D_r and D_f."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from clients.client_state import ClientSetup
from clients.scrub_queries import answer_scrub_query
from fedunlearn.certified.curvature import head_inputs, head_matrix, head_sums
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.errors import ConfigError


@pytest.fixture
def setup():
    config = ExperimentConfig.from_run_config({"num-clients": 3})
    data = load_federated_data(config)
    return ClientSetup(
        config=config,
        partition_id=1,
        data=data.client_split(1),
        input_shape=tuple(data.splits.input_shape),
        num_classes=data.splits.num_classes,
        device=torch.device("cpu"),
    )


def _ask(setup, **config):
    torch.manual_seed(0)
    model = setup.new_model()
    content = RecordDict({"config": ConfigRecord(config), "model": ArrayRecord(model.state_dict())})
    msg = Message(content=content, dst_node_id=1, message_type="query.scrub_stats")
    return model, answer_scrub_query(msg, setup).content


def test_head_sums_split_the_client_data_into_its_d_r_and_d_f(setup, flower_task_identity):
    model, reply = _ask(
        setup, op="head", parts=["retained", "forgotten"], forget="class:3", hessian=True
    )
    y = setup.data.y.numpy()
    assert reply["metrics"]["forgotten.count"] == int((y == 3).sum()) > 0
    assert reply["metrics"]["retained.count"] == int((y != 3).sum())
    x = head_inputs(model, setup.data.x)
    w = head_matrix(model.state_dict())
    for part, mask in (("retained", y != 3), ("forgotten", y == 3)):
        expected = head_sums(x[mask], y[mask], w)
        for name in ("loss", "gradient", "blocks"):
            np.testing.assert_allclose(
                reply["stats"][f"{part}.{name}"].numpy(), expected[name], rtol=1e-5, atol=1e-6
            )


def test_fisher_sums_cover_at_most_max_samples_and_only_the_asked_part(setup, flower_task_identity):
    model, reply = _ask(
        setup, op="fisher", parts=["retained"], forget="class:3", **{"max-samples": 50}
    )
    assert reply["metrics"]["retained.count"] == 50
    names = {k.split(".", 1)[1] for k in reply["stats"].keys()}
    assert names == {name for name, _ in model.named_parameters()}
    assert all(not k.startswith("forgotten.") for k in reply["stats"].keys())
    assert all((reply["stats"][k].numpy() >= 0).all() for k in reply["stats"].keys())


def test_a_client_outside_the_cohort_reports_an_empty_d_f(setup, flower_task_identity):
    _, reply = _ask(setup, op="head", parts=["forgotten"], forget="client:0", hessian=False)
    assert reply["metrics"]["forgotten.count"] == 0
    assert not reply["stats"]["forgotten.gradient"].numpy().any()


@pytest.mark.parametrize(
    ("config", "parameter"),
    [
        ({"op": "hessian", "parts": ["retained"], "forget": "class:3"}, "op"),
        ({"op": "head", "parts": ["all"], "forget": "class:3", "hessian": True}, "parts"),
        (
            {"op": "head", "parts": ["retained"], "forget": "class:x", "hessian": True},
            "scrub-forget",
        ),
    ],
)
def test_bad_queries_are_refused_by_name(setup, flower_task_identity, config, parameter):
    with pytest.raises(ConfigError) as error:
        _ask(setup, **config)
    assert error.value.parameter == parameter
