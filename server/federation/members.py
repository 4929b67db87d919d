"""Who is in the federation: map Flower's random node ids to the clients' partition ids.

The server needs this before it addresses clients itself (FedEraser must never message a forgotten
client) and to refuse, before anything is written, a federation whose size does not match
``num-clients``. With ``num-clients`` = 0 (not set) the server first asks the connected nodes the
size they were started with (their ``num-partitions``) and adopts it
(:func:`adopt_federation_size`), so that ``flwr run . --stream`` runs on whatever federation the
connection provides.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.config import ADOPT_FEDERATION_SIZE, ExperimentConfig
from fedunlearn.data.federated_data import run_settings
from fedunlearn.errors import ConfigError
from fedunlearn.messages import DESCRIBE
from fedunlearn.preflight import CHECKS_NEEDING_K
from fedunlearn.reply_checks import DESCRIBE_METRICS, RefusedReply, check_count, check_metrics
from fedunlearn.training.sampling import round_seed, sample_partitions
from server.federation.queries import query_nodes
from server.progress import Log


@dataclass(frozen=True)
class FederationMembers:
    """Node id of each partition id, each partition's sample count N_k as its node declared it, and
    the partitions dropped from the run (partition -> why; their nodes get no further message)."""

    node_of_partition: dict[int, int]
    num_examples: dict[int, int]
    cuda_clients: int
    dropped: dict[int, str] = field(default_factory=dict)
    #: partitions of the federation whose SuperNode did not connect in time (an unlearning
    #: request that went on without them, ``discover_clients(partial=True)``)
    unconnected: frozenset[int] = frozenset()
    #: partition_of's index (node -> partition): a reply is screened in O(1), not O(K).
    _partition_of_node: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {node: partition for partition, node in self.node_of_partition.items()}
        object.__setattr__(self, "_partition_of_node", index)

    @property
    def partition_ids(self) -> list[int]:
        """The partitions still taking part (not dropped), ascending."""
        return sorted(p for p in self.node_of_partition if p not in self.dropped)

    def nodes(self, exclude: Collection[int] = ()) -> list[int]:
        """Node ids of the partitions still taking part, less the partitions ``exclude``."""
        excluded = set(exclude)
        return [self.node_of_partition[p] for p in self.partition_ids if p not in excluded]

    def partition_of(self, node: int) -> int | None:
        """The partition ``node`` is bound to, or ``None`` for a node discovery did not map."""
        return self._partition_of_node.get(node)


def round_sampler(members: FederationMembers, config, phase: str):
    """``sample(server_round, nodes)``: the nodes of ``nodes`` that a round of ``phase`` trains,
    drawn by partition with the run's seed (:func:`fedunlearn.training.sampling.sample_partitions`:
    the same clients in a rerun, whatever node ids they got); None at ``fraction-train`` 1."""
    if config.fraction_train >= 1:
        return None

    def sample(server_round: int, nodes: Collection[int]) -> list[int]:
        by_partition = {members.partition_of(n): n for n in nodes}
        by_partition.pop(None, None)
        seed = round_seed(config.seed, phase, server_round)
        chosen = sample_partitions(
            by_partition, config.fraction_train, config.min_train_clients, seed
        )
        return [by_partition[p] for p in chosen]

    return sample


def failure_reasons(replies) -> str:
    """The distinct last lines of the failed replies' errors, for one readable message."""
    failed = [r for r in replies if r.has_error()]
    return "; ".join(sorted({r.error.reason.strip().splitlines()[-1] for r in failed}))


def adopt_federation_size(
    grid: Grid, config: ExperimentConfig, *, log: Log = print
) -> ExperimentConfig:
    """``config`` with ``num-clients`` resolved, before anything is written: unchanged when it is
    set (discovery refuses a federation of another size) or when an ``unlearn-only`` request
    reopens a trained run (whose own K counts); else the federation's size
    (:func:`federation_size`), adopted and logged
    (:meth:`~fedunlearn.config.ExperimentConfig.with_federation_size`)."""
    if config.num_clients != ADOPT_FEDERATION_SIZE or config.unlearn_only:
        return config
    size = federation_size(
        grid,
        config.node_wait_seconds,
        settings=run_settings(config),
        reply_timeout=config.reply_timeout,
        log=log,
    )
    log(
        f"num-clients not set (0): adopting the federation's size, {size} SuperNode(s), as "
        f"num-clients; now checking what needs it: {'; '.join(CHECKS_NEEDING_K)}"
    )
    return config.with_federation_size(size)


