"""The ServerApp's own tensor work runs on one thread unless OMP_NUM_THREADS says otherwise, and
a federation's members are looked up by node in constant time."""

from __future__ import annotations

import pytest
import torch

from server.federation.members import FederationMembers
from server.federation.threads import DEFAULT_SERVER_THREADS, use_server_threads


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


def test_freed_heap_memory_goes_back_to_the_os_on_glibc():
    import sys

    from fedunlearn.memory import current_rss_bytes, release_free_memory

    if not sys.platform.startswith("linux"):
        assert release_free_memory() is False
        return
    # Freeing one mmapped block raises glibc's mmap threshold above it (its dynamic threshold), so
    # the round's replies that follow come from the heap, as they do in a long-running server.
    first = bytearray(2_000_000)
    del first
    blocks = [bytearray(1_700_000) for _ in range(300)]  # a round's replies, MNIST-CNN-sized
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touch every page
    keep = blocks[::50]  # some survive, so the heap cannot simply shrink from the top
    del blocks
    before = current_rss_bytes()
    assert release_free_memory() is True
    assert current_rss_bytes() < before - 100 * 1024 * 1024
    assert len(keep) == 6
