"""Class-discriminative pruning's query (``query.prune_stats``): honest clients' sums add up to the
sums over all their samples; a hostile reply is refused with its node named, and nothing of it is
used; the method applies to class cohorts and single networks only."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import Mock

import numpy as np
import pytest
import torch
from fake_grid import AnsweringGrid, cut_short
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from clients.client_state import ClientSetup
from clients.prune_queries import answer_prune_query
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.errors import ConfigError
from fedunlearn.reply_checks import RefusedReply
from fedunlearn.scrubbing.pruning import class_channel_sums, pruning_layer
from fedunlearn.training.models import build_dataset_model
from fedunlearn.training.stacked import build_model_stack
from server.federation.members import FederationMembers
from server.federation.queries import BadReplyError, QueryFailedError
from server.scrubbing.class_pruning import checked_prune_reply, class_pruning, prune_statistics

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODES = {0: 11, 1: 12, 2: 13}


class ClientGrid(AnsweringGrid):
    """Answers with the real client code; ``tamper(node, content)`` may change a reply."""

    def __init__(self, config, data, tamper=None):
        self.config, self.data, self.tamper = config, data, tamper

    def answer(self, message):
        node = message.metadata.dst_node_id
        if self.tamper == "silent" and node == 13:
            return None
        partition = {n: p for p, n in NODES.items()}[node]
        content = answer_prune_query(message, _setup(self.config, self.data, partition)).content
        if callable(self.tamper):
            self.tamper(node, content)
        reply = Mock(spec=Message)
        reply.has_error.return_value = False
        reply.metadata.src_node_id = node
        reply.content = content
        return reply


def _setup(config, data, partition):
    return ClientSetup(
        config, partition, data.client_split(partition), tuple(data.splits.input_shape),
        data.splits.num_classes, torch.device("cpu"),
    )  # fmt: skip


@pytest.fixture
def world():
    config = ExperimentConfig.from_run_config(
        {"num-clients": 3, "scrub": True, "scrub-forget": "class:3", "reply-timeout": 2.0}
    )
    data = load_federated_data(config)
    shape = tuple(data.splits.input_shape)
    torch.manual_seed(0)
    original = build_dataset_model("auto", "digits", shape, 10).state_dict()
    outcome = SimpleNamespace(
        config=config,
        data=data,
        members=FederationMembers(dict(NODES), {p: len(data.partitions[p]) for p in NODES}, 0),
        new_model=lambda: build_dataset_model("auto", "digits", shape, 10),
    )
    return config, data, outcome, original


def _context(world, tamper=None, forget="class:3", original=None):
    config, data, outcome, state = world
    return SimpleNamespace(
        grid=ClientGrid(config, data, tamper),
        outcome=outcome,
        config=config,
        forget=ForgetSet.parse(forget, num_clients=3),
        original=state if original is None else original,
        keepers=[0, 1, 2],
        log=lambda line: None,
    )


def test_honest_replies_add_up_to_the_sums_over_every_clients_samples(world):
    config, data, outcome, state = world
    model = outcome.new_model()
    model.load_state_dict(state)
    layer = pruning_layer(model)
    sums, counts = prune_statistics(_context(world), layer, [0, 1, 2])
    x = torch.cat([data.client_split(p).x for p in NODES])
    y = torch.cat([data.client_split(p).y for p in NODES])
    expected_sums, expected_counts = class_channel_sums(model, x, y, 10)
    torch.testing.assert_close(sums, expected_sums)
    assert torch.equal(counts, expected_counts) and int(counts.sum()) == len(y)


def _set_array(key, value):
    def tamper(node, content):
        if node == 12:
            arrays = {k: a.numpy() for k, a in content["stats"].items()}
            arrays[key] = value(arrays[key])
            content["stats"] = ArrayRecord(
                {k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}
            )

    return tamper


def _set_metric(key, value):
    def tamper(node, content):
        if node == 12:
            content["metrics"] = MetricRecord({**dict(content["metrics"]), key: value})

    return tamper


@pytest.mark.parametrize(
    "tamper, fragment",
    [
        (_set_array("sums", lambda a: a * np.nan), "non-finite"),
        (_set_array("sums", lambda a: a[:, :-1]), "shape"),
        (_set_array("sums", lambda a: a.astype(np.float32)), "dtype"),
        (_set_array("sums", lambda a: -a - 1), "negative"),
        (_set_array("counts", lambda a: a * 1000), "outside"),  # above the partition's size
        (_set_array("counts", lambda a: a[:-1]), "shape"),
        (cut_short(node=12, key="sums"), "does not decode"),
        (cut_short(node=12, key="counts"), "does not decode"),
        (_set_array("counts", lambda a: np.roll(a, 1)), "the partition holds"),
        (_set_metric("partition-id", 0), "partition-id"),
        (_set_metric("extra", 1), "unexpected"),
    ],
)
def test_a_hostile_reply_is_refused_naming_the_node(world, tamper, fragment):
    context = _context(world, tamper)
    layer = pruning_layer(context.outcome.new_model())
    with pytest.raises(BadReplyError, match=f"node 12 \\(partition 1\\).*refused: .*{fragment}"):
        prune_statistics(context, layer, [0, 1, 2])


def test_sums_for_a_class_the_client_does_not_hold_are_refused():
    counts = np.array([2, 0, 1])
    sums = np.array([[1.0, 2.0], [0.0, 0.0], [0.5, 0.0]])

    def reply(sums):
        return RecordDict(
            {
                "stats": ArrayRecord({"sums": Array(sums), "counts": Array(counts)}),
                "metrics": MetricRecord({"partition-id": 4}),
            }
        )

    got_sums, got_counts = checked_prune_reply(reply(sums), 4, counts, 3, 2)
    assert np.array_equal(got_sums, sums) and np.array_equal(got_counts, counts)
    claimed = sums.copy()
    claimed[1, 0] = 0.5  # activations of a class it holds no sample of
    with pytest.raises(RefusedReply, match="class with no sample"):
        checked_prune_reply(reply(claimed), 4, counts, 3, 2)
    with pytest.raises(RefusedReply, match="outside"):
        checked_prune_reply(reply(sums), 4, counts, 1, 2)  # 2 samples of class 0, N_k = 1


def test_a_missing_reply_fails_the_query_naming_the_node(world):
    context = _context(world, "silent")
    with pytest.raises(QueryFailedError, match="class pruning: prune_stats failed: .*node 13"):
        prune_statistics(context, pruning_layer(context.outcome.new_model()), [0, 1, 2])


def test_another_cohort_is_skipped_and_a_stack_refused(world):
    assert class_pruning(_context(world, forget="client:1"), "class-pruning") is None
    stack = build_model_stack("digits-cnn", "digits", (1, 8, 8), 10, [0, 1, 2]).state_dict()
    with pytest.raises(ConfigError, match="judge-models"):
        class_pruning(_context(world, original=stack), "class-pruning")


def test_a_client_refuses_a_stack_an_unknown_layer_and_a_wrong_class_count(world):
    config, data, outcome, state = world

    def ask(arrays, **record):
        content = RecordDict(
            {
                "config": ConfigRecord({"layer": "body.0", "num-classes": 10, **record}),
                "arrays": ArrayRecord(arrays),
            }
        )
        msg = Message(content=content, dst_node_id=1, message_type="query.prune_stats")
        return answer_prune_query(msg, _setup(config, data, 1))

    assert tuple(ask(state).content["stats"]["sums"].shape) == (10, 16)
    stack = build_model_stack("digits-cnn", "digits", (1, 8, 8), 10, [0, 1, 2]).state_dict()
    with pytest.raises(ConfigError, match="arrays"):
        ask(stack)
    with pytest.raises(ConfigError, match="layer"):
        ask(state, layer="body.1")  # the ReLU: no channels of its own
    with pytest.raises(ConfigError, match="num-classes"):
        ask(state, **{"num-classes": 3})
