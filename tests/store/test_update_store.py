"""Tests of the retained-update store: round trips, atomicity, crashes, corruption, deletion."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.header import FORMAT_VERSION
from fedunlearn.store.index import StoreBusyError, StoreReadOnlyError
from fedunlearn.store.update_store import RetainedRound, UpdateStore

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


def make_state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A small state dict with floats, a BatchNorm-style int64 counter and a bool mask."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(4, 3, 3, 3, generator=generator) * scale,
        "conv.bias": torch.randn(4, generator=generator) * scale,
        "bn.running_mean": torch.randn(4, generator=generator) * scale,
        "bn.num_batches_tracked": torch.tensor(1000 + seed, dtype=torch.int64),
        "mask": torch.rand(7, generator=generator) > 0.5,
    }


def assert_states_equal(found: dict, expected: dict) -> None:
    assert sorted(found) == sorted(expected)
    for name, tensor in expected.items():
        expected_tensor = tensor.float() if tensor.is_floating_point() else tensor
        assert found[name].dtype == expected_tensor.dtype, name
        assert torch.equal(found[name], expected_tensor), name


def write_rounds(store: UpdateStore, rounds=(1, 3, 5), clients=(0, 1, 2)) -> None:
    for round_number in rounds:
        store.write_round(
            round_number,
            make_state(round_number * 100),
            {
                client: (make_state(round_number * 100 + client + 1), 10 * (client + 1))
                for client in clients
            },
        )


def files_containing(root: Path, pattern: bytes) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and pattern in path.read_bytes()]


def blob_files(root: Path) -> list[Path]:
    return sorted(path for path in (root / "blobs").rglob("*") if path.is_file())


# ---------------------------------------------------------------- round trips
def test_float32_round_trip_is_exact(tmp_path):
    store = UpdateStore(tmp_path / "run")
    write_rounds(store)
    assert store.dtype == "float32"
    assert store.rounds() == [1, 3, 5] and len(store) == 3
    assert store.clients() == [0, 1, 2] and store.clients(3) == [0, 1, 2]
    assert store.num_examples(3) == {0: 10, 1: 20, 2: 30}
    assert_states_equal(store.read_global(3), make_state(300))
    assert_states_equal(store.read_update(3, 2), make_state(303))
    retained = store.read_round(5)
    assert (
        isinstance(retained, RetainedRound)
        and retained.round == 5
        and retained.clients == [0, 1, 2]
    )
    assert_states_equal(retained.updates[1], make_state(502))
    assert retained.num_examples == {0: 10, 1: 20, 2: 30}
    assert (tmp_path / "run/blobs/round_000003/client_000002.safetensors").is_file()
    assert (tmp_path / "run/blobs/round_000003/global.safetensors").is_file()


def test_float16_round_trip_within_rounding_bound_and_non_float_exact(tmp_path):
    # Round-to-nearest into binary16 (11-bit significand) has relative error <= 2**-11 for values
    # in the normal range [2**-14, 65504]; the magnitudes below stay inside it.
    generator = torch.Generator().manual_seed(0)
    magnitude = torch.exp2(torch.empty(1000).uniform_(-13, 15, generator=generator))
    sign = torch.where(torch.rand(1000, generator=generator) > 0.5, 1.0, -1.0)
    state = {
        "weight": (sign * magnitude).reshape(10, 100),
        "weight64": (sign * magnitude).double(),
        "counter": torch.tensor(123456789, dtype=torch.int64),
        "mask": magnitude > 1,
        "index": torch.arange(-5, 5, dtype=torch.int32),
    }
    store = UpdateStore(tmp_path, dtype="float16")
    store.write_round(1, state, {4: (state, 8)})
    for found in (store.read_global(1), store.read_update(1, 4)):
        for name in ("weight", "weight64"):
            assert found[name].dtype == torch.float32
            relative_error = (found[name].double() - state[name].double()).abs() / state[
                name
            ].double().abs()
            assert relative_error.max().item() <= 2.0**-11, name
        for name in ("counter", "mask", "index"):
            assert found[name].dtype == state[name].dtype and torch.equal(found[name], state[name])
    assert set(store.index()["dtype"]) == {"float16"}


def test_float16_store_rejects_values_that_would_overflow(tmp_path):
    store = UpdateStore(tmp_path, dtype="float16")
    with pytest.raises(ConfigError, match="float16"):
        store.write_round(1, {"weight": torch.tensor([1.0e6])}, {})
    assert store.rounds() == [] and blob_files(tmp_path) == []


def test_tied_weights_and_non_contiguous_tensors_are_written(tmp_path):
    shared = torch.randn(6, 4)
    state = {"embedding": shared, "decoder": shared, "transposed": shared.t()}
    store = UpdateStore(tmp_path)
    store.write_round(1, state, {})
    found = store.read_global(1)
    assert torch.equal(found["embedding"], shared) and torch.equal(found["decoder"], shared)
    assert torch.equal(found["transposed"], shared.t())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_moved_to_the_cpu_before_writing(tmp_path):
    state = make_state(1)
    store = UpdateStore(tmp_path, dtype="float16")
    store.write_round(1, {name: tensor.cuda() for name, tensor in state.items()}, {})
    found = store.read_global(1)
    assert all(tensor.device.type == "cpu" for tensor in found.values())
    assert torch.equal(found["bn.num_batches_tracked"], state["bn.num_batches_tracked"])


# ---------------------------------------------------------------- atomicity and crashes
def test_exception_inside_begin_round_leaves_no_round_and_no_files(tmp_path):
    store = UpdateStore(tmp_path)
    write_rounds(store, rounds=(1,))
    before = blob_files(tmp_path)
    with (
        pytest.raises(RuntimeError, match="client dropped"),
        store.begin_round(2, make_state(200)) as writer,
    ):
        writer.add_update(0, make_state(201), 5)
        writer.add_update(1, make_state(202), 5)
        raise RuntimeError("client dropped")
    assert store.rounds() == [1]
    assert blob_files(tmp_path) == before
    assert not (tmp_path / "blobs/round_000002").exists()
    store.write_round(2, make_state(200), {0: (make_state(201), 5)})  # the round can be retried
    assert store.rounds() == [1, 2]


def test_failed_commit_without_cleanup_is_cleaned_on_reopen(tmp_path, monkeypatch):
    store = UpdateStore(tmp_path)
    write_rounds(store, rounds=(1,))

    def failing_insert(self, round_number, rows, norms=()):
        raise OSError("disk full during commit")

    # Both patched: the commit fails and the writer's own cleanup never runs, as if killed.
    monkeypatch.setattr(UpdateStore, "_insert_rows", failing_insert)
    monkeypatch.setattr(UpdateStore, "_remove_unindexed", lambda self, directory, committed: 0)
    with pytest.raises(OSError, match="disk full"):
        store.write_round(2, make_state(200), {0: (make_state(201), 5), 1: (make_state(202), 6)})
    assert len(list((tmp_path / "blobs/round_000002").iterdir())) == 3
    monkeypatch.undo()
    store.close()

    reopened = UpdateStore(tmp_path)
    assert reopened.rounds() == [1]
    assert not (tmp_path / "blobs/round_000002").exists()
    assert reopened.verify() == []


CRASHING_WRITER = textwrap.dedent("""
    import os, sys, torch
    from fedunlearn.store.update_store import UpdateStore

    root, crash_point = sys.argv[1], sys.argv[2]
    store = UpdateStore(root)
    store.write_round(1, {"w": torch.ones(8)}, {0: ({"w": torch.ones(8)}, 3)})
    if crash_point == "mid-blob":
        real_replace = os.replace
        def dying_replace(source, destination):
            # the temporary file of client 1 is fully written and fsynced, but never renamed
            if str(destination).endswith("client_000001.safetensors"):
                os._exit(17)
            real_replace(source, destination)
        os.replace = dying_replace
    with store.begin_round(2, {"w": torch.zeros(8)}) as writer:
        writer.add_update(0, {"w": torch.full((8,), 2.0)}, 3)
        writer.add_update(1, {"w": torch.full((8,), 3.0)}, 4)
        if crash_point == "before-commit":
            os._exit(17)
        writer.add_update(2, {"w": torch.full((8,), 4.0)}, 5)