def federation_size(
    grid: Grid,
    wait_seconds: float,
    *,
    settings: Mapping[str, Any] | None = None,
    reply_timeout: float = 3600.0,
    log: Log = print,
) -> int:
    """The number of SuperNodes the federation was started with: the ``num-partitions`` the nodes
    connected so far declare (``query.describe`` with ``num-clients`` = 0 in ``settings``, which a
    node answers without loading its data). Waits ``wait_seconds`` for a first node.

    Raises
    ------
    ConfigError
        ``num-clients`` when no node connects in time or when the nodes declare different sizes;
        ``partition-id`` when a node's description fails a check.
    """
    deadline, last_log = time.monotonic() + wait_seconds, 0.0
    while not (nodes := sorted(grid.get_node_ids())):
        now = time.monotonic()
        if now >= deadline:
            raise ConfigError(
                "num-clients",
                ADOPT_FEDERATION_SIZE,
                f"a federation to adopt the size of, but no SuperNode connected within "
                f"node-wait-seconds={wait_seconds:g}",
            )
        if now - last_log >= 10:
            log("waiting for a first SuperNode to learn the federation's size")
            last_log = now
        time.sleep(0.5)
    sizes = {
        node: description[1]
        for node, description in _descriptions(
            grid, nodes, ADOPT_FEDERATION_SIZE, dict(settings or {}), None, reply_timeout, log
        ).items()
    }
    if len(set(sizes.values())) != 1:
        raise ConfigError(
            "num-clients",
            ADOPT_FEDERATION_SIZE,
            f"a federation whose SuperNodes agree on its size, but they declare num-partitions "
            f"{sorted(set(sizes.values()))}; start them with the same num-partitions",
        )
    return next(iter(sizes.values()))


def discover_clients(
    grid: Grid,
    num_clients: int,
    wait_seconds: float,
    *,
    log: Log = print,
    settle_seconds: float = 3.0,
    settings: Mapping[str, Any] | None = None,
    partition_sizes: Mapping[int, int] | None = None,
    reply_timeout: float = 3600.0,
    partial: bool = False,
) -> FederationMembers:
    """Wait for ``num_clients`` nodes and ask each for its partition (``query.describe``).
    ``partial``: when fewer connect within ``wait_seconds``, go on with those (an unlearning
    request, whose methods go on without the others or are refused); the others are
    ``unconnected``.

    ``settings`` (the run's data settings, :func:`fedunlearn.data.federated_data.run_settings`) go with
    the question, so every node describes the partition of the run's data. ``partition_sizes``, the
    sizes the server computes from the same settings, bound what a node may declare: the reply of a
    node claiming another size is refused. Each description is awaited ``reply_timeout`` seconds.

    Raises
    ------
    ConfigError
        ``num-clients`` when nodes report another federation size, when fewer than ``num_clients``
        nodes connect within ``wait_seconds``, or when two nodes claim one partition;
        ``partition-id`` when a node's description fails a check (the node is named).
    server.federation.queries.QueryFailedError
        When a node fails to describe itself (its error is quoted) or does not reply in time.
    """
    describe = lambda nodes: _describe(  # noqa: E731
        grid, nodes, num_clients, dict(settings or {}), partition_sizes, reply_timeout, log
    )
    deadline = time.monotonic() + wait_seconds
    last_count, last_change, last_log = -1, time.monotonic(), 0.0
    checked: tuple[list[int], FederationMembers] | None = None  # the last nodes asked, answers
    while True:
        nodes = sorted(grid.get_node_ids())
        now = time.monotonic()
        if len(nodes) != last_count:
            last_count, last_change = len(nodes), now
        if len(nodes) >= num_clients:
            break
        # A settled, smaller federation may just be misconfigured: ask it now rather than wait.
        if (
            nodes
            and now - last_change >= settle_seconds
            and (checked is None or checked[0] != nodes)
        ):
            checked = (nodes, describe(nodes))
        if now >= deadline and partial and nodes:
            log(
                f"{len(nodes)} of {num_clients} SuperNodes connected within node-wait-seconds="
                f"{wait_seconds:g}; going on without the others"
            )
            break
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
    if checked is not None and checked[0] == nodes:
        return checked[1]  # asked already, since no node came or went: not a second round trip
    return describe(nodes)


