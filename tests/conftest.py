"""Shared fixtures. Tests never touch the network; real datasets are used only when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

#: The tiers' guard (a test that starts Ray or a deployment carries its marker, and those tests run
#: on one xdist worker) and Pytester, with which the guard's own test runs planted tests.
pytest_plugins = ("tier_guard", "pytester")

#: A local copy of the benchmark datasets (MNIST, Fashion-MNIST, Adult); `.ci/run` sets it.
DATA_ROOT = Path(os.environ.get("FEDUNLEARN_DATA_ROOT", "")).expanduser()

# Keep the suite reproducible and light on a 2-core CI machine: under pytest-xdist every worker
# gets one thread (the workers are the parallelism), else up to two.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(1 if _WORKERS > 1 else max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def shared_data() -> Path:
    if not os.environ.get("FEDUNLEARN_DATA_ROOT") or not (DATA_ROOT / "MNIST" / "raw").is_dir():
        pytest.skip("benchmark data not found: set FEDUNLEARN_DATA_ROOT to a folder holding MNIST/")
    return DATA_ROOT


@pytest.fixture
def flower_task_identity():
    """Flower stamps each Message with the run and node it belongs to; outside a run, pretend one."""
    from federation_grid import flower_task_identity

    with flower_task_identity():
        yield


@pytest.fixture
def simulate():
    """:func:`federation_grid.serve_in_process`: the end-to-end tests' federation, the real
    ServerApp and ClientApp in this process, without Ray."""
    from federation_grid import serve_in_process

    return serve_in_process


@pytest.fixture
def simulate_ray():
    """:func:`simulate_in_process`: a Ray simulation, for the tests of Flower's simulation engine
    itself (they carry ``@pytest.mark.ray``)."""
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


#: The shared finished run: digits, 4 clients, 2 rounds, client 1 forgotten by FedEraser, FedAccum
#: and FedRetrain, a certified head with 3 removals; trained under the usual umask 0o022.
FINISHED_RUN = {
    "num-clients": 4,
    "rounds": 2,
    "local-epochs": 1,
    "retain-interval": 1,
    "run-name": "finished",
    "node-wait-seconds": 60,
    "unlearn-clients": "1",
    "unlearn-methods": "federaser,fedaccum,fedretrain",
    "certified-head": True,
    "certified-removals": 3,
    "certified-eval-every": 2,
}


def _tree_digest(root: Path) -> dict[str, tuple[int, str]]:
    """Each path under ``root``: its mode and its bytes' SHA-256 (folders: their mode only)."""
    import hashlib

    return {
        str(path.relative_to(root)): (
            path.lstat().st_mode,
            "" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest(),
        )
        for path in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="session")
def _finished_run_built(tmp_path_factory) -> tuple[Path, dict]:
    """:data:`FINISHED_RUN`, trained once per test run: the first xdist worker (or the only
    process) trains it under a lock in the workers' shared temporary folder, the others wait and
    read it."""
    import fcntl

    from federation_grid import serve_in_process

    base = tmp_path_factory.getbasetemp()  # under xdist: this session's folder / the worker's
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    runs = shared / "finished-run"
    with open(shared / "finished-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (runs / "done").is_file():
            previous = os.umask(0o022)
            try:
                serve_in_process({**FINISHED_RUN, "output-dir": str(runs)}, num_supernodes=4)
            finally:
                os.umask(previous)
            (runs / "done").write_text("trained\n")
    run = runs / FINISHED_RUN["run-name"]
    return run, _tree_digest(run)


@pytest.fixture
def finished_run(_finished_run_built) -> Path:
    """The shared finished run's folder, for tests that only read a run; a test that changed any
    byte, mode or file of it fails at teardown (copy it to ``tmp_path`` to change it)."""
    run, digest = _finished_run_built
    yield run
    assert _tree_digest(run) == digest, f"a test changed the shared finished run {run}"
