"""server.federation.message_index: Flower's in-memory link state, as its simulation runtime builds
it, answers each node with the same messages once indexed, and looks at that node's messages only."""

from __future__ import annotations

import pytest
from flwr.app import Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from server.federation import message_index


@pytest.fixture(autouse=True)
def superlink_identity(monkeypatch):
    """This process acts as the simulation's SuperLink of run 7 (as ``run_simulation`` sets it)."""
    for name, value in (("_task_id", 11), ("_run_id", 7), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, name, value)


def federation(nodes: int, messages_to: list[int]):
    """A link state with ``nodes`` registered nodes (as the simulation runtime registers them) and
    one instruction message pushed to the node at each position of ``messages_to``."""
    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    state = factory.state()
    run = Run.create_empty(run_id=7)
    run.primary_task_id = 11
    run.federation_id = NOOP_FEDERATION_ID
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[11] = Task(task_id=11, run_id=run.run_id)
    node_ids = list(_register_nodes(nodes, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    pushed = list(
        grid.push_messages(
            [Message(RecordDict(), node_ids[i], "train", group_id="1") for i in messages_to]
        )
    )
    assert len(pushed) == len(messages_to)
    return state, node_ids, run.run_id


def answers(state, node_ids, limit=1) -> list[list[str]]:
    """What one sweep of the runtime hands out: each node's next message ids, in node order."""
    return [
        [m.metadata.message_id for m in state.get_message_ins(node_id=n, limit=limit)]
        for n in node_ids
    ]


def flower(monkeypatch) -> None:
    """Flower's own methods for this test (a ServerApp run in this process installs the index)."""
    monkeypatch.setattr(
        InMemoryLinkState, "store_message_ins", message_index.FLOWER_STORE_MESSAGE_INS
    )
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", message_index.FLOWER_GET_MESSAGE_INS)


def install(monkeypatch) -> None:
    """The index installed for this test only (Flower's methods restored after it)."""
    flower(monkeypatch)
    assert message_index.use_message_index()
    assert not message_index.use_message_index()  # once per process


@pytest.fixture()
def indexed(monkeypatch):
    install(monkeypatch)


def sweeps(state, node_ids, limit):
    return [answers(state, node_ids, limit), answers(state, node_ids, limit)]


@pytest.mark.parametrize("limit", [1, None])
def test_each_node_gets_the_messages_it_got_before(monkeypatch, limit):
    flower(monkeypatch)
    targets = [3, 0, 3, 5, 3, 9]
    state, node_ids, _ = federation(12, targets)
    before = sweeps(state, node_ids, limit)
    install(monkeypatch)  # the same federation again (fresh node ids), indexed this time
    state2, node_ids2, _ = federation(12, targets)
    after = sweeps(state2, node_ids2, limit)
    shape = lambda s: [[len(ids) for ids in sweep] for sweep in s]  # noqa: E731
    assert shape(after) == shape(before)
    if limit == 1:  # node 3's three messages, one a sweep, in the order they were pushed
        assert [len(ids) for ids in after[0]] == [1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0]
    # the index holds the nodes whose messages are still stored (delivered, not yet replied)
    assert set(state2.__dict__[message_index.INDEX_ATTRIBUTE]) == {node_ids2[i] for i in targets}


def test_a_node_without_messages_is_answered_without_looking_at_the_others(indexed, monkeypatch):
    state, node_ids, _ = federation(50, [1, 2, 3, 4])
    checked = []
    original = InMemoryLinkState._check_stored_messages
    monkeypatch.setattr(
        InMemoryLinkState,
        "_check_stored_messages",
        lambda self, ids, run_id=None: checked.append(set(ids)) or original(self, ids, run_id),
    )
    sweep = answers(state, node_ids)
    assert [len(ids) for ids in sweep] == [0, 1, 1, 1, 1] + [0] * 45
    assert len(checked) == 4  # one check per message, by its own node: not 50 x 4
    assert sum(len(ids) for ids in answers(state, node_ids)) == 0  # delivered once


def test_a_deleted_message_leaves_the_index(indexed):
    state, node_ids, _ = federation(5, [2, 2])
    first = state.get_message_ins(node_id=node_ids[2], limit=1)
    state.delete_messages({first[0].metadata.message_id})
    second = state.get_message_ins(node_id=node_ids[2], limit=None)
    assert len(second) == 1 and second[0].metadata.message_id != first[0].metadata.message_id
    assert list(state.__dict__[message_index.INDEX_ATTRIBUTE][node_ids[2]]) == [
        second[0].metadata.message_id
    ]


def test_messages_stored_before_the_patch_are_indexed_on_first_use(monkeypatch):
    flower(monkeypatch)
    state, node_ids, _ = federation(6, [4, 1])
    install(monkeypatch)
    assert [len(ids) for ids in answers(state, node_ids)] == [0, 1, 0, 0, 1, 0]
