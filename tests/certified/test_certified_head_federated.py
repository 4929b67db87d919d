"""The certified head over a federation, without Ray: a grid whose nodes answer ``query.certified_head``
with the real client code, so that a test can make one node hostile or failing at will."""

from __future__ import annotations

from unittest.mock import Mock

import numpy as np
import pytest
import torch
from fake_grid import AnsweringGrid
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from clients.client_state import ClientSetup
from clients.head_queries import answer_head_query
from fedunlearn.certified.certificate import CertifiedRemovalParams, read_ledger
from fedunlearn.certified.features import head_features
from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import one_vs_rest_targets
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.errors import ConfigError
from server.certified.head_data import FederatedHeadData
from server.certified.replies import BadReplyError, QueryFailedError
from server.federation.members import FederationMembers

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODES = {101: 0, 202: 1, 303: 2}  # node id -> partition id
CLASSES = list(range(10))


class ClientGrid(AnsweringGrid):
    """Nodes answering with :func:`clients.head_queries.answer_head_query`; ``tamper(op, partition,
    content)`` may rewrite a reply's content (a hostile client) or raise (a failing one)."""

    def __init__(self, setups: dict[int, ClientSetup]):
        self.setups = setups
        self.tamper = None
        self.impostor: int | None = None

    def answer(self, message):
        node = message.metadata.dst_node_id
        setup = self.setups[node]
        content = answer_head_query(message, setup).content
        op = str(message.content["config"]["op"])
        if self.tamper is not None:
            content = self.tamper(op, setup.partition_id, content) or content
        reply = Mock(spec=Message)
        reply.has_error.return_value = False
        reply.metadata.src_node_id = self.impostor or node
        reply.content = content
        return reply


@pytest.fixture(scope="module")
def federation():
    config = ExperimentConfig.from_run_config({"num-clients": 3})
    data = load_federated_data(config)
    torch.manual_seed(0)
    setups = {
        node: ClientSetup(
            config=config,
            partition_id=p,
            data=data.client_split(p),
            input_shape=tuple(data.splits.input_shape),
            num_classes=data.splits.num_classes,
            device=torch.device("cpu"),
        )
        for node, p in NODES.items()
    }
    model = setups[101].new_model()
    members = FederationMembers(
        {p: node for node, p in NODES.items()},
        {p: len(data.partitions[p]) for p in NODES.values()},
        0,
    )
    partitions = sorted(NODES.values())
    central_x = np.vstack([head_features(model, data.client_split(p).x) for p in partitions])
    central_y = np.concatenate([data.client_split(p).y.numpy() for p in partitions])
    return setups, members, model.state_dict(), central_x, one_vs_rest_targets(central_y, CLASSES)


def _head(federation, tmp_path, **params):
    setups, members, state, _, _ = federation
    grid = ClientGrid(setups)
    data = FederatedHeadData(grid, members, state, "logistic", CLASSES)
    settings = {"sigma": 1.0, "lam": 1e-2, "mode": "fast", **params}
    head = CertifiedHead(data, CertifiedRemovalParams(**settings), ledger=tmp_path / "ledger.jsonl")
    return grid, data, head


def _state(head):
    return (
        head.weights.tobytes(),
        head.perturbation.tobytes(),
        head.beta,
        head.worst_case,
        dict(head.tracked),
        head.requests,
        {p: sorted(s) for p, s in head.data.removed_ids.items()},
        head.ledger.read_bytes(),
    )


def test_the_federated_head_equals_the_central_head_with_the_same_b(federation, tmp_path):
    _, _, _, x, t = federation
    _, data, head = _head(federation, tmp_path)
    head.fit()
    central = CertifiedHead(CentralHeadData("logistic", x, t), head.params)
    central.fit(perturbation=head.perturbation)
    assert np.linalg.norm(head.weights - central.weights) <= 1e-8 * np.linalg.norm(central.weights)
    assert data.count() == len(x)


def _set_array(content, name, value):
    sums = dict(content["sums"].items())
    sums[name] = Array(np.ascontiguousarray(value))
    content["sums"] = ArrayRecord(sums)
    return content


def _hostile(name):
    """Content rewriters, each a way a hostile client's reply can be wrong."""

    def nan(content):
        array = content["sums"]["gradient"].numpy().copy()
        array.flat[3] = np.nan
        return _set_array(content, "gradient", array)

    def wrong_shape(content):
        return _set_array(content, "gradient", content["sums"]["gradient"].numpy()[:, :-1].copy())

    def wrong_count(content):
        metrics = dict(content["metrics"].items())
        metrics["count"] = int(metrics["count"]) + 1
        content["metrics"] = MetricRecord(metrics)
        return content

    def array_count(content):
        count = int(content["sums"]["count"].numpy()[0])
        return _set_array(content, "count", np.array([count - 1]))

    def integer_loss(content):
        return _set_array(content, "loss", content["sums"]["loss"].numpy().astype(np.int64))

    def extra_array(content):
        return _set_array(content, "secret", np.zeros(3))

    def negative_loss(content):
        return _set_array(content, "loss", -np.abs(content["sums"]["loss"].numpy()) - 1.0)

    def needs_model_two(content):
        metrics = dict(content["metrics"].items())
        metrics["needs-model"] = 2
        content["metrics"] = MetricRecord(metrics)
        return content

    def float_count(content):
        metrics = dict(content["metrics"].items())
        metrics["count"] = float(metrics["count"])
        content["metrics"] = MetricRecord(metrics)
        return content

    def no_sums(content):
        return RecordDict({"metrics": content["metrics"]})

    return locals()[name]


