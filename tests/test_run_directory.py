"""The run directory's checkpoint and metrics truncation, on which crash recovery relies."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from fedunlearn.errors import ConfigError
from fedunlearn.run_directory import RunDirectory


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
