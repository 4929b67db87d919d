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
from collections import deque
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


def check_nodes(replies, asked: Mapping[int, int | None], op: str, who: str) -> dict[int, Message]:
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

#: Messages in flight at once on Flower's in-memory simulation (:func:`in_flight_limit`).
SIMULATION_IN_FLIGHT = 32


def in_flight_limit(grid: Grid) -> int | None:
    """How many messages :func:`collect_replies` keeps pushed but unanswered: all of them (None),
    except on Flower's simulation, whose grid holds an in-memory LinkState
    (``grid.state``, through any wrapper that forwards attributes).

    Flower 1.41's simulation engine looks for each node's next message by scanning every stored
    message, for every node, ten times a second, under the state's lock: O(nodes x messages)
    per pass. With 1,000 clients and a round's 1,000 messages pushed at once that is a million
    expiry checks a pass, in the ServerApp's own process. Only the client workers' concurrency
    (2 on the CI machine) is run at once anyway, so :data:`SIMULATION_IN_FLIGHT` messages in
    flight keep them busy and the scan O(nodes). Since :mod:`server.federation.message_index`
    a node's lookup reads its own messages only, so a pass costs O(nodes) dict lookups whatever
    the window; the window still bounds the messages held in memory. A grid that names its own
    window (``grid.in_flight_window``: the local engine's, ``simulations.local_engine``) gets it.
    A deployed federation gets every message at once: its nodes train in parallel.

    A window also keeps the pulls fast (every ``PULL_SECONDS[0]``): without one, pulls that find
    nothing back off to ``PULL_SECONDS[1]``, which a simulation's clients, answering in
    fractions of a second, would wait for.
    """
    window = getattr(grid, "in_flight_window", None)
    if isinstance(window, int) and window > 0:
        return window
    state = getattr(grid, "state", None)
    return SIMULATION_IN_FLIGHT if type(state).__name__ == "InMemoryLinkState" else None


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
    in_flight: int | None = -1,
    on_reply: Callable[[Message], None] | None = None,
) -> list[Message]:
    """Send ``messages`` and return their replies in arrival order once all have arrived or
    ``timeout`` seconds have passed (a missing reply is simply absent; error replies are kept; a
    message still unsent at the timeout is not sent). With ``on_reply``, each reply is handed to
    it as it arrives and none is kept (the list returned is empty): a round folded reply by reply.

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
    in_flight : int or None (default: :func:`in_flight_limit` of ``grid``)
        Messages pushed but unanswered at most; the next are pushed as replies come in, and
        the pulls then come every ``PULL_SECONDS[0]`` so the clients never wait. None: all at once.
    on_reply : callable, optional
        ``on_reply(reply)`` for each reply as it arrives, instead of returning it.
    """
    unsent = deque(messages)
    limit = in_flight_limit(grid) if in_flight == -1 else in_flight
    heartbeat = (
        Heartbeat(log, label, len(unsent), interval=heartbeat_seconds, clock=clock)
        if log is not None
        else None
    )
    pause = PULL_SECONDS[0]
    deadline = clock() + timeout
    pending: set[str] = set()
    replies: list[Message] = []
    answered = 0
    _push(grid, unsent, pending, limit, always=True)  # even an empty round is sent, as before
    while pending:
        arrived = list(grid.pull_messages(pending))
        pending -= {reply.metadata.reply_to_message_id for reply in arrived}
        answered += len(arrived)
        got_some = bool(arrived)
        if on_reply is None:
            replies += arrived
        else:
            for reply in arrived:
                on_reply(reply)
            del arrived[:]  # let each reply go once it is folded
        if clock() >= deadline:
            break
        _push(grid, unsent, pending, limit)
        if not pending:
            break
        if heartbeat is not None:
            heartbeat.beat(answered)
        fast = got_some or limit is not None  # a window refills only when it is pulled
        pause = PULL_SECONDS[0] if fast else min(2 * pause, PULL_SECONDS[1])
        sleep(pause)
    return replies


def _push(
    grid: Grid, unsent: deque, pending: set[str], limit: int | None, *, always: bool = False
) -> None:
    """Push messages from ``unsent`` until ``limit`` are in flight (all when None); an empty
    batch is pushed only when ``always``."""
    room = len(unsent) if limit is None else max(limit - len(pending), 0)
    batch = [unsent.popleft() for _ in range(min(room, len(unsent)))]
    if batch or always:
        pending.update(grid.push_messages(batch))


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
