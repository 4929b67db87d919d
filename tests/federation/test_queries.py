"""The server's one way of asking nodes: replies collected as they arrive, a heartbeat while it
waits, a clear failure naming every node that failed or did not reply in time."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from server.federation.queries import BadReplyError, QueryFailedError, collect_replies, query_nodes
from server.progress import Heartbeat

pytestmark = pytest.mark.usefixtures("flower_task_identity")


class FakeTime:
    """A clock that only ``sleep`` moves."""

    def __init__(self):
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SlowGrid:
    """Node ``n`` replies ``delays[n]`` seconds after the push (``None``: never); ``errors`` name
    the nodes whose reply is an error; ``impostors`` map a node to the node id its reply claims."""

    def __init__(self, time: FakeTime, delays: dict, errors=(), impostors=None):
        self.time, self.delays, self.errors = time, delays, set(errors)
        self.impostors = impostors or {}
        self.pushed, self.pulls, self.outstanding = [], 0, {}

    def push_messages(self, messages):
        ids = []
        for i, message in enumerate(messages):
            node = message.metadata.dst_node_id
            self.pushed.append(node)
            message_id = f"m{len(self.pushed)}-{i}"
            if self.delays[node] is not None:
                self.outstanding[message_id] = (self.time.now + self.delays[node], node)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        due = [
            i
            for i in message_ids
            if i in self.outstanding and self.outstanding[i][0] <= self.time.now
        ]
        return [self._reply(i, self.outstanding.pop(i)[1]) for i in due]

    def _reply(self, message_id, node):
        reply = Mock(spec=Message)
        reply.metadata.reply_to_message_id = message_id
        reply.metadata.src_node_id = self.impostors.get(node, node)
        reply.has_error.return_value = node in self.errors
        reply.error.reason = f"Traceback ...\nValueError: node {node} has no data"
        return reply


def _messages(nodes):
    return [
        Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type="query.x")
        for n in nodes
    ]


def _collect(grid, time, nodes, *, timeout=100.0, lines=None, label="round 3", **kwargs):
    return collect_replies(
        grid,
        _messages(nodes),
        timeout=timeout,
        label=label,
        log=None if lines is None else lines.append,
        clock=time.clock,
        sleep=time.sleep,
        **kwargs,
    )


def test_replies_are_collected_as_they_arrive_with_a_heartbeat_every_ten_seconds():
    time = FakeTime()
    delays = {n: 3.0 * n for n in range(1, 11)}  # node 10 replies after 30 s
    grid = SlowGrid(time, delays)
    lines = []
    replies = _collect(grid, time, list(delays), lines=lines)
    assert [r.metadata.src_node_id for r in replies] == list(range(1, 11))  # arrival order
    assert 30.0 <= time.now < 31.5  # stops as soon as the last reply is in
    # One line about every 10 s (never two within 10 s), each with the replies in so far.
    assert lines[0] == "  round 3: 3/10 clients replied, 10 s"
    assert len(lines) == 2 and lines[1].startswith("  round 3: ")
    replied, seconds = lines[1].removeprefix("  round 3: ").split(" clients replied, ")
    assert replied in ("6/10", "7/10") and 20 <= int(seconds.removesuffix(" s")) <= 21
    assert grid.pulls < 100  # not a busy loop (pulling every 0.1 s would be 300 pulls)


def test_discovery_says_it_waits_for_clients_to_start_not_that_they_failed():
    time = FakeTime()
    lines = []
    _collect(
        SlowGrid(time, {1: 12.0, 2: 12.0}), time, [1, 2], lines=lines, label="discovery: describe"
    )
    assert lines == ["  discovery: describe: waiting for 2 clients to start (0 ready), 10 s"]


def test_the_heartbeat_interval_is_configurable_and_silent_without_a_log():
    time = FakeTime()
    grid = SlowGrid(time, {1: 2.0, 2: 25.0})
    lines = []
    _collect(grid, time, [1, 2], lines=lines, heartbeat_seconds=5.0)
    assert 4 <= len(lines) <= 5 and all("/2 clients replied" in line for line in lines)
    time = FakeTime()
    assert len(_collect(SlowGrid(time, {1: 2.0, 2: 25.0}), time, [1, 2])) == 2


def test_a_missing_reply_ends_the_wait_at_the_timeout_and_is_simply_absent():
    time = FakeTime()
    grid = SlowGrid(time, {1: 1.0, 2: None, 3: 4.0})
    replies = _collect(grid, time, [1, 2, 3], timeout=20.0)
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 3]
    assert 20.0 <= time.now <= 21.0


def test_a_strict_query_names_every_failed_and_every_silent_node():
    time = FakeTime()
    grid = SlowGrid(time, {7: 0.0, 8: None, 9: 0.0, 10: None}, errors={9})
    with pytest.raises(QueryFailedError) as error:
        query_nodes(
            grid,
            _messages([7, 8, 9, 10]),
            op="sums",
            who="certified head",
            timeout=0.3,
            partition_of={7: 0, 8: 1, 9: 2, 10: 3},
        )
    message = str(error.value)
    assert message.startswith("certified head: sums failed: node 9 (partition 2): ValueError")
    assert "no reply before the timeout from node 8 (partition 1), node 10 (partition 3)" in message
    assert "node 7" not in message


def test_a_strict_query_quotes_an_error_reply_and_keys_the_rest_by_node():
    time = FakeTime()
    grid = SlowGrid(time, {7: 0.0, 9: 0.0}, errors={9})
    with pytest.raises(QueryFailedError, match="node 9: ValueError: node 9 has no data"):
        query_nodes(grid, _messages([7, 9]), op="query.describe", who="discovery", timeout=5)
    replies = query_nodes(
        SlowGrid(time, {7: 0.0, 9: 0.0}), _messages([7, 9]), op="x", who="test", timeout=5
    )
    assert sorted(replies) == [7, 9] and replies[9].metadata.src_node_id == 9


def test_a_reply_from_a_node_not_asked_is_refused():
    time = FakeTime()
    grid = SlowGrid(time, {7: 0.0, 9: 0.0}, impostors={9: 666})
    with pytest.raises(BadReplyError, match="node 666 sent a bad 'x' reply.*not asked"):
        query_nodes(grid, _messages([7, 9]), op="x", who="test", timeout=5)


def test_heartbeat_needs_a_positive_interval():
    with pytest.raises(ValueError, match="interval"):
        Heartbeat(print, "round 1", 3, interval=0)


@pytest.mark.parametrize("value", [0, -1, 86_401])
def test_reply_timeout_is_a_number_of_seconds_up_to_a_day(value):
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_run_config({"reply-timeout": value})
    assert error.value.parameter == "reply-timeout"


def test_reply_timeout_defaults_to_an_hour():
    assert ExperimentConfig.from_run_config({}).reply_timeout == 3600.0
    assert ExperimentConfig.from_run_config({"reply-timeout": 30}).reply_timeout == 30.0


def test_a_window_keeps_at_most_in_flight_messages_pushed_and_unanswered():
    time = FakeTime()
    delays = {n: 1.0 + 0.5 * n for n in range(1, 11)}
    grid = SlowGrid(time, delays)
    in_flight = []
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: (in_flight.append(len(grid.outstanding)), pull(ids))[1]
    replies = _collect(grid, time, list(delays), in_flight=3)
    assert sorted(r.metadata.src_node_id for r in replies) == list(delays)
    assert grid.pushed == list(delays)  # in the order given, each once
    assert max(in_flight) == 3


def test_messages_unsent_at_the_timeout_are_never_sent():
    time = FakeTime()
    grid = SlowGrid(time, {1: 5.0, 2: 5.0, 3: 0.0})
    replies = _collect(grid, time, [1, 2, 3], timeout=2.0, in_flight=1)
    assert replies == [] and grid.pushed == [1]


def test_only_flowers_in_memory_simulation_gets_a_window():
    from server.federation.queries import SIMULATION_IN_FLIGHT, in_flight_limit

    class InMemoryLinkState:
        pass

    class SimulationGrid:
        state = InMemoryLinkState()

    assert in_flight_limit(SimulationGrid()) == SIMULATION_IN_FLIGHT
    assert in_flight_limit(SlowGrid(FakeTime(), {})) is None

    from simulations.local_engine import LocalGrid

    assert in_flight_limit(LocalGrid({}, 1, client_app=object())) == LocalGrid.in_flight_window


def test_a_count_of_one_is_singular():
    from server.progress import count

    assert [count(n, "client") for n in (0, 1, 2)] == ["0 clients", "1 client", "2 clients"]
    time = FakeTime()
    lines = []
    _collect(SlowGrid(time, {1: 12.0}), time, [1], lines=lines, label="discovery: describe")
    assert lines == ["  discovery: describe: waiting for 1 client to start (0 ready), 10 s"]