""")


@pytest.mark.parametrize("crash_point", ["mid-blob", "before-commit"])
def test_process_killed_mid_round_leaves_no_valid_round_and_reopen_cleans(tmp_path, crash_point):
    script = tmp_path / "crashing_writer.py"
    script.write_text(CRASHING_WRITER)
    root = tmp_path / "run"
    environment = dict(os.environ, PYTHONPATH=str(REPOSITORY_ROOT))
    completed = subprocess.run(
        [sys.executable, str(script), str(root), crash_point],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 17, completed.stderr
    leftovers = list((root / "blobs/round_000002").iterdir())
    assert leftovers, "the simulated crash should have left files behind"
    if crash_point == "mid-blob":
        assert any(path.name.endswith(".tmp") for path in leftovers)

    store = UpdateStore(root)
    assert store.rounds() == [1]
    assert not (root / "blobs/round_000002").exists()
    assert not [path for path in root.rglob("*.tmp")]
    assert store.verify() == []
    store.write_round(2, {"w": torch.zeros(8)}, {0: ({"w": torch.full((8,), 2.0)}, 3)})
    assert store.rounds() == [1, 2]


def test_opening_while_another_writer_is_mid_round_keeps_its_files(tmp_path):
    writer_store = UpdateStore(tmp_path)
    with writer_store.begin_round(1, make_state(100)) as writer:
        writer.add_update(0, make_state(101), 5)
        reader = UpdateStore(tmp_path)  # must not mistake the round in progress for leftovers
        assert reader.rounds() == []
        with pytest.raises(StoreBusyError):
            reader.write_round(2, make_state(200), {})
        writer.add_update(1, make_state(102), 5)
    assert reader.rounds() == [1] and reader.clients(1) == [0, 1]
    assert_states_equal(reader.read_update(1, 1), make_state(102))


# ---------------------------------------------------------------- corruption
def test_flipped_byte_raises_on_read_and_is_reported_by_verify(tmp_path):
    store = UpdateStore(tmp_path)
    write_rounds(store)
    blob = tmp_path / "blobs/round_000003/client_000001.safetensors"
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0x01
    blob.write_bytes(bytes(data))
    with pytest.raises(
        StoreCorruptionError, match=r"round 3, client 1: blob .*client_000001\.safetensors"
    ):
        store.read_update(3, 1)
    with pytest.raises(StoreCorruptionError):
        store.read_round(3)
    assert_states_equal(store.read_update(3, 0), make_state(301))  # neighbours unaffected
    problems = store.verify()
    assert len(problems) == 1 and "round 3, client 1" in problems[0] and "sha256" in problems[0]


def test_missing_blob_raises_on_read_and_is_reported_by_verify(tmp_path):
    store = UpdateStore(tmp_path)
    write_rounds(store)
    (tmp_path / "blobs/round_000005/global.safetensors").unlink()
    with pytest.raises(
        StoreCorruptionError, match=r"round 5, global model: blob .*global\.safetensors is missing"
    ):
        store.read_global(5)
    problems = store.verify()
    assert len(problems) == 1 and "round 5, global model" in problems[0]
    assert isinstance(StoreCorruptionError("x"), IOError)


# ---------------------------------------------------------------- deletion
def test_delete_clients_is_delete_client_for_each_with_one_vacuum(tmp_path, monkeypatch):
    one, many = UpdateStore(tmp_path / "one"), UpdateStore(tmp_path / "many")
    write_rounds(one)
    write_rounds(many)
    assert sum(one.delete_client(c) for c in (0, 2)) == 6
    vacuums = []
    vacuum = many._index.vacuum
    monkeypatch.setattr(many._index, "vacuum", lambda: vacuums.append(1) or vacuum())
    assert many.delete_clients([2, 0, 2]) == 6 and len(vacuums) == 1
    assert many.clients() == one.clients() == [1]
    rows = ["round", "client", "kind"]
    assert many.index()[rows].equals(one.index()[rows])
    assert many.delete_clients([0, 2]) == 0  # idempotent
    with pytest.raises(ConfigError, match="clients"):
        many.delete_clients([-1])
    assert many.clients() == [1] and many.verify() == []


def test_delete_client_leaves_no_byte_of_its_updates_on_disk(tmp_path):
    store = UpdateStore(tmp_path)
    write_rounds(store)
    # the raw float32 bytes of one tensor of each update are a distinctive signature of it
    signatures = {
        client: [
            make_state(round_number * 100 + client + 1)["conv.weight"].numpy().tobytes()[:64]
            for round_number in (1, 3, 5)
        ]
        for client in (0, 1, 2)
    }
    checksums = store.index().query("client == 1")["checksum"].tolist()
    for client in (0, 1, 2):
        assert all(files_containing(tmp_path, signature) for signature in signatures[client])

    assert store.delete_client(1) == 3
    for signature in signatures[1]:
        assert files_containing(tmp_path, signature) == []
    for checksum in checksums:  # VACUUM with secure_delete: no index page keeps the rows
        assert files_containing(tmp_path, checksum.encode()) == []
    assert files_containing(tmp_path, b"client_000001") == []
    for client in (0, 2):
        assert all(files_containing(tmp_path, signature) for signature in signatures[client])

    assert store.clients() == [0, 2] and store.rounds() == [1, 3, 5]
    assert 1 not in store.index()["client"].dropna().tolist()
    assert store.num_examples(3) == {0: 10, 2: 30}
    with pytest.raises(ConfigError, match="client"):
        store.read_update(3, 1)
    assert_states_equal(store.read_update(5, 2), make_state(503))
    assert store.verify() == []
    assert store.delete_client(1) == 0
    assert UpdateStore(tmp_path).clients() == [0, 2]


# ---------------------------------------------------------------- iteration
def test_iter_rounds_yields_in_order_one_at_a_time_and_honors_filters(tmp_path):
    store = UpdateStore(tmp_path)
    for round_number in (7, 1, 4):  # written out of order
        store.write_round(
            round_number,
            make_state(round_number),
            {
                client: (make_state(10 * round_number + client), client + 1)
                for client in (0, 1, 2, 3)
            },
        )
    assert [retained.round for retained in store.iter_rounds()] == [1, 4, 7]
    excluded = list(store.iter_rounds(exclude=[1, 3]))
    assert all(retained.clients == [0, 2] for retained in excluded)
    assert excluded[1].num_examples == {0: 1, 2: 3}
    assert_states_equal(excluded[1].updates[2], make_state(42))
    generator_of_clients = (client for client in (2, 3))  # must serve every round, not the first
    assert [r.clients for r in store.iter_rounds(clients=generator_of_clients)] == [[2, 3]] * 3
    assert [retained.clients for retained in store.iter_rounds(clients=[3, 1, 9], exclude=3)] == [
        [1]
    ] * 3

    # lazy: a corrupt last round fails only when reached, after earlier rounds were yielded
    (tmp_path / "blobs/round_000007/global.safetensors").write_bytes(b"garbage")
    iterator = store.iter_rounds()
    assert next(iterator).round == 1 and next(iterator).round == 4
    with pytest.raises(StoreCorruptionError):
        next(iterator)


# ---------------------------------------------------------------- argument errors
def test_invalid_arguments_raise_config_error(tmp_path):
    with pytest.raises(ConfigError, match="store-dtype"):
        UpdateStore(tmp_path / "a", dtype="bfloat16")
    store = UpdateStore(tmp_path / "b")
    write_rounds(store, rounds=(1,))
    with pytest.raises(ConfigError, match=r"invalid round=1: .*round 1 is already committed"):
        store.write_round(1, make_state(0), {})
    with pytest.raises(ConfigError, match="round"):
        store.begin_round(0, make_state(0))
    with pytest.raises(ConfigError, match="round"):
        store.write_round(True, make_state(0), {})
    with pytest.raises(ConfigError, match="client"), store.begin_round(2, make_state(0)) as writer:
        writer.add_update(3, make_state(1), 5)
        writer.add_update(3, make_state(2), 5)
    for bad_count in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="num_examples"):
            store.write_round(2, make_state(0), {0: (make_state(1), bad_count)})
    with pytest.raises(ConfigError, match="client"):
        store.write_round(2, make_state(0), {-1: (make_state(1), 3)})
    with pytest.raises(ConfigError, match="update"):
        store.write_round(2, make_state(0), {0: ({"w": [1.0, 2.0]}, 3)})
    with pytest.raises(ConfigError, match="round"):
        store.read_global(2)
    with pytest.raises(ConfigError, match="metadata"):
        store.set_metadata(model=object())
    assert (
        store.rounds() == [1]
        and [path.parent.name for path in blob_files(tmp_path / "b")] == ["round_000001"] * 4
    )


# ---------------------------------------------------------------- persistence and introspection
def test_reopen_keeps_dtype_metadata_and_rounds(tmp_path):
    store = UpdateStore(tmp_path, dtype="float16")
    store.set_metadata(delta_t=2, dataset="mnist")
    store.set_metadata(seed=7)
    write_rounds(store, rounds=(1, 3))
    store.close()

    reopened = UpdateStore(tmp_path)
    assert reopened.dtype == "float16"
    assert reopened.metadata == {"delta_t": 2, "dataset": "mnist", "seed": 7}
    assert reopened.rounds() == [1, 3] and reopened.clients(1) == [0, 1, 2]
    assert UpdateStore(tmp_path, dtype="float16").dtype == "float16"
    with pytest.raises(ConfigError, match="invalid store-dtype='float32': 'float16'"):
        UpdateStore(tmp_path, dtype="float32")
    second = UpdateStore(tmp_path)  # two readers on one root
    assert second.read_round(3).num_examples == reopened.read_round(3).num_examples


def test_index_sizes_len_and_repr(tmp_path):
    store = UpdateStore(tmp_path)
    assert store.index().empty and list(store.index().columns) == [
        "round",
        "client",
        "kind",
        "num_examples",
        "dtype",
        "bytes",
        "checksum",
        "path",
    ]
    write_rounds(store, rounds=(1, 3), clients=(2, 0))
    index = store.index()
    assert index[["round", "kind"]].values.tolist() == [
        [1, "global"],
        [1, "update"],
        [1, "update"],
        [3, "global"],
        [3, "update"],
        [3, "update"],
    ]
    assert index["client"].tolist() == [pd.NA, 0, 2, pd.NA, 0, 2]
    assert index["num_examples"].tolist() == [pd.NA, 10, 30, pd.NA, 10, 30]
    on_disk = {int(path.parent.name.split("_")[1]): 0 for path in blob_files(tmp_path)}
    for path in blob_files(tmp_path):
        on_disk[int(path.parent.name.split("_")[1])] += path.stat().st_size
    assert store.bytes_per_round() == on_disk
    assert store.total_bytes() == sum(on_disk.values()) == index["bytes"].sum()
    assert all((tmp_path / path).is_file() for path in index["path"])
    assert len(store) == 2
    assert "rounds=2 (1..3)" in repr(store) and "float32" in repr(store)


def test_delete_rounds_after_removes_later_rounds_rows_and_files_only(tmp_path):
    store = UpdateStore(tmp_path / "store")
    write_rounds(store, rounds=(1, 2, 3, 4))
    kept_files = [
        p for p in blob_files(store.root) if "round_000001" in str(p) or "round_000002" in str(p)
    ]
    assert store.delete_rounds_after(2) == [3, 4]
    assert store.rounds() == [1, 2]
    assert blob_files(store.root) == kept_files
    assert not (store.root / "blobs" / "round_000003").exists()
    assert store.verify() == []
    assert_states_equal(store.read_update(2, 1), make_state(202))
    assert store.delete_rounds_after(2) == []  # idempotent
    # the discarded round can be written again (a resumed run retains it anew)
    write_rounds(store, rounds=(3,))
    assert store.rounds() == [1, 2, 3]
    assert store.delete_rounds_after(0) == [1, 2, 3] and blob_files(store.root) == []
    with pytest.raises(ConfigError, match="round.*>= 0"):
        store.delete_rounds_after(-1)


def test_delete_from_round_removes_those_clients_or_the_whole_round_and_nothing_else(tmp_path):
    store = UpdateStore(tmp_path / "store")
    write_rounds(store, rounds=(1, 2, 3))
    others = [p for p in blob_files(store.root) if "round_000002" not in str(p)]
    assert store.delete_from_round(2, [0, 2]) == 2
    assert store.clients(2) == [1] and store.num_examples(2) == {1: 20}
    assert_states_equal(store.read_global(2), make_state(200))
    assert store.delete_from_round(2) == 2  # the global model and client 1's update
    assert store.rounds() == [1, 3] and not (store.root / "blobs" / "round_000002").exists()
    assert blob_files(store.root) == others and store.verify() == []
    with pytest.raises(ConfigError, match="a committed round"):
        store.delete_from_round(2)


# ---------------------------------------------------------------- a store that never destroys
def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, mode, size, mtime and (files) contents."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.stat()
        content = path.read_bytes() if path.is_file() else None
        found[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns, content)
    return found


def written_store(root: Path) -> UpdateStore:
    store = UpdateStore(root)
    write_rounds(store, rounds=(1, 3))
    store.close()
    return store


@pytest.mark.parametrize("damage", ["missing", "empty"])
def test_blobs_without_an_index_raise_and_are_never_deleted(tmp_path, damage):
    written_store(tmp_path)
    index = tmp_path / "index.sqlite"
    if damage == "missing":
        index.unlink()
    else:
        index.write_bytes(b"")
    before = tree(tmp_path / "blobs")
    for readonly in (True, False, False):  # twice writable: the first open must not half-repair
        with pytest.raises(StoreCorruptionError) as info:
            UpdateStore(tmp_path, readonly=readonly)
        message = str(info.value)
        assert f"store {tmp_path}" in message and f"is {damage}" in message
        assert "restore index.sqlite from a backup" in message and "left untouched" in message
        assert tree(tmp_path / "blobs") == before
    assert (
        index.exists() == (damage == "empty") and not (tmp_path / "index.sqlite-journal").exists()
    )


def test_a_store_that_crashed_right_after_creation_is_completed_normally(tmp_path, monkeypatch):
    def crash(self):
        raise KeyboardInterrupt  # the process dies after the header, before the index

    with monkeypatch.context() as patched:
        patched.setattr(UpdateStore, "_open_index", crash)
        with pytest.raises(KeyboardInterrupt):
            UpdateStore(tmp_path / "fresh")
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["store.json"]
    empty = UpdateStore(tmp_path / "fresh", readonly=True)
    assert empty.rounds() == [] and empty.verify() == []
    assert not (tmp_path / "fresh" / "index.sqlite").exists()  # the read-only open created none
    store = UpdateStore(tmp_path / "fresh")
    write_rounds(store, rounds=(2,))
    assert store.rounds() == [2] and store.verify() == []


def test_blobs_without_header_or_index_are_not_taken_for_a_new_store(tmp_path):
    written_store(tmp_path)
    (tmp_path / "index.sqlite").unlink()
    (tmp_path / "store.json").unlink()
    before = tree(tmp_path)
    for readonly in (False, True):
        with pytest.raises(StoreCorruptionError, match="neither store.json nor index.sqlite"):
            UpdateStore(tmp_path, readonly=readonly)
    assert tree(tmp_path) == before


def _schema_of_another_program(index: Path) -> None:
    index.unlink()
    connection = sqlite3.connect(index)
    connection.execute("CREATE TABLE blobs (round INTEGER, path TEXT)")
    connection.commit()
    connection.close()


@pytest.mark.parametrize(
    "damage",
    [
        lambda index: index.write_bytes(b"this is not an SQLite database" * 200),
        lambda index: index.write_bytes(index.read_bytes()[: len(index.read_bytes()) // 2]),
        lambda index: index.write_bytes(index.read_bytes()[:100]),
        _schema_of_another_program,
    ],
    ids=["not-sqlite", "truncated-half", "truncated-header", "wrong-schema"],
)
def test_an_unreadable_index_raises_store_corruption_and_touches_no_blob(tmp_path, damage):
    written_store(tmp_path)
    damage(tmp_path / "index.sqlite")
    before = tree(tmp_path / "blobs")
    for readonly in (True, False):
        with pytest.raises(StoreCorruptionError, match=r"index\.sqlite"):
            store = UpdateStore(tmp_path, readonly=readonly)
            store.rounds()  # a damage SQLite only notices on reading must raise the same
            store.verify()
    assert tree(tmp_path / "blobs") == before


def test_a_damaged_table_page_raises_on_read_and_is_reported_by_verify(tmp_path):
    written_store(tmp_path)
    index = tmp_path / "index.sqlite"
    connection = sqlite3.connect(index)
    [(page,)] = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'blobs'")
    [(page_size,)] = connection.execute("PRAGMA page_size")
    connection.close()
    data = bytearray(index.read_bytes())
    data[(page - 1) * page_size : page * page_size] = b"\xa5" * page_size  # size kept: opens fine
    index.write_bytes(bytes(data))
    store = UpdateStore(tmp_path, readonly=True)
    with pytest.raises(StoreCorruptionError, match=r"index\.sqlite is not a readable store index"):
        store.rounds()
    problems = store.verify()
    assert problems and all("index.sqlite" in problem or "page" in problem for problem in problems)
    with pytest.raises(StoreCorruptionError, match="index.sqlite"):
        UpdateStore(tmp_path)  # quick_check before any cleanup
    assert len(blob_files(tmp_path)) == 8


def set_column(root: Path, column: str, value, where: str = "client = 1 AND round = 3") -> None:
    connection = sqlite3.connect(root / "index.sqlite")
    connection.execute(f"UPDATE blobs SET {column} = ? WHERE {where}", (value,))
    connection.commit()
    connection.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("num_examples", 999),
        ("num_examples", "twenty"),
        ("num_examples", 20.5),
        ("num_examples", None),
        ("num_examples", b"\x14"),
        ("bytes", 1),
        ("client", 7),
        ("kind", "global"),
        ("dtype", "float16"),
        ("round", 5),
        ("path", "blobs/round_000003/client_000000.safetensors.bak"),
        ("checksum", "0" * 64),
    ],
)
def test_an_edited_index_field_is_detected_on_every_read_and_by_verify(tmp_path, column, value):
    store = UpdateStore(tmp_path)
    write_rounds(store)
    set_column(tmp_path, column, value)
    row = "the row of round " + ("5" if column == "round" else "3")
    for read in (
        lambda: store.num_examples(3),
        lambda: store.read_round(3),
        lambda: store.clients(),
        lambda: store.rounds(),
        lambda: store.index(),
        lambda: store.delete_client(1),
    ):
        with pytest.raises(
            StoreCorruptionError, match=rf"{row}, client (1|7)\b.*edited or damaged"
        ):
            read()
    problems = store.verify()
    assert len(problems) == 1 and f"{value!r}" in problems[0] and "edited or damaged" in problems[0]
    assert store.num_examples(1) == {0: 10, 1: 20, 2: 30}  # other rounds stay readable
    assert len(blob_files(tmp_path)) == 3 * 4  # delete_client deleted nothing


def test_a_row_checksum_recomputed_for_a_foreign_path_is_still_refused(tmp_path):
    from fedunlearn.store.index_rows import BlobRow

    store = UpdateStore(tmp_path)
    write_rounds(store, rounds=(1,))
    connection = sqlite3.connect(tmp_path / "index.sqlite")
    fields = connection.execute(
        "SELECT round, client, kind, num_examples, dtype, bytes, checksum, path FROM blobs "
        "WHERE client = 2"
    ).fetchone()
    forged = BlobRow(*fields[:7], "../../../etc/passwd")
    connection.execute(
        "UPDATE blobs SET path = ?, row_checksum = ? WHERE client = 2",
        (forged.path, sealed_checksum(tmp_path, forged)),  # a forger with fedunlearn's code
    )
    connection.commit()
    connection.close()
    with pytest.raises(StoreCorruptionError, match="path is not 'blobs/round_000001/client_000002"):
        store.read_round(1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("who", ["global", "update"])
def test_non_finite_tensors_are_refused_at_write_leaving_no_round(tmp_path, bad, who):
    store = UpdateStore(tmp_path)
    write_rounds(store, rounds=(1,))
    poisoned = make_state(7)
    poisoned["conv.bias"][2] = bad
    global_model = poisoned if who == "global" else make_state(0)
    updates = (
        {0: (make_state(1), 5), 4: (poisoned, 5)} if who == "update" else {0: (make_state(1), 5)}
    )
    expected = "global model of round 2" if who == "global" else "update of client 4 in round 2"
    with pytest.raises(ConfigError, match=rf"invalid {expected}\['conv.bias'\]='1 NaN/Inf") as info:
        store.write_round(2, global_model, updates)
    assert "finite values only" in str(info.value)
    assert store.rounds() == [1] and not (tmp_path / "blobs/round_000002").exists()


def sealed_checksum(root: Path, row) -> str:
    """The checksum the store at ``root`` gives ``row`` (sealed with its run and store)."""
    with UpdateStore(root, readonly=True) as store:
        return store._index.blob_checksum(row)


def replace_blob(root: Path, round_number: int, client, tensors: dict) -> None:
    """Put ``tensors`` in a committed blob with a consistent index row, as an older version that
    did not refuse non-finite values would have written it."""
    import hashlib

    import safetensors.torch

    from fedunlearn.store.index_rows import BlobRow, blob_path

    data = safetensors.torch.save(tensors)
    (root / blob_path(round_number, client)).write_bytes(data)
    connection = sqlite3.connect(root / "index.sqlite")
    where = "round = ? AND " + ("client IS NULL" if client is None else "client = ?")
    parameters = (round_number,) if client is None else (round_number, client)
    fields = connection.execute(
        f"SELECT round, client, kind, num_examples, dtype FROM blobs WHERE {where}", parameters
    ).fetchone()
    row = BlobRow(
        *fields, len(data), hashlib.sha256(data).hexdigest(), blob_path(round_number, client)
    )
    connection.execute(
        f"UPDATE blobs SET bytes = ?, checksum = ?, row_checksum = ? WHERE {where}",
        (row.bytes, row.checksum, sealed_checksum(root, row), *parameters),
    )
    connection.commit()
    connection.close()


def test_verify_and_reads_report_non_finite_values_in_blobs_of_older_stores(tmp_path):
    store = UpdateStore(tmp_path)
    write_rounds(store, rounds=(1,))
    replace_blob(tmp_path, 1, 2, {"w": torch.tensor([1.0, float("nan"), float("inf")])})
    [problem] = store.verify()
    assert "round 1, client 2" in problem and "2 NaN/Inf value(s) of 3 in tensor 'w'" in problem
    with pytest.raises(
        StoreCorruptionError, match=r"round 1, client 2.*NaN/Inf values in tensor 'w'"
    ):
        store.read_update(1, 2)
    assert_states_equal(store.read_update(1, 1), make_state(102))


# ---------------------------------------------------------------- read-only stores
def test_a_read_only_store_reads_everything_and_writes_nothing(tmp_path):
    written_store(tmp_path)
    (tmp_path / ".lock").unlink()
    leftover = tmp_path / "blobs/round_000009"
    leftover.mkdir()
    (leftover / "client_000000.safetensors").write_bytes(b"a crash's leftover")
    before = tree(tmp_path)
    store = UpdateStore(tmp_path, readonly=True)
    assert store.readonly and store.rows_checksummed
    assert store.rounds() == [1, 3] and store.num_examples(3) == {0: 10, 1: 20, 2: 30}
    assert_states_equal(store.read_update(3, 2), make_state(303))
    assert store.verify() == [] and len(store.index()) == 8 and store.blob_count() == 8
    assert store.metadata == {} and "readonly=True" in repr(store)
    for write in (
        lambda: store.write_round(5, make_state(0), {}),
        lambda: store.begin_round(5, make_state(0)),
        lambda: store.delete_client(1),
        lambda: store.delete_rounds_after(1),
        lambda: store.set_metadata(seed=1),
    ):
        with pytest.raises(StoreReadOnlyError, match="readonly=True"):
            write()
    store.close()
    assert tree(tmp_path) == before  # no lock file, no cleanup of the leftover, nothing


def test_read_only_open_of_a_missing_store_creates_nothing(tmp_path):
    with pytest.raises(ConfigError, match="holding store.json"):
        UpdateStore(tmp_path / "absent", readonly=True)
    assert not (tmp_path / "absent").exists()


def test_read_only_index_falls_back_to_immutable_on_a_read_only_file_system(tmp_path, monkeypatch):
    import fedunlearn.store.index as store_index

    written_store(tmp_path)
    opened = []
    real_connect = store_index._connect_readonly

    def connect(uri):
        opened.append(uri.rsplit("?", 1)[1])
        if uri.endswith("mode=ro"):  # as where the file system refuses SQLite's read-only open
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(uri)

    monkeypatch.setattr(store_index, "_connect_readonly", connect)
    monkeypatch.setattr(store_index, "_on_readonly_file_system", lambda path: True)
    store = UpdateStore(tmp_path, readonly=True)
    assert opened == ["mode=ro", "immutable=1"] and store.rounds() == [1, 3]
    (tmp_path / "index.sqlite-journal").write_bytes(b"a hot journal")
    with pytest.raises(StoreCorruptionError, match="unfinished transaction"):
        UpdateStore(tmp_path, readonly=True)
    monkeypatch.setattr(store_index, "_on_readonly_file_system", lambda path: False)
    with pytest.raises(StoreCorruptionError, match="unable to open"):
        UpdateStore(tmp_path, readonly=True)


def test_writable_open_on_a_read_only_file_system_says_to_open_read_only(tmp_path, monkeypatch):
    written_store(tmp_path)

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda path: ReadOnly())
    with pytest.raises(StoreReadOnlyError, match=r"read-only file system.*readonly=True"):
        UpdateStore(tmp_path)


def test_a_lock_file_that_cannot_be_created_raises_store_read_only(tmp_path, monkeypatch):
    import errno

    import fedunlearn.store.header as header

    store = UpdateStore(tmp_path)

    def refuse(path, flags):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(header, "open_private_file", refuse)
    with pytest.raises(StoreReadOnlyError, match=r"\.lock \(Read-only file system\)"):
        store.write_round(1, make_state(0), {})


# ---------------------------------------------------------------- format 1 (no row checksums)
FORMAT_1_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    round INTEGER NOT NULL,
    client INTEGER,                 -- NULL for the global model
    kind TEXT NOT NULL CHECK (kind IN ('update', 'global')),
    num_examples INTEGER,           -- NULL for the global model
    dtype TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    checksum TEXT NOT NULL,         -- sha256 of the file, hex
    path TEXT NOT NULL UNIQUE       -- relative to the root; encodes (round, client, kind)
);
CREATE INDEX IF NOT EXISTS blobs_by_round ON blobs (round);
CREATE INDEX IF NOT EXISTS blobs_by_client ON blobs (client);
"""


