"""Tests of the retained-update store: round trips, atomicity, crashes, corruption, deletion."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.update_store import RetainedRound, StoreBusyError, UpdateStore

REPOSITORY_ROOT = Path(__file__).resolve().parents[1]


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

    def failing_insert(self, round_number, rows):
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
    from fedunlearn.update_store import UpdateStore

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
