"""The round's weighted average folded reply by reply (:mod:`fedunlearn.training.streaming`): the
claim is Flower's own FedAvg result, bit for bit, in whatever order the replies arrive, with at
most ``window`` replies held in memory."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedunlearn.errors import ConfigError
from fedunlearn.training.streaming import Contribution, ReorderBuffer, WeightedSum

SHAPES = {"body.weight": (7, 5), "body.bias": (7,), "head.weight": (3, 7), "steps": ()}


def _clients(seed: int, n: int):
    """``n`` clients' arrays (float32, and an integer buffer as models have) and counts."""
    rng = np.random.default_rng(seed)
    clients = {}
    for key in rng.choice(1000, size=n, replace=False).tolist():
        arrays = [
            (name, rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.1, 100))
            if name != "steps"
            else (name, np.array(rng.integers(0, 50), dtype=np.int64))
            for name, shape in SHAPES.items()
        ]
        clients[key] = (arrays, int(rng.integers(1, 500)))
    return clients


def _flower(clients) -> dict[str, np.ndarray]:
    """Flower's FedAvg over the clients in ascending key order (the round-at-once path)."""
    records = [
        RecordDict(
            {
                "arrays": ArrayRecord({n: Array(a) for n, a in arrays}),
                "metrics": MetricRecord({"num-examples": weight}),
            }
        )
        for _, (arrays, weight) in sorted(clients.items())
    ]
    return {k: v.numpy() for k, v in aggregate_arrayrecords(records, "num-examples").items()}


def _streamed(clients, arrival, window, absent=(), tmp_path=None):
    expected = {k: w for k, (_, w) in clients.items()}
    buffer = ReorderBuffer(expected, window=window, spill_dir=tmp_path)
    total = WeightedSum(expected)
    for key in arrival:
        if key in absent:
            ready = buffer.absent(key)
        else:
            arrays, weight = clients[key]
            ready = buffer.put(Contribution(key, [(n, a.copy()) for n, a in arrays], weight))
        for contribution in ready:
            total.fold(contribution)
        assert buffer.peak_in_memory <= window
    for contribution in buffer.close():
        total.fold(contribution)
    return total, buffer


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window", [1, 3, 64])
def test_any_arrival_order_gives_flowers_fedavg_bit_for_bit(seed, window, tmp_path):
    clients = _clients(seed, 17)
    arrival = np.random.default_rng(100 + seed).permutation(sorted(clients)).tolist()
    total, buffer = _streamed(clients, arrival, window, tmp_path=tmp_path)
    expected = _flower(clients)
    result = total.result()
    assert list(result) == list(expected)  # the reply's array order
    for name, value in expected.items():
        assert result[name].dtype == value.dtype
        assert np.array_equal(result[name], value), name  # not close: equal
    assert total.folded == sorted(clients)
    assert not list(tmp_path.iterdir())  # spilled replies are removed once folded
    if window == 1:
        assert buffer.spilled > 0  # the order was shuffled: some waited on disk


def test_reverse_arrival_holds_at_most_the_window_in_memory(tmp_path):
    clients = _clients(7, 30)
    total, buffer = _streamed(clients, sorted(clients, reverse=True), 4, tmp_path=tmp_path)
    assert buffer.peak_in_memory <= 4 and buffer.spilled == 30 - 4 - 1
    assert all(np.array_equal(total.result()[k], v) for k, v in _flower(clients).items())


@pytest.mark.parametrize("seed", range(4))
def test_a_client_that_drops_out_leaves_the_average_of_the_others(seed):
    clients = _clients(seed, 9)
    keys = sorted(clients)
    dropped = {keys[seed % 9], keys[(seed + 4) % 9]}
    arrival = np.random.default_rng(seed).permutation(keys).tolist()
    total, _ = _streamed(clients, arrival, 2, absent=dropped)
    kept = {k: v for k, v in clients.items() if k not in dropped}
    assert total.folded == sorted(kept)
    for name, value in _flower(kept).items():
        # rescaled by N / N_folded: the same average up to rounding
        np.testing.assert_allclose(total.result()[name], value, rtol=2e-6, atol=1e-5)


def test_clients_never_answering_are_closed_as_absent():
    clients = _clients(3, 5)
    keys = sorted(clients)
    total, buffer = _streamed(clients, keys[1:], 2)  # the first never answers
    assert total.folded == keys[1:] and buffer.pending == []


def test_a_reply_not_asked_or_twice_is_an_error():
    buffer = ReorderBuffer([1, 2])
    contribution = Contribution(2, [("w", np.zeros(2, np.float32))], 3)
    assert list(buffer.put(contribution)) == []
    with pytest.raises(ValueError, match="client 2 was not asked in this round, or answered"):
        buffer.put(contribution)
    with pytest.raises(ValueError, match="client 5 was not asked"):
        buffer.absent(5)
    assert [c.key for c in buffer.absent(1)] == [2]


def test_ready_contributions_are_loaded_one_at_a_time():
    """A long run of spilled replies made ready at once comes back lazily: never all in memory."""
    buffer = ReorderBuffer(range(10), window=1, gated=True)
    for key in range(10):
        assert list(buffer.put(Contribution(key, [("w", np.full(3, key, np.float32))], 1))) == []
    ready = buffer.close()
    first = next(ready)
    assert first.key == 0 and sum(isinstance(v, Contribution) for v in buffer.held.values()) == 0
    assert [c.key for c in ready] == list(range(1, 10)) and not buffer.held


def test_no_client_folded_has_no_average():
    total = WeightedSum({1: 3})
    assert total.result() is None


@pytest.mark.parametrize(
    ("parameter", "build"),
    [
        ("window", lambda: ReorderBuffer([1], window=0)),
        ("expected_weights", lambda: WeightedSum({})),
        ("expected_weights", lambda: WeightedSum({1: 0})),
    ],
)
def test_bad_settings_are_refused_by_name(parameter, build):
    with pytest.raises(ConfigError, match=parameter):
        build()