def downgrade_to_format_1(root: Path) -> None:
    """Turn a store into what fedunlearn wrote before row checksums: format 1's schema (copied
    from that version), no user_version, header format_version 1, files 0644 in 0755 folders."""
    import json

    columns = "round, client, kind, num_examples, dtype, bytes, checksum, path"
    connection = sqlite3.connect(root / "index.sqlite")
    rows = connection.execute(f"SELECT {columns} FROM blobs").fetchall()
    connection.close()
    (root / "index.sqlite").unlink()
    connection = sqlite3.connect(root / "index.sqlite")
    connection.executescript(FORMAT_1_SCHEMA)
    connection.executemany(f"INSERT INTO blobs ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    connection.commit()
    connection.close()
    header = json.loads((root / "store.json").read_text())
    (root / "store.json").write_text(json.dumps({**header, "format_version": 1}))
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def test_format_1_store_is_read_as_it_is_read_only_and_migrated_by_a_writable_open(tmp_path):
    import json
    import stat

    written_store(tmp_path)
    downgrade_to_format_1(tmp_path)
    set_column(tmp_path, "num_examples", 25, where="client = 0 AND round = 1")  # undetectable yet
    before = tree(tmp_path)
    old = UpdateStore(tmp_path, readonly=True)
    assert not old.rows_checksummed and old.verify() == [] and old.num_examples(1)[0] == 25
    old.close()
    assert tree(tmp_path) == before

    migrated = UpdateStore(tmp_path)
    assert migrated.rows_checksummed and migrated.num_examples(1) == {0: 25, 1: 20, 2: 30}
    header = json.loads((tmp_path / "store.json").read_text())
    assert header["format_version"] == FORMAT_VERSION and "metadata_sha256" in header
    for path in [tmp_path, *tmp_path.rglob("*")]:  # made private like a new store
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    migrated.close()
    set_column(tmp_path, "num_examples", 26, where="client = 0 AND round = 1")  # now detected
    with pytest.raises(StoreCorruptionError, match="round 1, client 0"):
        UpdateStore(tmp_path, readonly=True).num_examples(1)


def test_store_files_and_folders_are_private_whatever_the_umask(tmp_path):
    import stat

    previous = os.umask(0o000)
    try:
        store = UpdateStore(tmp_path / "run" / "store")
        write_rounds(store, rounds=(1,))
        store.set_metadata(seed=1)
    finally:
        os.umask(previous)
    for path in [tmp_path / "run", *(tmp_path / "run").rglob("*")]:
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


# ---------------------------------------------------------------------- the header's metadata
#: Header fields a decision reads: what was retained and the policies' states (norms, Grams).
DECISIVE = {
    "retention-record": {"policy": "interval", "rounds": [1, 3, 5]},
    "retention-state": {"crab": {"norms": {"0": [1.5, 2.0]}}, "sifu": {"gram": [[2.0, 0.1]]}},
}


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["retention-record"]["rounds"].pop(),  # FedEraser would use fewer rounds
        lambda m: m["retention-state"]["crab"]["norms"]["0"].__setitem__(0, -1.5),
        lambda m: m["retention-state"]["sifu"]["gram"][0].__setitem__(0, 2e-12),
        lambda m: m.pop("retention-state"),
        lambda m: m.__setitem__("added", 1),
    ],
)
def test_an_edited_metadata_field_is_refused_by_name_before_it_is_read(tmp_path, capsys, edit):
    import json

    from fedunlearn import cli

    store = UpdateStore(tmp_path / "store")
    store.set_metadata(**DECISIVE)
    store.close()
    header = json.loads((tmp_path / "store" / "store.json").read_text())
    edit(header["metadata"])
    (tmp_path / "store" / "store.json").write_text(json.dumps(header))
    with pytest.raises(StoreCorruptionError, match="metadata field\\(s\\) \\['"):
        UpdateStore(tmp_path / "store", readonly=True)
    assert cli.main(["store", "verify", str(tmp_path / "store")]) == 1
    out = capsys.readouterr().out
    changed = {
        k
        for k in set(DECISIVE) | set(header["metadata"])
        if DECISIVE.get(k) != header["metadata"].get(k)
    }
    assert all(repr(k) in out for k in changed) and "were edited or damaged" in out


