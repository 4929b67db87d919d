"""A round goes on with the connected clients of its roster once min-reply-fraction of them are,
waits node-wait-seconds for that many, then refuses naming the offline ones; it never hangs as
Flower's own min_available_nodes wait does. An unlearning request waits for its clients."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from flwr.app import ArrayRecord, ConfigRecord

from server.federation.availability import (
    OfflineClients,
    RoundAvailability,
    await_clients,
    describe_offline,
    roster_availability,
)
from server.federation.members import FederationMembers
from strategies.aggregation import aggregation_strategy
from strategies.retaining import Retaining


class Grid:
    """What a round reads of the grid: the connected nodes; ``changes`` apply one per sleep."""

    def __init__(self, connected, changes=()) -> None:
        self.connected = set(connected)
        self.changes = list(changes)

    def get_node_ids(self):
        return sorted(self.connected)

    def sleep(self, _seconds: float) -> None:
        if self.changes:
            self.changes.pop(0)(self.connected)


ROSTER = {100 + p: p for p in range(20)}  # node -> partition


def rule(grid, *, fraction=0.8, wait=5.0, lines=None):
    said = lines if lines is not None else []
    return RoundAvailability(
        lambda: ROSTER,
        min_fraction=fraction,
        wait_seconds=wait,
        phase="train",
        log=said.append,
        sleep=grid.sleep,
    )


def test_every_client_connected_goes_on_silently():
    grid, lines = Grid(ROSTER), []
    assert rule(grid, lines=lines)(1, grid) == sorted(ROSTER)
    assert lines == []


def test_three_lost_of_twenty_go_on_with_the_seventeen_and_say_so_once_per_change():
    grid, lines = Grid(set(ROSTER) - {103, 107, 111}), []
    available = rule(grid, lines=lines)
    assert available(2, grid) == sorted(set(ROSTER) - {103, 107, 111})
    assert available(3, grid) == sorted(set(ROSTER) - {103, 107, 111})
    [line] = lines  # said once, not every round
    assert "client(s) 3, 7, 11 (node(s) 103, 107, 111) offline" in line
    assert "the 17 of 20 connected" in line
    grid.connected.add(107)  # a SuperNode restarted: trained again from the next round on
    assert 107 in available(4, grid)
    assert "client(s) 3, 11" in lines[-1]


def test_too_few_connected_waits_for_them_and_goes_on_when_they_come_back():
    missing = set(range(100, 106))  # 14 of 20 connected; 16 needed
    grid = Grid(set(ROSTER) - missing, changes=[lambda c: c.update({100}), lambda c: c.add(101)])
    lines = []
    started = time.monotonic()
    chosen = rule(grid, lines=lines, wait=30)(1, grid)
    assert len(chosen) == 16 and {100, 101} <= set(chosen)
    assert time.monotonic() - started < 5  # it did not sit out node-wait-seconds
    assert "waiting for clients, 14 of 20 connected, 16 needed" in lines[0]


def test_too_few_connected_for_node_wait_seconds_is_refused_naming_them():
    grid = Grid(set(ROSTER) - {100, 101, 102, 103, 104})
    started = time.monotonic()
    with pytest.raises(OfflineClients) as refused:
        rule(grid, wait=0.3)(4, grid)
    assert time.monotonic() - started >= 0.3
    assert refused.value.offline == {0: 100, 1: 101, 2: 102, 3: 103, 4: 104}
    said = str(refused.value)
    assert said.startswith("round 4: 15 of its 20 clients connected, fewer than")
    assert "min-reply-fraction=0.8 requires (16)" in said and "node-wait-seconds=0.3" in said
    assert "client(s) 0, 1, 2, 3, 4 (node(s) 100, 101, 102, 103, 104)" in said


@pytest.mark.parametrize("fraction, connected, goes_on", [(1.0, 19, False), (0.5, 10, True),
                                                          (0.5, 9, False), (1e-9, 1, True)])  # fmt: skip
def test_the_bound_is_min_reply_fraction_of_the_roster(fraction, connected, goes_on):
    grid = Grid(sorted(ROSTER)[:connected])
    available = rule(grid, fraction=fraction, wait=0.05)
    if goes_on:
        assert len(available(1, grid)) == connected
    else:
        with pytest.raises(OfflineClients):
            available(1, grid)


def test_a_client_dropped_from_the_run_leaves_the_roster():
    members = FederationMembers({p: 100 + p for p in range(4)}, {p: 10 for p in range(4)}, 0)
    config = SimpleNamespace(min_reply_fraction=1.0, node_wait_seconds=0.05)
    grid = Grid({100, 101, 102})  # node 103 is gone ...
    available = roster_availability(config, members, phase="train", log=lambda _: None)
    with pytest.raises(OfflineClients, match=r"client\(s\) 3 \(node\(s\) 103\)"):
        available(1, grid)
    members.dropped[3] = "refused 3 rounds in a row"  # ... and was dropped: no longer awaited
    assert available(2, grid) == [100, 101, 102]
    only = roster_availability(config, members, [100, 101], phase="fedretrain", log=print)
    assert only(1, grid) == [100, 101]


def test_a_wrapped_flower_strategy_no_longer_waits_forever_for_a_lost_node(flower_task_identity):
    """Before, the strategy's min_available_nodes was K: Flower's sample_nodes loops until K nodes
    are connected, with no time limit. Now the round trains the 17 connected."""
    config = SimpleNamespace(strategy="fedavg", proximal_mu=0.0, trimmed_beta=0.0, krum_malicious=0)
    grid = Grid(set(ROSTER) - {103, 107, 111})
    strategy = Retaining(
        aggregation_strategy(config), None, available=rule(grid, wait=0.05), sampler=None
    )
    arrays = ArrayRecord({})
    messages = list(strategy.configure_train(2, arrays, ConfigRecord({}), grid))
    assert sorted(m.metadata.dst_node_id for m in messages) == sorted(grid.connected)
    grid.connected -= set(range(100, 110))  # 7 of 20: refused, not hung
    with pytest.raises(OfflineClients):
        list(strategy.configure_train(3, arrays, ConfigRecord({}), grid))


def test_a_request_waits_for_its_clients_and_names_those_still_offline():
    grid = Grid({100, 101}, changes=[lambda c: c.add(102)])
    nodes = {0: 100, 1: 101, 2: 102}
    assert await_clients(grid.get_node_ids, nodes, 30, what="request", sleep=grid.sleep) == {}
    lines = []
    started = time.monotonic()
    offline = await_clients(Grid({100}).get_node_ids, nodes, 0.3, what="request", log=lines.append)
    assert offline == {1: 101, 2: 102} and time.monotonic() - started >= 0.3
    assert "waiting up to 0.3s (reply-timeout) for client(s) 1, 2" in lines[0]
    # a client whose node never connected in this run cannot come back within it: no wait
    started = time.monotonic()
    assert await_clients(Grid({100}).get_node_ids, {0: 100, 5: None}, 30, what="r") == {5: None}
    assert time.monotonic() - started < 1


def test_describe_offline_names_clients_and_nodes():
    assert (
        describe_offline({7: 5, 3: None})
        == "client(s) 3, 7 (node(s) 5; 1 never connected in this run)"
    )


def test_a_dp_round_with_a_missing_reply_stops_rather_than_under_noise():
    """DP-FedAvg's noise z C / K assumes K replies; Flower's wrapper only warns when fewer come."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    from server.training.round_step import _check_dp_sample

    config = SimpleNamespace(strategy="fedavg", proximal_mu=0.0, trimmed_beta=0.0, krum_malicious=0)
    dp = DifferentialPrivacyServerSideFixedClipping(
        aggregation_strategy(config), noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=4
    )
    _check_dp_sample(dp, "train", 2, 4)
    with pytest.raises(RuntimeError, match="3 valid replies, but DP-FedAvg's noise"):
        _check_dp_sample(dp, "train", 2, 3)
    _check_dp_sample(aggregation_strategy(config), "train", 2, 3)  # no DP: min-reply-fraction rules
    members = FederationMembers({p: 100 + p for p in range(4)}, {p: 10 for p in range(4)}, 0)
    every = roster_availability(
        SimpleNamespace(min_reply_fraction=0.5, node_wait_seconds=0.05), members, phase="train",
        every=True,
    )  # fmt: skip
    with pytest.raises(OfflineClients, match=r"client\(s\) 3"):
        every(1, Grid({100, 101, 102}))
