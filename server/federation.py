"""Who is in the federation: map Flower's random node ids to the clients' partition ids.

The server needs this before it addresses clients itself (FedEraser must never message a forgotten
client) and to refuse, before anything is written, a federation whose size does not match
``num-clients``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.errors import ConfigError

DESCRIBE = "query.describe"


@dataclass(frozen=True)
class FederationMembers:
    """Node id of each partition id, and each partition's sample count N_k."""

    node_of_partition: dict[int, int]
    num_examples: dict[int, int]
    cuda_clients: int

    @property
    def partition_ids(self) -> list[int]:
        return sorted(self.node_of_partition)


def failure_reasons(replies) -> str:
    """The distinct last lines of the failed replies' errors, for one readable message."""
    failed = [r for r in replies if r.has_error()]
    return "; ".join(sorted({r.error.reason.strip().splitlines()[-1] for r in failed}))


def discover_clients(
    grid: Grid,
    num_clients: int,
    wait_seconds: float,
    *,
    log: Callable[[str], None] = print,
    settle_seconds: float = 3.0,
) -> FederationMembers:
    """Wait for ``num_clients`` nodes and ask each for its partition (``query.describe``).

    Raises
    ------
    ConfigError
        ``num-clients`` when nodes report another federation size, when fewer than ``num_clients``
        nodes connect within ``wait_seconds``, or when two nodes claim one partition.
    RuntimeError
        When a node fails to describe itself (its error is quoted).
    """
    deadline = time.monotonic() + wait_seconds
    last_count, last_change, last_log, checked = -1, time.monotonic(), 0.0, -1
    while True:
        nodes = sorted(grid.get_node_ids())
        now = time.monotonic()
        if len(nodes) != last_count:
            last_count, last_change = len(nodes), now
        if len(nodes) >= num_clients:
            break
        # A settled, smaller federation may just be misconfigured: ask it now rather than wait.
        if nodes and now - last_change >= settle_seconds and checked != len(nodes):
            _describe(grid, nodes, num_clients)
            checked = len(nodes)
        if now >= deadline:
            raise ConfigError(
                "num-clients",
                num_clients,
                f"at most the {len(nodes)} SuperNodes that connected within node-wait-seconds="
                f"{wait_seconds:g}; start the simulation with --federation-config "
                f"'num-supernodes={num_clients}' or start more SuperNodes",
            )
        if now - last_log >= 10:
            log(f"waiting for clients: {len(nodes)}/{num_clients} connected")
            last_log = now
        time.sleep(0.5)
    return _describe(grid, nodes, num_clients)


def _describe(grid: Grid, nodes: list[int], num_clients: int) -> FederationMembers:
    messages = [Message(RecordDict(), dst_node_id=node, message_type=DESCRIBE) for node in nodes]
    replies = list(grid.send_and_receive(messages, timeout=600))
    failures = [r for r in replies if r.has_error()]
    if failures:
        raise RuntimeError(
            f"{len(failures)} client(s) could not start: {failure_reasons(failures)}"
        )
    node_of_partition: dict[int, int] = {}
    num_examples: dict[int, int] = {}
    cuda = 0
    for reply in replies:
        metrics = reply.content["metrics"]
        partition, size = int(metrics["partition-id"]), int(metrics["num-partitions"])
        if size != num_clients:
            raise ConfigError(
                "num-clients",
                num_clients,
                f"equal to the federation's num-partitions ({size}); run the simulation with "
                f"--federation-config 'num-supernodes={num_clients}' or set num-clients={size}",
            )
        if partition in node_of_partition:
            raise ConfigError(
                "partition-id",
                partition,
                f"unique per SuperNode, but nodes {node_of_partition[partition]} and "
                f"{reply.metadata.src_node_id} both claim it",
            )
        node_of_partition[partition] = reply.metadata.src_node_id
        num_examples[partition] = int(metrics["num-examples"])
        cuda += int(metrics.get("cuda", 0))
    return FederationMembers(node_of_partition, num_examples, cuda)