def test_checksums_removed_from_a_current_header_are_refused(tmp_path):
    import json

    store = UpdateStore(tmp_path)
    store.set_metadata(**DECISIVE)
    store.close()
    header = json.loads((tmp_path / "store.json").read_text())
    del header["metadata_sha256"]
    (tmp_path / "store.json").write_text(json.dumps(header))
    with pytest.raises(StoreCorruptionError, match="lacks its metadata checksums"):
        UpdateStore(tmp_path, readonly=True)


def test_a_format_2_header_is_read_and_a_writable_open_adds_the_checksums(tmp_path):
    import json

    store = UpdateStore(tmp_path)
    store.set_metadata(**DECISIVE)
    store.close()
    header = json.loads((tmp_path / "store.json").read_text())
    del header["metadata_sha256"], header["store_id"], header["run_id"]
    (tmp_path / "store.json").write_text(json.dumps({**header, "format_version": 2}))
    with pytest.raises(
        StoreCorruptionError, match="is of format 2, but its index belongs to store"
    ):
        UpdateStore(tmp_path)  # a bound store's header replaced by an older one: a downgrade
    with sqlite3.connect(tmp_path / "index.sqlite") as index:  # as fedunlearn wrote it before ids
        index.execute("DROP TABLE store_identity")
    assert UpdateStore(tmp_path, readonly=True).metadata == DECISIVE  # read as it is
    UpdateStore(tmp_path).close()  # a writable open migrates it
    header = json.loads((tmp_path / "store.json").read_text())
    assert header["format_version"] == FORMAT_VERSION and set(header["metadata_sha256"]) == set(
        DECISIVE
    )


def test_a_round_read_without_blobs_then_its_updates_one_at_a_time_in_client_order(tmp_path):
    """What FedEraser reads of a round of many clients: counts and norms rows at once, no blob;
    then each whole update once, ascending, with the norms the store recorded for it."""
    store = UpdateStore(tmp_path / "store")
    updates = {k: ({"w": torch.full((3,), float(k + 1))}, 10 + k) for k in (4, 0, 7, 2)}
    store.write_round(1, {"w": torch.zeros(3)}, updates)
    light = store.read_round(1, exclude=[7], blobs="none")
    assert light.global_model is None and light.updates == {}
    assert light.unread == {0, 2, 4} and light.norms_only == [] and light.clients == [0, 2, 4]
    assert light.num_examples == {0: 10, 2: 12, 4: 14}
    whole = store.read_round(1)
    read = list(store.iter_updates(1, [4, 0, 9]))  # 9 has no update: skipped
    assert [k for k, _, _ in read] == [0, 4]
    for k, update, squares in read:
        assert torch.equal(update["w"], whole.updates[k]["w"]) and squares == whole.squares[k]
    with pytest.raises(ConfigError, match="blobs"):
        store.read_round(1, blobs="updates")