HOSTILE = [
    ("nan", "NaN"),
    ("wrong_shape", "shape"),
    ("wrong_count", "count"),
    ("array_count", "samples"),
    ("integer_loss", "dtype"),
    ("extra_array", "secret"),
    ("negative_loss", "negative"),
    ("needs_model_two", "needs-model"),
    ("float_count", "not an integer"),
    ("no_sums", "lacks"),
]


@pytest.mark.parametrize(("kind", "reason"), HOSTILE)
def test_a_hostile_reply_to_training_is_refused_with_its_node_named(
    federation, tmp_path, kind, reason
):
    grid, _, head = _head(federation, tmp_path)
    rewrite = _hostile(kind)
    grid.tamper = lambda op, p, content: rewrite(content) if op == "sums" and p == 1 else None
    with pytest.raises(BadReplyError, match=reason) as error:
        head.fit()
    assert (error.value.node, error.value.partition) == (202, 1)
    assert "node 202 (partition 1)" in str(error.value)
    assert not head.trained and not (tmp_path / "ledger.jsonl").exists()


def _removal_rewriter(op_wanted, partition_wanted, rewrite):
    def tamper(op, partition, content):
        if op == op_wanted and partition == partition_wanted:
            return rewrite(content)
        return None

    return tamper


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("op", ["removed", "sums", "step"])
def test_a_hostile_reply_during_a_removal_leaves_everything_as_it_was(
    federation, tmp_path, mode, op
):
    grid, data, head = _head(federation, tmp_path, mode=mode, refresh_ratio=1e-9)
    head.fit()
    head.remove([(0, 5)])
    before = _state(head)

    def corrupt(content):
        name = {"removed": "gradient", "sums": "gradient", "step": "point"}[op]
        array = content["sums"][name].numpy().copy()
        array.flat[0] = np.inf
        return _set_array(content, name, array)

    # Partition 2 holds the sample being removed, so it answers every op of the request.
    grid.tamper = _removal_rewriter(op, 2, corrupt)
    with pytest.raises(BadReplyError, match=r"node 303 \(partition 2\)"):
        head.remove([(2, 7), (0, 9)])
    assert _state(head) == before
    grid.tamper = None
    certificate = head.remove([(2, 7), (0, 9)])
    assert certificate.request == 3 and certificate.removed == 2
    assert data.removed_ids[2] == {7} and data.removed_ids[0] == {5, 9}
    assert head.residual() <= certificate.beta_after * (1 + 1e-7) + 1e-10
    assert [r["request"] for r in read_ledger(tmp_path / "ledger.jsonl")] == [1, 2, 3]


def test_a_client_failing_mid_request_leaves_everything_as_it_was(federation, tmp_path):
    grid, _, head = _head(federation, tmp_path, mode="exact")
    head.fit()
    before = _state(head)

    def fail(op, partition, content):
        if op == "step":
            raise QueryFailedError("certified head: step failed on node 101 (partition 0)")

    grid.tamper = fail
    with pytest.raises(QueryFailedError):
        head.remove([(1, 3)])
    assert _state(head) == before
    grid.tamper = None
    assert head.remove([(1, 3)]).n_after == head.data.count()


def test_a_reply_from_a_node_that_was_not_asked_is_refused(federation, tmp_path):
    grid, _, head = _head(federation, tmp_path)
    grid.impostor = 999
    with pytest.raises(BadReplyError, match="node 999.*not asked"):
        head.fit()


def test_a_prepare_count_beyond_the_declared_size_is_refused(federation):
    setups, members, state, _, _ = federation
    grid = ClientGrid(setups)
    grid.tamper = _removal_rewriter("prepare", 0, _hostile("wrong_count"))
    refused = r"node 101 \(partition 0\).*count = 450, expected in \[1, 449\]"
    with pytest.raises(BadReplyError, match=refused):
        FederatedHeadData(grid, members, state, "logistic", CLASSES)


@pytest.mark.parametrize(
    "ids",
    [
        [(0, 1.0)],
        [(0.0, 1)],
        [(True, 1)],
        [(0, np.float64(2))],
        ["0,1"],
        "01",
        [(0, 1, 2)],
        [0],
        [(0, "1")],
    ],
)
def test_federated_ids_must_be_pairs_of_integers(federation, tmp_path, ids):
    _, data, head = _head(federation, tmp_path)
    head.fit()
    before = _state(head)
    with pytest.raises(ConfigError) as error:
        head.remove(ids)
    assert error.value.parameter == "ids"
    assert _state(head) == before
    head.remove([(np.int64(0), np.int32(1))])  # NumPy integers are integers
    assert data.removed_ids[0] == {1}
