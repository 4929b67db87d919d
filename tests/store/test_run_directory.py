"""The run directory's checkpoint and metrics truncation, on which crash recovery relies."""

from __future__ import annotations

import datetime
import time

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from fedunlearn.errors import ConfigError
from fedunlearn.store.run_directory import RECOVERY_LOG, RunDirectory


def test_checkpoint_round_trip_keeps_round_and_tensors(tmp_path):
    run = RunDirectory.create(tmp_path / "run", {"seed": 0})
    assert run.load_checkpoint() is None
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(3)}
    run.save_checkpoint(4, state)
    run.save_checkpoint(5, {k: v + 1 for k, v in state.items()})  # replaced whole
    round_number, loaded = run.load_checkpoint()
    assert round_number == 5
    assert torch.equal(loaded["w"], state["w"] + 1) and torch.equal(loaded["n"], state["n"] + 1)
    assert not list(run.path.glob(".*.tmp"))
    run.remove_checkpoint()
    assert run.load_checkpoint() is None


def test_checkpoint_without_round_is_refused(tmp_path):
    run = RunDirectory.create(tmp_path / "run", {})
    save_file({"w": torch.zeros(2)}, str(run.path / "checkpoint.safetensors"))
    with pytest.raises(ConfigError, match="records its round"):
        run.load_checkpoint()


def test_truncate_metrics_drops_rows_after_the_round_on_disk_too(tmp_path):
    run = RunDirectory.create(tmp_path / "run", {})
    for r in range(5):
        run.append_metrics({"round": r, "test_accuracy": r / 10})
    assert run.truncate_metrics(2) == 2
    assert RunDirectory.open(run.path).metrics["round"].tolist() == [0, 1, 2]
    assert pd.read_csv(run.path / "metrics.csv")["round"].tolist() == [0, 1, 2]
    assert run.truncate_metrics(2) == 0


def modes_under(root) -> dict[str, int]:
    import os
    import stat

    found = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_every_file_a_run_directory_writes_is_0600_in_0700_folders(tmp_path, umask):
    import os

    import matplotlib.pyplot as plt

    from fedunlearn.plots import save_figure
    from fedunlearn.store.update_store import UpdateStore

    previous = os.umask(umask)
    try:
        run = RunDirectory.create(tmp_path / "out" / "run", {"seed": 0})
        run.append_metrics({"round": 0, "test_accuracy": 0.1})
        run.save_model("model_initial", {"w": torch.zeros(2)})
        run.save_checkpoint(1, {"w": torch.ones(2)})
        run.write_json("summary.json", {"done": True})
        run.write_table("unlearning", pd.DataFrame({"method": ["fedavg"], "acc": [0.5]}))
        run.append_log("unlearning_log.jsonl", {"targets": [1]})
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        save_figure(fig, run.path / "training.png")
        store = UpdateStore(run.store_path)
        store.write_round(1, {"w": torch.zeros(2)}, {0: ({"w": torch.ones(2)}, 3)})
        store.close()
    finally:
        os.umask(previous)
    modes = modes_under(tmp_path / "out")
    assert len(modes) == 20, sorted(
        modes
    )  # out, run, 10 run files (identity.json among them), store/ with 3 files, blobs/, round_000001/ and 2 blobs
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if (tmp_path / "out" / name).is_dir() else 0o600)
    }
    assert wrong == {}


def test_an_existing_empty_run_directory_is_made_private(tmp_path):
    import os

    (tmp_path / "run").mkdir(mode=0o755)
    os.chmod(tmp_path / "run", 0o755)
    RunDirectory.create(tmp_path / "run", {})
    assert modes_under(tmp_path / "run") == {
        ".": 0o700,
        "config.json": 0o600,
        "identity.json": 0o600,
    }


