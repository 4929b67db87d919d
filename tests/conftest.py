"""Shared fixtures. Tests never touch the network; real datasets are used only when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

#: A local copy of the benchmark datasets (MNIST, Fashion-MNIST, Adult); `.ci/run` sets it.
DATA_ROOT = Path(os.environ.get("FEDUNLEARN_DATA_ROOT", "")).expanduser()

# Keep the suite reproducible and light on a 2-core CI machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def shared_data() -> Path:
    if not os.environ.get("FEDUNLEARN_DATA_ROOT") or not (DATA_ROOT / "MNIST" / "raw").is_dir():
        pytest.skip("benchmark data not found: set FEDUNLEARN_DATA_ROOT to a folder holding MNIST/")
    return DATA_ROOT


@pytest.fixture
def flower_task_identity():
    """Flower stamps each Message with the run and node it belongs to; outside a run, pretend one."""
    from flwr.supercore.task_identity import TaskIdentity

    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous


@pytest.fixture
def simulate():
    """:func:`simulate_in_process`, for the end-to-end tests."""
    return simulate_in_process


def simulate_in_process(
    overrides: dict, num_supernodes: int, server_app=None, client_mods=None
) -> None:
    """Run the ServerApp (or ``server_app``, a test's own) and ClientApp (with Flower mods
    ``client_mods``, e.g. a test's hostile client) with ``overrides`` in a Ray simulation of
    ``num_supernodes`` virtual clients (1 CPU each, 2 in all): the end-to-end tests' harness."""
    import warnings

    from flwr.simulation import run_simulation

    from clients.client_app import create_client_app
    from server.server_app import create_server_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(
            server_app=server_app or create_server_app(overrides),
            client_app=create_client_app(overrides, mods=client_mods),
            num_supernodes=num_supernodes,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": 2},
            },
        )
