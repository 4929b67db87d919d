"""Asking nodes and waiting for their replies: the one place the server sends messages.

Every phase that addresses clients (discovery, the training rounds, FedEraser's calibration, the
certified head's queries) sends through :func:`collect_replies`: it pushes the messages, pulls the
replies as they arrive (Flower's ``Grid.push_messages`` / ``pull_messages``; ``send_and_receive``
would block silently until the last one) and logs a :class:`server.progress.Heartbeat` line while
it waits, until every message is answered or ``reply-timeout`` seconds have passed.

:func:`query_nodes` is the strict form for queries that need every node's answer: a failed or
missing reply fails the query naming every such node, and a reply from a node that was not asked,
or a second one, is refused (:func:`check_nodes`). The training rounds and
calibration decide themselves what a missing reply means (``min-reply-fraction``) and use
:func:`collect_replies`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from flwr.app import Message
from flwr.serverapp import Grid

from fedunlearn.errors import FedUnlearnError
from server.progress import HEARTBEAT_SECONDS, Heartbeat, Log


class BadReplyError(FedUnlearnError, RuntimeError):
    """A client's reply to a plug-in's query (``who``: the certified head, scrubbing) was refused."""

    def __init__(
        self, node: int, partition: int | None, op: str, reason: str, who: str = "certified head"
    ) -> None:
        self.node, self.partition, self.op, self.reason = node, partition, op, reason
        where = f"node {node}" + ("" if partition is None else f" (partition {partition})")
        super().__init__(f"{who}: {where} sent a bad {op!r} reply, refused: {reason}")


class QueryFailedError(FedUnlearnError, RuntimeError):
    """A plug-in's query failed on a client or got no reply in time (nodes named)."""


def check_sources(
    replies, asked: Mapping[int, int], op: str, who: str = "certified head"
) -> dict[int, Message]:
    """A query's replies keyed by partition, refused unless each comes from a node that was asked
    (node -> partition in ``asked``), once; a failed or missing reply fails the query, naming
    every such node and partition (a plug-in's query needs every client's sums)."""
    return {asked[node]: reply for node, reply in check_nodes(replies, asked, op, who).items()}


def check_nodes(
    replies, asked: Mapping[int, int | None], op: str, who: str
) -> dict[int, Message]:
    """:func:`check_sources` keyed by node; a node whose partition is not known yet (``None`` in
    ``asked``, e.g. at discovery) is named by its node id alone."""

    def where(node: int) -> str:
        return f"node {node}" + ("" if asked[node] is None else f" (partition {asked[node]})")

    by_node: dict[int, Message] = {}
    errors = []
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in asked:
            raise BadReplyError(node, None, op, "this node was not asked", who)
        if node in by_node:
            raise BadReplyError(node, asked[node], op, "it replied twice", who)
        by_node[node] = reply
        if reply.has_error():
            reason = reply.error.reason.strip().splitlines()
            errors.append(f"{where(node)}: {reason[-1] if reason else '?'}")
    missing = [where(node) for node in asked if node not in by_node]
    if missing:
        errors.append(f"no reply before the timeout from {', '.join(missing)}")
    if errors:
        raise QueryFailedError(f"{who}: {op} failed: {'; '.join(errors)}")
    return by_node


#: Seconds between two pulls while replies are outstanding: from the first, doubling after every
#: pull that brought nothing, up to the last; quick replies are seen at once, and a long round
#: costs the SuperLink one pull a second (Flower's own loop pulls every 0.1 s in simulation, every
#: 3 s deployed).
PULL_SECONDS = (0.05, 1.0)


def collect_replies(
    grid: Grid,
    messages: Iterable[Message],
    *,
    timeout: float,
    label: str = "",
    log: Log | None = None,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Message]:
    """Send ``messages`` and return their replies in arrival order once all have arrived or
    ``timeout`` seconds have passed (a missing reply is simply absent; error replies are kept).

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    messages : iterable of Message
        One message per node asked.
    timeout : float
        Seconds to wait for the replies (the run's ``reply-timeout``).
    label : str
        What the wait is for, in the heartbeat line (``"round 3"``).
    log : Log, optional
        Where the heartbeat lines go; none without it.
    heartbeat_seconds : float (default: 10)
        Seconds between two heartbeat lines.
    clock, sleep : callable
        Time source and pause between pulls (a test's fake time).
    """
    messages = list(messages)
    heartbeat = (
        Heartbeat(log, label, len(messages), interval=heartbeat_seconds, clock=clock)
        if log is not None
        else None
    )
    pause = PULL_SECONDS[0]
    deadline = clock() + timeout
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    while pending:
        arrived = list(grid.pull_messages(pending))
        replies += arrived
        pending -= {reply.metadata.reply_to_message_id for reply in arrived}
        if not pending or clock() >= deadline:
            break
        if heartbeat is not None:
            heartbeat.beat(len(replies))
        pause = PULL_SECONDS[0] if arrived else min(2 * pause, PULL_SECONDS[1])
        sleep(pause)
    return replies


def query_nodes(
    grid: Grid,
    messages: Iterable[Message],
    *,
    op: str,
    who: str,
    timeout: float,
    partition_of: Mapping[int, int] | None = None,
    log: Log | None = None,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
) -> dict[int, Message]:
    """Send ``messages`` and return every node's reply, keyed by node id.

    ``op`` and ``who`` name the query and its asker in errors (``"prepare"``, ``"certified
    head"``); ``partition_of`` (node -> partition) adds each node's partition to them. ``log``
    receives the heartbeat (:func:`collect_replies`).

    Raises
    ------
    QueryFailedError
        When a node replied with an error or not before ``timeout`` seconds (every such node named).
    BadReplyError
        When a reply comes from a node that was not asked, or a node replies twice.
    """
    messages = list(messages)
    asked = {
        m.metadata.dst_node_id: (partition_of or {}).get(m.metadata.dst_node_id) for m in messages
    }
    replies = collect_replies(
        grid,
        messages,
        timeout=timeout,
        label=f"{who}: {op}",
        log=log,
        heartbeat_seconds=heartbeat_seconds,
    )
    return check_nodes(replies, asked, op, who)
