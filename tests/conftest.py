"""Shared fixtures. Tests never touch the network; real datasets are used only when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# Keep the suite reproducible and light on a 2-core CI machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "MNIST" / "raw").is_dir():
        pytest.skip(f"benchmark data not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def flower_task_identity():
    """Flower stamps each Message with the run and node it belongs to; outside a run, pretend one."""
    from flwr.supercore.task_identity import TaskIdentity

    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous
