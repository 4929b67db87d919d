"""The server maps node ids to partition ids and refuses a federation of the wrong size."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
from fake_grid import AnsweringGrid
from flwr.app import Message, MetricRecord, RecordDict

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.messages import DESCRIBE
from server.federation.members import (
    adopt_federation_size,
    discover_clients,
    federation_size,
)

pytestmark = pytest.mark.usefixtures("flower_task_identity")


class FakeGrid(AnsweringGrid):
    """Nodes that answer ``query.describe`` with a partition id and the federation size they expect."""

    def __init__(self, partitions: dict[int, int], num_partitions: int, hostile=None):
        self.partitions, self.num_partitions = partitions, num_partitions
        self.hostile = hostile or {}  # node -> metrics it replaces or adds
        self.sent: list[Message] = []

    def get_node_ids(self):
        return list(self.partitions)

    def answer(self, message):
        self.sent.append(message)
        assert message.metadata.message_type == DESCRIBE
        node = message.metadata.dst_node_id
        reply = Mock(spec=Message)
        reply.has_error.return_value = False
        reply.metadata.src_node_id = node
        reply.content = RecordDict(
            {
                "metrics": MetricRecord(
                    {
                        "partition-id": self.partitions[node],
                        "num-partitions": self.num_partitions,
                        "num-examples": 10 + self.partitions[node],
                        "cuda": 0,
                        **self.hostile.get(node, {}),
                    }
                )
            }
        )
        return reply


def test_maps_random_node_ids_to_partition_ids():
    grid = FakeGrid({9_001: 2, 42: 0, 77_777: 1}, num_partitions=3)
    members = discover_clients(grid, 3, wait_seconds=5, log=lambda _: None)
    assert members.node_of_partition == {0: 42, 1: 77_777, 2: 9_001}
    assert members.num_examples == {0: 10, 1: 11, 2: 12}
    assert members.partition_ids == [0, 1, 2]


def test_nodes_expecting_another_federation_size_are_refused():
    grid = FakeGrid({1: 0, 2: 1, 3: 2}, num_partitions=3)
    with pytest.raises(ConfigError) as info:
        discover_clients(grid, 2, wait_seconds=5, log=lambda _: None)
    assert info.value.parameter == "num-clients" and "num-supernodes=2" in str(info.value)


def test_two_nodes_claiming_one_partition_are_refused():
    grid = FakeGrid({1: 0, 2: 0}, num_partitions=2)
    with pytest.raises(ConfigError, match="partition-id=0"):
        discover_clients(grid, 2, wait_seconds=5, log=lambda _: None)


def test_too_few_nodes_in_time_names_num_clients_and_the_fix():
    grid = FakeGrid({1: 0}, num_partitions=4)  # each node agrees on 4, but only one is up
    with pytest.raises(ConfigError) as info:
        discover_clients(grid, 4, wait_seconds=0.5, log=lambda _: None, settle_seconds=0.1)
    assert "num-supernodes=4" in str(info.value) and "1 SuperNodes" in str(info.value)


def test_an_unlearning_request_goes_on_with_the_nodes_there_after_the_wait():
    """``partial``: the request's methods go on without the others or are refused, naming them."""
    grid = FakeGrid({7: 0, 9: 2}, num_partitions=4)  # partitions 1 and 3 are offline
    lines = []
    members = discover_clients(
        grid, 4, wait_seconds=0.6, log=lines.append, partial=True, settle_seconds=0.1
    )
    assert len(grid.sent) == 2  # asked once when they settled, not again at the deadline
    assert members.node_of_partition == {0: 7, 2: 9}
    assert members.unconnected == frozenset({1, 3})
    assert members.nodes() == [7, 9]
    assert "2 of 4 SuperNodes connected within node-wait-seconds=0.6" in lines[-1]
    with pytest.raises(ConfigError, match="at most the 0 SuperNodes"):  # none: nothing to go on with
        discover_clients(FakeGrid({}, 4), 4, wait_seconds=0.2, log=lambda _: None, partial=True)
    with pytest.raises(ConfigError, match="num-partitions \\(3\\)"):  # still checked
        discover_clients(
            FakeGrid({1: 0}, num_partitions=3), 4, wait_seconds=0.3, log=print, partial=True
        )


