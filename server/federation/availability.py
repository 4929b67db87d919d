"""Which of the clients a phase needs are connected: a federation loses SuperNodes and gets them
back, and the server must go on with those there, or say which are missing.

Flower's strategies wait, with no time limit, until ``min_available_nodes`` nodes are connected
(``flwr.serverapp.strategy.strategy_utils.sample_nodes``): a run whose minimum is its K would hang
at the first round after a SuperNode is lost. Our strategies therefore run with minimums of 1
(:func:`strategies.aggregation.aggregation_strategy`) and this module's rule decides instead
(:class:`RoundAvailability`, given to :class:`strategies.retaining.Retaining`): a round trains the
connected nodes of its roster once at least ``min-reply-fraction`` of the roster is connected,
waits up to ``node-wait-seconds`` for that many, then refuses, naming the clients offline. A
SuperNode that comes back (an authenticated one keeps its node id) is trained again from the next
round on.

An unlearning request first waits up to ``reply-timeout`` for the remaining clients' nodes
(:func:`await_clients`); those still offline then are named, and each method either proceeds with
the clients there or is refused for the request (``MethodSpec.offline``). Those offline, with
those dropped for refused replies, are the run's account of who is missing
(:mod:`server.federation.missing`), which each later phase that needs every client consults.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping

from fedunlearn.errors import FedUnlearnError
from server.progress import Log, round_label

#: How often a wait for offline nodes says so.
WAIT_LOG_SECONDS = 10.0


class OfflineClients(FedUnlearnError, RuntimeError):
    """Too few of the clients a phase needs are connected (``offline``: partition -> node id, or
    None for a client whose node never connected in this run)."""

    def __init__(self, message: str, offline: Mapping[int, int | None]) -> None:
        super().__init__(message)
        self.offline = dict(offline)


def describe_offline(offline: Mapping[int, int | None]) -> str:
    """``client(s) 3, 7 (nodes 123, 456)``: who is offline, for one log line or error."""
    clients = ", ".join(str(p) for p in sorted(offline))
    nodes = [str(offline[p]) for p in sorted(offline) if offline[p] is not None]
    unknown = len(offline) - len(nodes)
    where = [f"node(s) {', '.join(nodes)}"] if nodes else []
    where += [f"{unknown} never connected in this run"] if unknown else []
    return f"client(s) {clients} ({'; '.join(where)})"


class RoundAvailability:
    """``available(server_round, grid) -> node ids``: the connected nodes of a phase's roster that
    a round may train, once at least ``min-reply-fraction`` of the roster is connected
    (``grid.get_node_ids()``: the nodes connected now).

    Parameters
    ----------
    roster : callable
        Node -> partition of the nodes the phase trains (read each round: a client dropped for
        hostile replies leaves it).
    min_fraction : float
        ``min-reply-fraction``: at least ``ceil(min_fraction * len(roster))`` must be connected.
    wait_seconds : float
        ``node-wait-seconds``: how long a round waits for them before it is refused.
    phase : str
        Names the rounds in the log and in the refusal.
    """

    def __init__(
        self,
        roster: Callable[[], Mapping[int, int]],
        *,
        min_fraction: float,
        wait_seconds: float,
        phase: str,
        log: Log = print,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.roster = roster
        self.min_fraction, self.wait_seconds = min_fraction, wait_seconds
        self.phase, self.log, self.sleep = phase, log, sleep
        self._said: frozenset[int] = frozenset()  # the offline set last logged

    def needed(self, roster_size: int) -> int:
        return max(1, math.ceil(self.min_fraction * roster_size - 1e-9))

    def __call__(self, server_round: int, grid) -> list[int]:
        roster = dict(self.roster())
        needed = self.needed(len(roster))
        label = round_label(self.phase, server_round)

        def look() -> tuple[set[int], dict[int, int]]:
            connected = set(grid.get_node_ids()) & set(roster)
            return connected, {roster[n]: n for n in roster if n not in connected}

        def say(seen) -> None:
            self.log(
                f"{label}: waiting for clients, {len(seen[0])} of "
                f"{len(roster)} connected, {needed} needed; offline: {describe_offline(seen[1])}"
            )

        enough = lambda seen: len(seen[0]) >= needed  # noqa: E731
        (connected, offline), ok = _wait_until(look, enough, self.wait_seconds, say, self.sleep)
        if not ok:
            raise OfflineClients(
                f"{label}: {len(connected)} of its {len(roster)} clients "
                f"connected, fewer than min-reply-fraction={self.min_fraction:g} requires "
                f"({needed}), after node-wait-seconds={self.wait_seconds:g}; offline: "
                f"{describe_offline(offline)}. Restart their SuperNodes and resume the run "
                "(resume = true)",
                offline,
            )
        self._say(label, offline, len(connected), len(roster))
        return sorted(connected)

    def _say(self, label: str, offline: dict[int, int], connected: int, total: int) -> None:
        """One line whenever the set of offline clients changes (not every round)."""
        key = frozenset(offline)
        if key == self._said:
            return
        self._said = key
        if offline:
            self.log(
                f"{label}: {describe_offline(offline)} offline; going on with "
                f"the {connected} of {total} connected (min-reply-fraction="
                f"{self.min_fraction:g})"
            )
        else:
            self.log(f"{label}: every one of the {total} clients connected again")


def await_clients(
    grid_nodes: Callable[[], Collection[int]],
    nodes: Mapping[int, int | None],
    wait_seconds: float,
    *,
    what: str,
    log: Log = print,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, int | None]:
    """Wait up to ``wait_seconds`` until every client of ``nodes`` (partition -> node id, None for
    one whose node never connected in this run, which cannot come back within it) is connected;
    returns those still offline then (partition -> node), empty when all are there."""

    def look() -> dict[int, int | None]:
        connected = set(grid_nodes())
        return {p: n for p, n in nodes.items() if n is None or n not in connected}

    def say(offline) -> None:
        log(
            f"{what}: waiting up to {wait_seconds:g}s (reply-timeout) for "
            f"{describe_offline(offline)} to connect"
        )

    awaited = lambda offline: all(n is None for n in offline.values())  # noqa: E731
    offline, _ = _wait_until(look, awaited, wait_seconds, say, sleep)
    return offline


def _wait_until(look, done, wait_seconds: float, say, sleep):
    """``(seen, True)`` once ``done(seen := look())``, or ``(seen, False)`` after ``wait_seconds``;
    ``say(seen)`` every :data:`WAIT_LOG_SECONDS` while it waits."""
    deadline = time.monotonic() + wait_seconds
    last_log = -math.inf
    while True:
        seen = look()
        if done(seen):
            return seen, True
        now = time.monotonic()
        if now >= deadline:
            return seen, False
        if now - last_log >= WAIT_LOG_SECONDS:
            say(seen)
            last_log = now
        sleep(0.5)


def roster_availability(
    config,
    members,
    nodes: Collection[int] | None = None,
    *,
    phase: str,
    log: Log = print,
    every: bool = False,
) -> RoundAvailability:
    """The run's rule (``min-reply-fraction``, ``node-wait-seconds``) over ``nodes`` (default:
    every member), less the clients dropped from the run, as they are dropped; ``every``: each
    round needs all of them (DP-FedAvg)."""
    chosen = None if nodes is None else frozenset(nodes)

    def roster() -> dict[int, int]:
        mapped = {members.node_of_partition[p]: p for p in members.partition_ids}
        return mapped if chosen is None else {n: p for n, p in mapped.items() if n in chosen}

    return RoundAvailability(
        roster,
        min_fraction=1.0 if every else config.min_reply_fraction,
        wait_seconds=config.node_wait_seconds,
        phase=phase,
        log=log,
    )
