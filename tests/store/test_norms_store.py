"""The store's norms rows (``retain-mode = norms``): what a round after t_1 keeps of each update."""

from __future__ import annotations

import sqlite3
import struct

import pytest
import torch

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.blobs import squared_norms
from fedunlearn.store.index import NORMS_VERSION
from fedunlearn.store.index_rows import NormsRow
from fedunlearn.store.update_store import UpdateStore


def _state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": scale * torch.randn(64, 32, generator=g),
        "conv.bias": scale * torch.randn(4, generator=g),
        "bn.num_batches_tracked": torch.tensor(seed),
    }


def _norms_store(root, dtype="float32", clients=(0, 1, 2), rounds=(1, 2, 3)):
    """Round ``rounds[0]`` whole, the later ones norms only (what the interval policy keeps)."""
    store = UpdateStore(root, dtype=dtype)
    for t in rounds:
        with store.begin_round(t, _state(100 + t) if t == rounds[0] else None) as writer:
            for k in clients:
                add = writer.add_update if t == rounds[0] else writer.add_norms
                add(k, _state(10 * t + k), 5 + k)
    return store


def test_a_norms_round_keeps_counts_and_the_norms_full_mode_would_record(tmp_path):
    for dtype in ("float32", "float16"):
        norms = _norms_store(tmp_path / f"norms-{dtype}", dtype)
        full = UpdateStore(tmp_path / f"full-{dtype}", dtype=dtype)
        for t in (1, 2, 3):
            full.write_round(t, _state(100 + t), {k: (_state(10 * t + k), 5 + k) for k in range(3)})
        assert norms.rounds() == [1, 2, 3] and norms.clients() == [0, 1, 2]
        for t in (2, 3):
            kept, whole = norms.read_round(t), full.read_round(t)
            assert kept.global_model is None and kept.updates == {}
            assert kept.norms_only == kept.clients == [0, 1, 2]
            assert kept.num_examples == whole.num_examples == norms.num_examples(t)
            assert kept.squares == whole.squares  # float for float: the same eq. (2) step sizes
            assert set(kept.squares[0]) == {"conv.weight", "conv.bias"}
        assert norms.read_round(1).squares == full.read_round(1).squares


def test_norms_rounds_cost_bytes_not_megabytes(tmp_path):
    store = _norms_store(tmp_path / "s")
    sizes = store.bytes_per_round()
    row = NormsRow(2, 0, 5, b"\0" * 16)
    assert sizes[2] == sizes[3] == 3 * row.bytes == 3 * (24 + 16 + 32)
    assert sizes[1] > 10 * sizes[2]
    assert store.total_bytes() == sum(sizes.values())
    index = store.index()
    assert sorted(index[index.kind == "norms"]["round"].unique()) == [2, 3]


def test_what_a_norms_round_did_not_keep_is_refused_by_name(tmp_path):
    store = _norms_store(tmp_path / "s")
    with pytest.raises(ConfigError, match="round.*global model was kept"):
        store.read_global(2)
    with pytest.raises(ConfigError, match="only the norms"):
        store.read_update(2, 0)
    store.read_update(1, 0)  # round t_1 is whole


def test_norms_of_a_non_finite_update_are_refused_and_nothing_commits(tmp_path):
    store = _norms_store(tmp_path / "s", rounds=(1,))
    bad = _state(7)
    bad["conv.bias"][0] = float("nan")
    with pytest.raises(ConfigError, match="NaN"):
        with store.begin_round(2, None) as writer:
            writer.add_norms(0, _state(8), 3)
            writer.add_norms(1, bad, 3)
    assert store.rounds() == [1]
    with pytest.raises(ConfigError, match="each client once"):
        with store.begin_round(2, None) as writer:
            writer.add_norms(0, _state(8), 3)
            writer.add_update(0, _state(8), 3)
    with pytest.raises(ConfigError, match="squares"):
        with store.begin_round(2, None) as writer:
            writer.add_norms(0, _state(8), 3, squares={"conv.weight": 1.0})
    assert store.rounds() == [1] and store.verify() == []


