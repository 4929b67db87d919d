"""The retaining strategy on mocked replies, as Flower's own strategy tests do (no federation)."""

from __future__ import annotations

import logging
from unittest.mock import Mock

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedunlearn.config import ExperimentConfig
from fedunlearn.registry import AGGREGATIONS
from fedunlearn.store.history import history
from fedunlearn.store.retention import INTERVAL, RECORD_KEY, STATE_KEY, RetentionPolicy, Selection
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.federaser import IntervalRetention
from server.training.rounds import participant_strategy
from strategies.retaining import RetainingFedAvg

FLOWER_LOGGER = "flwr"


@pytest.fixture(autouse=True)
def _in_a_run(flower_task_identity):
    yield


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"body.weight": torch.randn(4, 3, generator=g), "head.bias": torch.randn(2, generator=g)}


def _reply(state, num_examples, partition_id, node_id, *, error=False, with_partition=True):
    reply = Mock(spec=Message)
    metrics = {"num-examples": num_examples, "train-loss": 0.5 + partition_id}
    if with_partition:
        metrics["partition-id"] = partition_id
    reply.content = RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord(metrics)})
    reply.has_error.return_value = error
    reply.metadata.src_node_id = node_id
    if error:
        reply.error.reason = "client crashed"
    return reply


def _grid(node_ids=(101, 202, 303)):
    grid = Mock()
    grid.get_node_ids.return_value = list(node_ids)
    return grid


def _strategy(store, interval):
    return RetainingFedAvg(
        store, [IntervalRetention(interval)], min_train_nodes=3, min_available_nodes=3
    )


def _round(strategy, server_round, global_state, client_states, sizes, **reply_kwargs):
    messages = list(
        strategy.configure_train(server_round, ArrayRecord(global_state), ConfigRecord(), _grid())
    )
    assert len(messages) == 3
    replies = [
        _reply(s, n, k, 101 * (k + 1), **reply_kwargs)
        for k, (s, n) in enumerate(zip(client_states, sizes))
    ]
    return strategy.aggregate_train(server_round, replies)


def test_aggregation_is_fedavg_weighted_by_num_examples(tmp_path):
    strategy = _strategy(UpdateStore(tmp_path / "store"), 1)
    clients, sizes = [_state(1), _state(2), _state(3)], [10, 30, 60]
    arrays, metrics = _round(strategy, 1, _state(0), clients, sizes)
    result = arrays.to_torch_state_dict()
    for key in result:
        expected = sum(n * s[key] for s, n in zip(clients, sizes)) / sum(sizes)
        assert torch.allclose(result[key], expected, atol=1e-6)
    # partition ids are identifiers, never averaged; the loss is weighted by N_k
    assert "partition-id" not in metrics
    assert metrics["train-loss"] == pytest.approx((10 * 0.5 + 30 * 1.5 + 60 * 2.5) / 100)


