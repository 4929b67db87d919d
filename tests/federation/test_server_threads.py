"""The ServerApp's own tensor work runs on one thread unless OMP_NUM_THREADS says otherwise, and
a federation's members are looked up by node in constant time."""

from __future__ import annotations

import pytest
import torch

from server.federation import FederationMembers
from server.threads import DEFAULT_SERVER_THREADS, use_server_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("environment", "expected"),
    [(None, DEFAULT_SERVER_THREADS), ("3", 3), ("0", DEFAULT_SERVER_THREADS), ("x", 1)],
)
def test_server_threads_follow_omp_num_threads_when_it_is_a_positive_integer(
    monkeypatch, restore_threads, environment, expected
):
    if environment is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", environment)
    assert use_server_threads() == expected
    assert torch.get_num_threads() == expected


def test_partition_of_maps_every_member_node_and_nothing_else():
    nodes = {p: 10_000 + 7 * p for p in range(1000)}
    members = FederationMembers(nodes, {p: 60 for p in nodes}, 0)
    assert all(members.partition_of(node) == p for p, node in nodes.items())
    assert members.partition_of(12) is None
    members.dropped[5] = "refused"
    assert members.nodes(exclude=[0, 1]) == [nodes[p] for p in range(2, 1000) if p != 5]