def test_a_torn_last_log_line_is_skipped_and_the_next_append_reads_whole(tmp_path):
    from fedunlearn.store.durable_io import TornLineWarning

    run = RunDirectory.create(tmp_path / "run", {})
    run.append_log("recovery_log.jsonl", {"resumed_after_round": 1})
    with open(run.path / "recovery_log.jsonl", "ab") as handle:
        handle.write(b'{"resumed_after_round": 2, "dropp')  # killed mid-append
    reopened = RunDirectory.open(run.path)
    with pytest.warns(TornLineWarning, match=str(run.path / "recovery_log.jsonl")):
        assert _untimed(reopened.read_log("recovery_log.jsonl")) == [{"resumed_after_round": 1}]
    with pytest.warns(TornLineWarning, match="cut off"):
        reopened.append_log("recovery_log.jsonl", {"resumed_after_round": 3})
    assert _untimed(reopened.read_log("recovery_log.jsonl")) == [
        {"resumed_after_round": 1},
        {"resumed_after_round": 3},
    ]


def _untimed(records):
    return [{key: value for key, value in record.items() if key != "time"} for record in records]


def test_append_log_stamps_each_record_with_its_local_time(tmp_path):
    run = RunDirectory.create(tmp_path / "run", {})
    before = time.time()
    run.append_log(RECOVERY_LOG, {"resumed_after_round": 1, "store_problems": []})
    [record] = run.read_log(RECOVERY_LOG)
    assert set(record) == {"time", "resumed_after_round", "store_problems"}
    stamped = datetime.datetime.strptime(record["time"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    assert before - 1 <= stamped <= time.time()
    with pytest.raises(ValueError, match="stamps it"):
        run.append_log(RECOVERY_LOG, {"time": "yesterday"})
    assert len(run.read_log(RECOVERY_LOG)) == 1


def test_a_damaged_middle_log_line_raises_naming_file_and_line(tmp_path):
    from fedunlearn.store.durable_io import LogCorruptionError

    run = RunDirectory.create(tmp_path / "run", {})
    for targets in ([1], [2]):
        run.append_log("unlearning_log.jsonl", {"targets": targets})
    first, second = (run.path / "unlearning_log.jsonl").read_bytes().splitlines(keepends=True)
    (run.path / "unlearning_log.jsonl").write_bytes(first + b'{"targ\n' + second)
    with pytest.raises(LogCorruptionError, match=r"unlearning_log\.jsonl, line 2: not a JSON"):
        run.read_log("unlearning_log.jsonl")


@pytest.mark.parametrize("name", ["model_final", "checkpoint"])
def test_an_edited_model_file_is_refused_on_read_and_a_file_without_a_digest_is_read(
    tmp_path, name
):
    from fedunlearn.errors import StoreCorruptionError

    run = RunDirectory.create(tmp_path / "run", {})
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor(3, dtype=torch.int64)}
    if name == "checkpoint":
        run.save_checkpoint(2, state)
        read = lambda: run.load_checkpoint()[1]  # noqa: E731
    else:
        run.save_model(name, state)
        read = lambda: run.load_model(name)  # noqa: E731
    assert torch.equal(read()["w"], state["w"])
    target = run.path / f"{name}.safetensors"
    data = bytearray(target.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's values
    target.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptionError, match=f"{name}.safetensors was edited or damaged"):
        read()
    metadata = {"round": "2"} if name == "checkpoint" else None
    save_file(state, str(target), metadata=metadata)  # no seal: refused in a run with an identity
    with pytest.raises(StoreCorruptionError, match="its digest was removed"):
        read()
    (run.path / "identity.json").unlink()  # a run written before identities and seals
    run = RunDirectory.open(run.path)
    assert torch.equal(read()["w"], state["w"])  # read as it is


def test_a_digest_removed_from_one_model_file_of_a_run_that_writes_them_is_refused(tmp_path):
    from fedunlearn.errors import StoreCorruptionError

    run = RunDirectory.create(tmp_path / "run", {})
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    run.save_model("model_initial", state)
    run.save_model("model_final", state)
    edited = {"w": state["w"] + 1}
    save_file(edited, str(run.path / "model_final.safetensors"))  # edited, digest stripped
    with pytest.raises(StoreCorruptionError, match="its digest was removed"):
        run.load_model("model_final")
    assert torch.equal(run.load_model("model_initial")["w"], state["w"])