def test_retains_rounds_1_then_every_delta_t_with_updates_and_global_model(tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = _strategy(store, 2)
    global_state = _state(0)
    sent = {}
    for server_round in range(1, 6):
        clients = [_state(10 * server_round + k) for k in range(3)]
        sent[server_round] = (global_state, clients)
        arrays, _ = _round(strategy, server_round, global_state, clients, [5, 6, 7])
        global_state = arrays.to_torch_state_dict()
    assert store.rounds() == [1, 3, 5]
    for server_round in store.rounds():
        global_sent, clients = sent[server_round]
        assert store.num_examples(server_round) == {0: 5, 1: 6, 2: 7}
        stored_global = store.read_global(server_round)
        assert all(torch.equal(stored_global[k], global_sent[k]) for k in global_sent)
        for k in range(3):
            update = store.read_update(server_round, k)
            for key in update:  # U_k^t = M_k^t - M^t
                assert torch.allclose(update[key], clients[k][key] - global_sent[key], atol=1e-6)


def test_retention_off_writes_nothing(tmp_path):
    strategy = _strategy(None, 1)
    arrays, _ = _round(strategy, 1, _state(0), [_state(1), _state(2), _state(3)], [1, 1, 1])
    assert arrays is not None
    assert not any(tmp_path.iterdir())


def test_failed_reply_is_neither_aggregated_nor_retained(tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = _strategy(store, 1)
    global_state = _state(0)
    list(strategy.configure_train(1, ArrayRecord(global_state), ConfigRecord(), _grid()))
    good = [_reply(_state(1), 4, 0, 101), _reply(_state(2), 4, 1, 202)]
    bad = _reply(_state(99), 4, 2, 303, error=True)
    bad.content = RecordDict()
    arrays, _ = strategy.aggregate_train(1, good + [bad])
    assert store.clients(1) == [0, 1]
    expected = (_state(1)["head.bias"] + _state(2)["head.bias"]) / 2
    assert torch.allclose(arrays.to_torch_state_dict()["head.bias"], expected)


def test_reply_without_partition_id_is_refused_and_round_not_half_written(tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = _strategy(store, 1)
    with pytest.raises(ValueError, match="partition-id"):
        _round(
            strategy,
            1,
            _state(0),
            [_state(1), _state(2), _state(3)],
            [1, 2, 3],
            with_partition=False,
        )
    assert store.rounds() == []
    assert UpdateStore(tmp_path / "store").rounds() == []


def test_aggregation_does_not_depend_on_reply_arrival_order(tmp_path):
    """Replies arrive in any order; the model must be the same bit for bit (reproducible runs)."""
    clients = [_state(40 + k) for k in range(3)]

    def aggregate(order):
        strategy = _strategy(None, 1)
        list(strategy.configure_train(1, ArrayRecord(_state(0)), ConfigRecord(), _grid()))
        replies = [_reply(clients[k], 7 + k, k, 100 + k) for k in order]
        return strategy.aggregate_train(1, replies)[0].to_torch_state_dict()

    a, b = aggregate([0, 1, 2]), aggregate([2, 0, 1])
    assert all(torch.equal(a[k], b[k]) for k in a)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_fedretrain_samples_and_configures_only_its_participants(aggregation):
    """FedRetrain's strategy, under every aggregation: the forgotten client (node 101) is neither
    sampled nor messaged, and Flower's log counts the participants, not the federation."""
    connected = [101, 202, 303, 404]
    participants = [202, 303, 404]
    config = ExperimentConfig.from_run_config(
        {"strategy": aggregation, "unlearn-methods": "fedretrain"}
    )
    strategy = participant_strategy(config, participants)
    assert type(strategy.strategy).__name__.lower() == aggregation
    flower_lines = _Lines()
    logging.getLogger(FLOWER_LOGGER).addHandler(flower_lines)
    try:
        for server_round in (1, 2):
            messages = list(
                strategy.configure_train(
                    server_round, ArrayRecord(_state(0)), ConfigRecord(), _grid(connected)
                )
            )
            assert sorted(m.metadata.dst_node_id for m in messages) == participants
    finally:
        logging.getLogger(FLOWER_LOGGER).removeHandler(flower_lines)
    sampled = [line for line in flower_lines.lines if "Sampled" in line]
    assert sampled == ["configure_train: Sampled 3 nodes (out of 3)"] * 2


def test_participants_bound_the_sample_size():
    with pytest.raises(ValueError, match="min_train_nodes=4 exceeds the 3 participants"):
        RetainingFedAvg(None, participants=[1, 2, 3], min_train_nodes=4)


class _EvenRoundsClient1(RetentionPolicy):
    """A toy selective policy with a state: keeps client 1 on even rounds, counts its calls."""

    name = "toy-selection"

    def __init__(self):
        self.calls = 0

    @classmethod
    def from_config(cls, config):
        return cls()

    def select(self, server_round, global_state, updates, num_examples, *, loss=None):
        self.calls += 1
        return Selection(server_round % 2 == 0, frozenset([1] if server_round % 2 == 0 else []))

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_the_store_keeps_the_union_of_the_policies_and_records_each(tmp_path):
    from fedunlearn.unlearning.fedrecover import EveryRound

    store = UpdateStore(tmp_path / "store")
    policies = [IntervalRetention(3), EveryRound(models_only=True), _EvenRoundsClient1()]
    strategy = RetainingFedAvg(store, policies=policies, min_train_nodes=3, min_available_nodes=3)
    global_state = _state(0)
    for server_round in range(1, 6):
        clients = [_state(10 * server_round + k) for k in range(3)]
        arrays, _ = _round(strategy, server_round, global_state, clients, [5, 6, 7])
        global_state = arrays.to_torch_state_dict()
    assert store.rounds() == [1, 2, 3, 4, 5]  # every round's global model (models-only policy)
    assert store.clients(1) == [0, 1, 2] and store.clients(2) == [1] and store.clients(3) == []
    assert store.clients(4) == [0, 1, 2] and store.clients(5) == []
    assert history(store, "retained-updates").rounds() == [1, 4]
    assert history(store, "toy-selection").rounds() == [2, 4]
    assert history(store, "toy-selection").clients(4) == [1]
    assert history(store, "round-history").clients() == []
    assert store.metadata[STATE_KEY]["5"]["toy-selection"] == {"calls": 5}
    assert set(store.metadata[STATE_KEY]) == {"4", "5"}
    assert set(store.metadata[RECORD_KEY]) == {p.name for p in policies}

    # a run resumed after round 4 continues the record and the policy's state of round 4
    resumed = RetainingFedAvg(store, policies=[*policies[:2], _EvenRoundsClient1()])
    resumed.resume(4)
    assert resumed.policies["toy-selection"].calls == 4
    assert 5 not in resumed.record.selections["retained-updates"]
    assert resumed.record.selections["toy-selection"] == {2: (1,), 4: (1,)}


def test_norms_mode_keeps_round_1_whole_and_only_norms_after(tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = RetainingFedAvg(
        store,
        policies=[IntervalRetention(2, "norms")],
        min_train_nodes=3,
        min_available_nodes=3,
    )
    global_state, sent = _state(0), {}
    for server_round in range(1, 6):
        clients = [_state(10 * server_round + k) for k in range(3)]
        sent[server_round] = (global_state, clients)
        arrays, _ = _round(strategy, server_round, global_state, clients, [5, 6, 7])
        global_state = arrays.to_torch_state_dict()
    assert store.rounds() == [1, 3, 5]
    assert store.read_round(1).norms_only == [] and store.read_global(1)
    for server_round in (3, 5):
        kept = store.read_round(server_round)
        assert kept.global_model is None and kept.norms_only == [0, 1, 2]
        assert kept.num_examples == {0: 5, 1: 6, 2: 7}
        global_sent, clients = sent[server_round]
        for k in range(3):
            update = {key: clients[k][key] - global_sent[key] for key in global_sent}
            for key, square in kept.squares[k].items():
                assert square == pytest.approx(float(update[key].double().pow(2).sum()), rel=1e-6)
    assert store.metadata["retention"][INTERVAL] == {str(r): [0, 1, 2] for r in (1, 3, 5)}


def test_a_norms_run_resumed_after_a_crash_redoes_its_norms_rounds_once(tmp_path):
    store = UpdateStore(tmp_path / "store")

    def strategy():
        return RetainingFedAvg(
            store,
            policies=[IntervalRetention(1, "norms")],
            min_train_nodes=3,
            min_available_nodes=3,
        )

    first, global_state = strategy(), _state(0)
    for server_round in (1, 2, 3):  # the crash comes after round 3 committed, before checkpoint 3
        clients = [_state(10 * server_round + k) for k in range(3)]
        global_state = _round(first, server_round, global_state, clients, [5, 6, 7])[0]
        global_state = global_state.to_torch_state_dict()
    assert store.delete_rounds_after(2) == [3]
    resumed = strategy()
    resumed.resume(2)
    clients = [_state(99 + k) for k in range(3)]
    _round(resumed, 3, global_state, clients, [5, 6, 7])
    assert store.rounds() == [1, 2, 3] and store.read_round(3).norms_only == [0, 1, 2]
    assert store.metadata["retention"][INTERVAL] == {str(r): [0, 1, 2] for r in (1, 2, 3)}
    assert store.verify() == []


def _crab_round(strategy, server_round, global_state, client_states, sizes, losses):
    """One round whose clients report ``start-loss`` as asked."""
    messages = list(
        strategy.configure_train(server_round, ArrayRecord(global_state), ConfigRecord(), _grid())
    )
    assert all(m.content["config"]["report-start-loss"] == 1 for m in messages)
    replies = []
    for k, (state, n) in enumerate(zip(client_states, sizes)):
        reply = _reply(state, n, k, 101 * (k + 1))
        reply.content["metrics"]["start-loss"] = losses[k]
        replies.append(reply)
    return strategy.aggregate_train(server_round, replies)[0].to_torch_state_dict()


def _crab_strategy(store, rounds, **kwargs):
    from fedunlearn.unlearning.crab import CrabSelector

    policies = [
        IntervalRetention(4),
        CrabSelector(round_ratio=0.5, client_ratio=0.5, final_round=rounds),
    ]
    return RetainingFedAvg(store, policies=policies, min_train_nodes=3, min_available_nodes=3)


# L^t, weighted by N = 5, 6, 7: 1.0, 0.95 (window [1, 2] closes at 3), 0.8, 0.78, 0.75, 0.74
_CRAB_LOSSES = [1.0, 0.95, 0.8, 0.78, 0.75, 0.74]


def test_crab_keeps_rounds_whole_until_its_window_closes_then_only_what_it_chose(tmp_path):

    store = UpdateStore(tmp_path / "store")
    strategy, global_state = _crab_strategy(store, 6), _state(0)
    crab = strategy.policies["selected-history"]
    for server_round, loss in enumerate(_CRAB_LOSSES, start=1):
        clients = [_state(10 * server_round + k) for k in range(3)]
        losses = [loss + d for d in (0.07, 0.0, -0.05)]  # weighted by 5, 6, 7: loss
        global_state = _crab_round(strategy, server_round, global_state, clients, [5, 6, 7], losses)
        if server_round == 2:  # the window [1, 2] is open: both rounds kept whole
            assert store.rounds() == [1, 2] and store.clients(2) == [0, 1, 2]
        if server_round == 3:  # closed at round 3 (0.8 < 0.9 * 1.0): one of [1, 2], one client
            assert list(crab.kept) in ([1], [2]) and crab.open_rounds == [3]
    kept = crab.kept
    assert len(kept) == 1 + 2 and crab.open_rounds == []  # ⌊0.5 · 2⌋ of [1, 2], 2 of [3 .. 6]
    assert all(len(c) == 1 for c in kept.values())  # ⌊0.5 · 3⌋ clients
    view = history(store, "selected-history")
    assert view.rounds() == list(kept) and {t: view.clients(t) for t in kept} == kept
    # what no policy kept is gone: FedEraser's rounds 1 and 5 stay whole, Crab's its clients
    assert store.rounds() == sorted({1, 5} | set(kept))
    for server_round in store.rounds():
        whole = server_round in (1, 5)
        assert store.clients(server_round) == ([0, 1, 2] if whole else kept[server_round])
    assert store.metadata[RECORD_KEY]["selected-history"] == {str(t): c for t, c in kept.items()}
    assert store.verify() == []


def test_a_crash_between_crabs_record_and_its_deletions_is_finished_on_resume(tmp_path):
    from strategies.retaining import STATE_KEY

    store = UpdateStore(tmp_path / "store")
    strategy, global_state = _crab_strategy(store, 6), _state(0)
    deleting = store.delete_from_round
    store.delete_from_round = lambda *a, **k: 0  # the deletions of round 3's settlement are lost
    for server_round, loss in enumerate(_CRAB_LOSSES[:3], start=1):
        clients = [_state(10 * server_round + k) for k in range(3)]
        global_state = _crab_round(
            strategy, server_round, global_state, clients, [5, 6, 7], [loss] * 3
        )
    store.delete_from_round = deleting
    assert store.rounds() == [1, 2, 3] and store.clients(2) == [0, 1, 2]
    assert "3" in store.metadata[STATE_KEY]
    resumed = _crab_strategy(store, 6)
    resumed.resume(3)
    kept = resumed.policies["selected-history"].kept
    expected = sorted({1} | set(kept) | {3})  # FedEraser's round 1, Crab's choice, the open round
    assert store.rounds() == expected and resumed.policies["selected-history"].open_rounds == [3]
    for server_round in set(kept) - {1}:
        assert store.clients(server_round) == kept[server_round]


def test_a_sampled_round_trains_its_sample_and_the_store_records_who_took_part(tmp_path):
    # the sampler (round, nodes offered) -> nodes: only they are messaged; the replies that were
    # aggregated are recorded per round, a failed one is not; a resumed run forgets later rounds
    from flwr.serverapp.strategy import FedAvg

    from fedunlearn.store.retention import PARTICIPANTS_KEY
    from strategies.retaining import Retaining

    store = UpdateStore(tmp_path / "store")
    offered = []

    def sampler(server_round, nodes):
        offered.append(sorted(nodes))
        return [101, 303] if server_round == 1 else [202]

    inner = FedAvg(min_train_nodes=1, min_available_nodes=1)
    strategy = Retaining(inner, store, [IntervalRetention(1)], sampler=sampler)
    for server_round, (nodes, replies) in enumerate(
        [
            ([101, 303], [_reply(_state(1), 10, 0, 101), _reply(_state(3), 10, 2, 303)]),
            ([202], [_reply(_state(2), 10, 1, 202), _reply(_state(9), 10, 0, 101, error=True)]),
            ([202], [_reply(_state(2), 10, 1, 202)]),
        ],
        start=1,
    ):
        sent = strategy.configure_train(
            server_round, ArrayRecord(_state(0)), ConfigRecord(), _grid()
        )
        assert sorted(m.metadata.dst_node_id for m in sent) == nodes
        strategy.aggregate_train(server_round, replies)
    assert offered == [[101, 202, 303]] * 3  # every connected participant is offered
    assert store.metadata[PARTICIPANTS_KEY] == {"1": [0, 2], "2": [1], "3": [1]}
    assert store.clients(1) == [0, 2] and store.clients(2) == [1]
    Retaining(inner, store, [IntervalRetention(1)], sampler=sampler).resume(2)
    assert store.metadata[PARTICIPANTS_KEY] == {"1": [0, 2], "2": [1]}
