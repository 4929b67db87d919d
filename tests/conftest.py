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