def test_a_changed_set_of_tensors_is_refused(tmp_path):
    store = _norms_store(tmp_path / "s")
    other = {"fc.weight": torch.ones(2)}
    with pytest.raises(ConfigError, match="layout"):
        with store.begin_round(4, None) as writer:
            writer.add_norms(0, other, 3)
    assert store.rounds() == [1, 2, 3]


def _bytes_under(root) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_a_forgotten_clients_norms_leave_no_byte_in_any_file(tmp_path):
    store = _norms_store(tmp_path / "s")
    target = [row.squares for row in store._index.norms_rows() if row.client == 1]
    assert all(packed in _bytes_under(tmp_path / "s") for packed in target)
    store.delete_client(1)
    assert store.clients() == [0, 2] and store.num_examples(3) == {0: 5, 2: 7}
    left = _bytes_under(tmp_path / "s")
    assert not any(packed in left for packed in target)
    assert store.verify() == []


def test_a_resumed_run_drops_norms_rounds_after_its_checkpoint(tmp_path):
    store = _norms_store(tmp_path / "s")
    assert store.delete_rounds_after(2) == [3]
    assert store.rounds() == [1, 2]
    with store.begin_round(3, None) as writer:  # round 3 trained again
        writer.add_norms(0, _state(99), 5)
    assert store.clients(3) == [0]


def _sql(root, statement, *parameters):
    connection = sqlite3.connect(root / "index.sqlite")
    connection.execute(statement, parameters)
    connection.commit()
    connection.close()


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE norms SET num_examples = 500 WHERE round = 2 AND client = 0",
        "UPDATE norms SET squares = ? WHERE round = 2 AND client = 0",
        "UPDATE norms SET round = 7 WHERE round = 2 AND client = 0",
        'UPDATE norms_layout SET tensors = \'["conv.weight", "conv.bias"]\'',
    ],
)
def test_an_edited_norms_row_or_layout_fails_loudly(tmp_path, edit):
    store = _norms_store(tmp_path / "s")
    store.close()
    parameters = (struct.pack("<2d", 1.0, 4.0),) if "?" in edit else ()
    _sql(tmp_path / "s", edit, *parameters)
    store = UpdateStore(tmp_path / "s", readonly=True)
    assert store.verify()
    with pytest.raises(StoreCorruptionError, match="norms row"):
        list(store.iter_rounds())


def test_a_norms_index_is_version_3_and_a_newer_one_is_refused(tmp_path):
    _norms_store(tmp_path / "s").close()
    connection = sqlite3.connect(tmp_path / "s" / "index.sqlite")
    assert connection.execute("PRAGMA user_version").fetchone()[0] == NORMS_VERSION
    connection.execute(f"PRAGMA user_version = {NORMS_VERSION + 1}")
    connection.commit()
    connection.close()
    with pytest.raises(ConfigError, match="upgrade fedunlearn"):
        UpdateStore(tmp_path / "s", readonly=True)


def test_a_store_without_norms_stays_version_2_and_reads_as_before(tmp_path):
    store = UpdateStore(tmp_path / "s")
    store.write_round(1, _state(1), {0: (_state(2), 4)})
    store.close()
    connection = sqlite3.connect(tmp_path / "s" / "index.sqlite")
    assert connection.execute("PRAGMA user_version").fetchone()[0] == 2
    connection.close()
    readonly = UpdateStore(tmp_path / "s", readonly=True)
    assert readonly.rounds() == [1] and readonly.read_round(1).norms_only == []
    assert readonly.read_round(1).squares[0] == squared_norms(_state(2))


def test_the_cheap_total_agrees_with_the_verified_rows(tmp_path):
    store = _norms_store(tmp_path / "s")
    assert store.total_bytes() == sum(store.bytes_per_round().values())
    assert store.total_bytes() == int(store.index()["bytes"].sum())