def _descriptions(
    grid: Grid,
    nodes: list[int],
    num_clients: int,
    settings: dict[str, Any],
    partition_sizes: Mapping[int, int] | None,
    timeout: float,
    log: Log,
) -> dict[int, tuple[int, int, int, int]]:
    """Each node's checked ``query.describe`` reply (:func:`_description`), by node id."""
    messages = [
        Message(
            RecordDict({"config": ConfigRecord(settings)}), dst_node_id=node, message_type=DESCRIBE
        )
        for node in nodes
    ]
    replies = query_nodes(grid, messages, op=DESCRIBE, who="discovery", timeout=timeout, log=log)
    described = {}
    for node, reply in replies.items():
        try:
            described[node] = _description(reply, num_clients, partition_sizes)
        except RefusedReply as refused:
            raise ConfigError(
                "partition-id",
                f"node {node}",
                f"a node that describes itself truthfully; its reply was refused: {refused.reason}",
            ) from None
    return described


def _describe(
    grid: Grid,
    nodes: list[int],
    num_clients: int,
    settings: dict[str, Any],
    partition_sizes: Mapping[int, int] | None,
    timeout: float,
    log: Log,
) -> FederationMembers:
    described = _descriptions(grid, nodes, num_clients, settings, partition_sizes, timeout, log)
    node_of_partition: dict[int, int] = {}
    num_examples: dict[int, int] = {}
    cuda = 0
    for node, (partition, size, examples, on_cuda) in described.items():
        if size != num_clients:
            raise ConfigError(
                "num-clients",
                num_clients,
                f"equal to the federation's num-partitions ({size}); run the simulation with "
                f"--federation-config 'num-supernodes={num_clients}', set num-clients={size}, or "
                "0 to adopt the federation's size",
            )
        if partition in node_of_partition:
            raise ConfigError(
                "partition-id",
                partition,
                f"unique per SuperNode, but nodes {node_of_partition[partition]} and "
                f"{node} both claim it",
            )
        node_of_partition[partition] = node
        num_examples[partition] = examples
        cuda += on_cuda
    unconnected = frozenset(range(num_clients)) - set(node_of_partition)
    return FederationMembers(node_of_partition, num_examples, cuda, unconnected=unconnected)


def _description(
    reply: Message, num_clients: int, partition_sizes: Mapping[int, int] | None
) -> tuple[int, int, int, int]:
    """(partition id, federation size, N_k, on CUDA) of a ``query.describe`` reply, checked."""
    content = reply.content
    if set(content.keys()) != {"metrics"} or "metrics" not in content.metric_records:
        raise RefusedReply(f"records {sorted(content.keys())}, expected only 'metrics'")
    values = check_metrics(content["metrics"], DESCRIBE_METRICS)
    size = check_count("num-partitions", values["num-partitions"], 1, 2**31)
    partition = check_count("partition-id", values["partition-id"], 0, max(size, 1) - 1)
    on_cuda = check_count("cuda", values["cuda"], 0, 1)
    if size != num_clients:  # the node expects another federation: no size to check yet
        return partition, size, 0, on_cuda
    high = 2**31 if partition_sizes is None else partition_sizes[partition]
    low = 1 if partition_sizes is None else partition_sizes[partition]
    examples = check_count("num-examples", values["num-examples"], low, high)
    return partition, size, examples, on_cuda