def test_a_settled_smaller_simulation_is_refused_without_waiting_the_full_timeout():
    grid = FakeGrid({1: 0, 2: 1, 3: 2}, num_partitions=3)
    with pytest.raises(ConfigError, match="num-partitions \\(3\\)"):
        discover_clients(grid, 4, wait_seconds=60, log=lambda _: None, settle_seconds=0.2)


@pytest.mark.parametrize(
    "hostile, fragment",
    [
        ({"num-examples": 10**12}, "num-examples"),
        ({"num-examples": 10.5}, "not an integer"),
        ({"num-examples": float("nan")}, "not finite"),
        ({"partition-id": 7}, "partition-id"),
        ({"cuda": 5}, "cuda"),
        ({"extra": 1}, "unexpected 'extra'"),
        ({"num-examples": [5, 6]}, "not a number"),
    ],
)
def test_a_hostile_description_is_refused_naming_the_node(hostile, fragment):
    grid = FakeGrid({42: 0, 43: 1}, num_partitions=2, hostile={43: hostile})
    with pytest.raises(ConfigError) as info:
        discover_clients(grid, 2, wait_seconds=5, log=lambda _: None)
    assert "node 43" in str(info.value) and fragment in str(info.value)


def test_a_node_declaring_another_size_than_the_run_computes_is_refused():
    grid = FakeGrid({42: 0, 43: 1}, num_partitions=2)  # declares 10 and 11
    sizes = {0: 10, 1: 12}
    with pytest.raises(ConfigError, match="node 43.*num-examples = 11 is outside \\[12, 12\\]"):
        discover_clients(grid, 2, wait_seconds=5, log=lambda _: None, partition_sizes=sizes)
    members = discover_clients(
        grid, 2, wait_seconds=5, log=lambda _: None, partition_sizes={0: 10, 1: 11}
    )
    assert members.num_examples == {0: 10, 1: 11}


def test_discovery_sends_the_run_settings():
    grid = FakeGrid({42: 0}, num_partitions=1)
    discover_clients(grid, 1, wait_seconds=5, log=lambda _: None, settings={"run.seed": 3})
    assert all(m.content["config"]["run.seed"] == 3 for m in grid.sent)


class SizesGrid(FakeGrid):
    """Nodes started with different ``num-partitions`` (node -> its size)."""

    def __init__(self, sizes: dict[int, int]):
        super().__init__({node: 0 for node in sizes}, num_partitions=0)
        self.sizes = sizes

    def answer(self, message):
        self.num_partitions = self.sizes[message.metadata.dst_node_id]
        return super().answer(message)


def test_num_clients_zero_adopts_the_size_the_nodes_were_started_with():
    grid = FakeGrid({9_001: 1, 42: 0}, num_partitions=2)
    lines = []
    config = adopt_federation_size(grid, ExperimentConfig.from_run_config({}), log=lines.append)
    assert config.num_clients == 2
    assert any("adopting the federation's size, 2 SuperNode(s)" in line for line in lines)
    # The probe asks with num-clients = 0, which a node answers without loading its data.
    assert all(m.content["config"]["run.num-clients"] == 0 for m in grid.sent)
    members = discover_clients(grid, config.num_clients, wait_seconds=5, log=lambda _: None)
    assert members.partition_ids == [0, 1]


def test_a_set_num_clients_is_kept_and_a_different_federation_refused_before_any_write(tmp_path):
    grid = FakeGrid({1: 0, 2: 1}, num_partitions=2)
    config = ExperimentConfig.from_run_config({"num-clients": 10, "output-dir": str(tmp_path)})
    assert adopt_federation_size(grid, config, log=lambda _: None) is config
    assert grid.sent == []  # nothing asked: discovery compares the set K with the federation
    with pytest.raises(ConfigError) as info:
        discover_clients(grid, config.num_clients, wait_seconds=5, log=lambda _: None)
    assert info.value.parameter == "num-clients" and "num-partitions (2)" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_nodes_that_disagree_on_the_size_are_refused():
    grid = SizesGrid({1: 2, 2: 3})
    with pytest.raises(ConfigError, match=r"declare num-partitions \[2, 3\]") as info:
        federation_size(grid, 5, log=lambda _: None)
    assert info.value.parameter == "num-clients"


def test_no_node_to_adopt_the_size_of_is_refused_after_the_wait():
    grid = FakeGrid({}, num_partitions=2)
    with pytest.raises(ConfigError, match="no SuperNode connected within node-wait-seconds=0.2"):
        federation_size(grid, 0.2, log=lambda _: None)
