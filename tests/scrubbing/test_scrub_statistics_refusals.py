"""The scrubbing plug-in's queries: honest clients' sums are added up; a hostile reply is refused
with its node named, and nothing of it is summed."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import Mock

import numpy as np
import pytest
import torch
from fake_grid import AnsweringGrid, cut_short
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from clients.client_state import ClientSetup
from clients.scrub_queries import answer_scrub_query
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.training.models import build_dataset_model
from server.federation.members import FederationMembers
from server.scrubbing.phase import ScrubStatistics, cohort_masks

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODES = {0: 11, 1: 12, 2: 13}


class ClientGrid(AnsweringGrid):
    """Answers with the real client code; ``tamper(node, content)`` may change a reply."""

    def __init__(self, config, data, tamper=None):
        self.config, self.data, self.tamper = config, data, tamper

    def answer(self, message):
        node = message.metadata.dst_node_id
        partition = {n: p for p, n in NODES.items()}[node]
        setup = ClientSetup(
            self.config, partition, self.data.client_split(partition),
            tuple(self.data.splits.input_shape), self.data.splits.num_classes,
            torch.device("cpu"),
        )  # fmt: skip
        content = answer_scrub_query(message, setup).content
        if self.tamper is not None:
            self.tamper(node, content)
        reply = Mock(spec=Message)
        reply.has_error.return_value = False
        reply.metadata.src_node_id = node
        reply.content = content
        return reply


@pytest.fixture
def scrub():
    config = ExperimentConfig.from_run_config(
        {"num-clients": 3, "scrub": True, "scrub-forget": "class:3", "reply-timeout": 2.0}
    )
    data = load_federated_data(config)
    shape = tuple(data.splits.input_shape)
    outcome = SimpleNamespace(
        config=config,
        members=FederationMembers(dict(NODES), {p: len(data.partitions[p]) for p in NODES}, 0),
        new_model=lambda: build_dataset_model("auto", "digits", shape, 10),
    )
    torch.manual_seed(0)
    state = outcome.new_model().state_dict()
    forget = ForgetSet.parse(config.scrub_forget, num_clients=3)
    return config, data, outcome, state, forget, cohort_masks(config, data)


def _stats(scrub, tamper=None):
    config, data, outcome, state, forget, masks = scrub
    return ScrubStatistics(ClientGrid(config, data, tamper), outcome, forget, masks), state


def test_honest_sums_add_up_to_the_cohort_sizes(scrub):
    stats, state = _stats(scrub)
    masks = scrub[-1]
    head = stats.ask("head", state, ("retained", "forgotten"), [0, 1, 2], hessian=True)
    assert head["forgotten"]["count"] == sum(int(m.sum()) for m in masks.values())
    fisher = stats.ask("fisher", state, ("retained",), [0, 1, 2], **{"max-samples": 20})
    assert fisher["retained"]["count"] == 60 and "head.weight" in fisher["retained"]


def _set_array(key, value):
    def tamper(node, content):
        if node == 12:
            arrays = {k: a.numpy() for k, a in content["stats"].items()}
            arrays[key] = value(arrays[key])
            content["stats"] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})

    return tamper


def _set_metric(key, value):
    def tamper(node, content):
        if node == 12:
            metrics = dict(content["metrics"])
            metrics[key] = value
            content["metrics"] = MetricRecord(metrics)

    return tamper


@pytest.mark.parametrize(
    "tamper, fragment",
    [
        (_set_array("retained.gradient", lambda a: a * np.nan), "non-finite"),
        (_set_array("retained.gradient", lambda a: a[:, :-1]), "shape"),
        (_set_array("forgotten.loss", lambda a: -a - 1), "negative"),
        (_set_array("retained.blocks", lambda a: a.astype(np.float64)), "dtype"),
        (cut_short(node=12, key="retained.gradient"), "does not decode"),
        (_set_metric("retained.count", 10**9), "retained.count"),
        (_set_metric("forgotten.count", 0), "forgotten.count"),
        (_set_metric("partition-id", 0), "partition-id"),
        (_set_metric("extra", 1), "unexpected"),
    ],
)
def test_a_hostile_head_reply_is_refused_naming_the_node(scrub, tamper, fragment):
    stats, state = _stats(scrub, tamper)
    with pytest.raises(RuntimeError, match=f"node 12 \\(client 1\\) refused: .*{fragment}"):
        stats.ask("head", state, ("retained", "forgotten"), [0, 1, 2], hessian=True)


def test_a_hostile_fisher_reply_is_refused(scrub):
    stats, state = _stats(scrub, _set_array("retained.head.weight", lambda a: -a - 1))
    with pytest.raises(RuntimeError, match="node 12 .*negative"):
        stats.ask("fisher", state, ("retained",), [0, 1, 2], **{"max-samples": 20})


def test_a_failed_or_missing_scrub_reply_fails_the_query_naming_the_node(scrub):
    config, data, outcome, state, forget, masks = scrub

    class Silent(ClientGrid):
        def answer(self, message):
            if message.metadata.dst_node_id == 13:
                return None  # node 13 never answers
            return super().answer(message)

    stats = ScrubStatistics(Silent(config, data), outcome, forget, masks)
    with pytest.raises(RuntimeError, match="scrubbing: head failed: .*node 13 \\(partition 2\\)"):
        stats.ask("head", state, ("retained",), [0, 1, 2], hessian=False)
