"""Retention policies: each method keeps what it needs, the store keeps the union once, and a
method reads only what its own policy kept."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.errors import ConfigError
from fedunlearn.store.history import HistoryView
from fedunlearn.store.retention import RetentionRecord, Selection
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.federaser import IntervalRetention
from fedunlearn.unlearning.fedrecover import EveryRound


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3,), value)}


def _store(tmp_path, rounds=4, clients=(0, 1, 2)) -> UpdateStore:
    store = UpdateStore(tmp_path / "store")
    for r in range(1, rounds + 1):
        with store.begin_round(r, _state(r)) as writer:
            for c in clients:
                writer.add_update(c, _state(10 * r + c), 5 + c)
    return store


def test_interval_policy_keeps_every_client_on_federsers_rounds_only():
    policy = IntervalRetention(2)
    updates = {0: _state(0), 3: _state(3)}
    kept = [policy.select(r, _state(0), updates, {0: 1, 3: 1}) for r in range(1, 6)]
    assert [s.keep_global for s in kept] == [True, False, True, False, True]
    assert kept[0].clients == {0, 3} and kept[1].clients == frozenset()


def test_models_only_policy_keeps_no_update():
    selection = EveryRound(models_only=True).select(7, _state(0), {1: _state(1)}, {1: 1})
    assert selection == Selection(True, frozenset())


def test_an_update_is_never_kept_without_its_global_model():
    assert Selection(False, frozenset({2})) == Selection(True, frozenset({2}))
    assert Selection(False, frozenset()) == Selection(False, frozenset())
    assert Selection(False, frozenset(), frozenset({3})).keep_global is False  # norms alone


def test_the_store_keeps_the_union_and_each_policy_its_own_selection():
    record = RetentionRecord.empty(["a", "b"])
    record.add("a", 1, Selection(True, frozenset({0, 1})))
    record.add("b", 1, Selection(True, frozenset({2})))
    record.add("a", 2, Selection(False, frozenset()))
    record.add("b", 3, Selection(True, frozenset()))
    assert record.union(1) == Selection(True, frozenset({0, 1, 2}))
    assert record.union(2) is None
    assert record.union(3) == Selection(True, frozenset())
    again = RetentionRecord.from_json(record.to_json())
    assert again.selections == record.selections


@pytest.mark.parametrize("bad", [[], {"a": [1]}, {"a": {"1": "x"}}, {"a": {"one": [1]}}])
def test_a_malformed_record_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match="retention"):
        RetentionRecord.from_json(bad)


def test_forget_and_truncate_drop_clients_and_rounds():
    record = RetentionRecord({"a": {1: (0, 1), 2: (1,), 5: (0,)}})
    record.forget({1})
    record.truncate(2)
    assert record.selections == {"a": {1: (0,), 2: ()}}


def test_a_view_reads_only_its_selection(tmp_path):
    store = _store(tmp_path)
    view = HistoryView(store, {1: [0, 1], 3: [2], 9: [0]})
    assert view.rounds() == [1, 3]  # round 9 was never committed: not in the view
    assert view.clients(1) == [0, 1] and view.clients() == [0, 1, 2]
    assert view.num_examples(3) == {2: 7}
    assert torch.equal(view.read_update(3, 2)["w"], _state(32)["w"])
    assert view.read_round(1).clients == [0, 1]
    assert [r.clients for r in view.iter_rounds(exclude=[1])] == [[0], [2]]
    with pytest.raises(ConfigError, match="client"):
        view.read_update(3, 0)  # kept in the store for someone else, not for this method
    with pytest.raises(ConfigError, match="round"):
        view.read_global(2)


def test_a_view_counts_only_the_bytes_it_keeps(tmp_path):
    store = _store(tmp_path)
    everything = HistoryView(store, {r: [0, 1, 2] for r in store.rounds()}).total_bytes()
    assert everything == store.total_bytes()
    half = HistoryView(store, {1: [0], 2: []}).total_bytes()
    assert 0 < half < everything / 4


def test_norms_mode_keeps_t1_whole_then_norms_and_merge_prefers_whole_updates():
    policy = IntervalRetention(2, "norms")
    updates = {0: None, 1: None}
    assert policy.select(1, {}, updates, {}) == Selection(True, frozenset({0, 1}))
    assert policy.select(2, {}, updates, {}) == Selection(False, frozenset())
    assert policy.select(3, {}, updates, {}) == Selection(False, frozenset(), frozenset({0, 1}))
    norms = policy.select(3, {}, updates, {})
    models = Selection(True, frozenset())  # SIFU's: the model, no update
    whole = Selection(True, frozenset({1}))
    assert Selection.merge([norms, models]) == Selection(True, frozenset(), frozenset({0, 1}))
    assert Selection.merge([norms, whole]) == Selection(True, frozenset({1}), frozenset({0}))
    assert Selection.merge([Selection(False, frozenset())]) is None
    record = RetentionRecord.empty(["a"])
    record.add("a", 3, norms)
    assert record.selections["a"] == {3: (0, 1)}
    with pytest.raises(ConfigError, match="retain-mode"):
        IntervalRetention(2, "deltas")
