"""What a store's header says about its history is checked as the methods read it, even when its
checksums match (a buggy writer, or an edit that recomputed them): a retention record naming a
round or client the store does not hold, and a policy state outside its domain, are refused before
a method reads them and reported by ``fedunlearn store verify`` (exit 1, the field named)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fedunlearn import cli
from fedunlearn.errors import StoreCorruptionError
from fedunlearn.store.history import history
from fedunlearn.store.retention import RECORD_KEY, STATE_KEY
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.sensitivity import SensitivityAccumulator


def _store(tmp_path, **metadata) -> UpdateStore:
    store = UpdateStore(tmp_path / "store")
    for t in (1, 2):
        updates = {k: ({"w": torch.full((3,), float(k + t))}, 3 + k) for k in (0, 1)}
        store.write_round(t, {"w": torch.zeros(3)}, updates)
    store.set_metadata(**metadata)
    return store


def _sifu_state() -> dict:
    accumulator = SensitivityAccumulator(learning_rate=0.1, smoothness=1.0, local_steps=1)
    updates = {0: {"w": torch.tensor([1.0, 0.0, 2.0])}, 1: {"w": torch.tensor([0.0, 3.0, 1.0])}}
    accumulator.observe(1, {"w": torch.zeros(3)}, updates, {0: 3, 1: 4})
    return json.loads(json.dumps(accumulator.to_json()))


def _verify(tmp_path, capsys) -> tuple[int, str]:
    code = cli.main(["store", "verify", str(tmp_path / "store")])
    return code, capsys.readouterr().out


def test_a_sound_header_passes(tmp_path, capsys):
    record = {"retained-updates": {"1": [0, 1], "2": [0, 1]}, "sensitivity-bounds": {"1": []}}
    store = _store(
        tmp_path, **{RECORD_KEY: record, STATE_KEY: {"2": {"sensitivity-bounds": _sifu_state()}}}
    )
    assert history(store, "retained-updates").rounds() == [1, 2]
    store.close()
    assert _verify(tmp_path, capsys)[0] == 0


@pytest.mark.parametrize(
    ("selection", "said"),
    [({"1": [0, 1], "3": [0]}, "round 3 is not stored"), ({"1": [0, 1, 7]}, "clients [7]")],
)
def test_a_record_naming_what_the_store_lacks_is_refused_and_reported(
    tmp_path, capsys, selection, said
):
    store = _store(tmp_path, **{RECORD_KEY: {"retained-updates": selection}})
    with pytest.raises(StoreCorruptionError, match=re.escape(said)):
        history(store, "retained-updates")  # before FedEraser reads a history
    store.close()
    code, out = _verify(tmp_path, capsys)
    assert code == 1 and said in out and "retained-updates" in out


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda s: s["rounds"][0]["grams"][0].__setitem__(0, [-4.0, 0.0]), "sifu-state"),
        (lambda s: s["rounds"][0]["global_step_sq"].__setitem__(0, -1.0), "negative"),
        (lambda s: s.pop("rounds"), "rounds"),
    ],
)
def test_a_policy_state_outside_its_domain_is_reported_by_name(tmp_path, capsys, edit, said):
    state = _sifu_state()
    edit(state)
    _store(tmp_path, **{STATE_KEY: {"2": {"sensitivity-bounds": state}}}).close()
    code, out = _verify(tmp_path, capsys)
    assert code == 1 and f"{STATE_KEY}[2][sensitivity-bounds]" in out and said in out


def test_a_crab_state_of_an_unknown_format_is_reported(tmp_path, capsys):
    state = {"format": 0, "influence": {}}
    _store(tmp_path, **{STATE_KEY: {"2": {"selected-history": state}}}).close()
    code, out = _verify(tmp_path, capsys)
    assert code == 1 and "selected-history" in out and "crab-state" in out
