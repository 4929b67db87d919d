"""Flower's Deployment Engine on loopback: a SuperLink and 3 SuperNodes as separate processes, with
TLS and SuperNode authentication (started by the README's scripts), run a short training and a FedEraser unlearning through
``flwr run``; a SuperNode whose key is not registered is refused. Every process started here, and
every process those started, is stopped, also when the test fails. The ServerApp's process is also
killed mid-training once, and the run resumed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from simulations.deploy.credentials import write_credentials

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEPLOY = PROJECT_ROOT / "simulations" / "deploy"  # the start scripts the README documents


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"process exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"nothing listens on port {port} after {timeout}s:\n{log.read_text()[-3000:]}")


def process_tree(pid: int) -> dict[int, str]:
    """The live descendants of ``pid`` (pid -> command line), across process groups and sessions:
    Flower's SuperExec starts the ServerApp and ClientApps in sessions of their own."""
    table = subprocess.run(
        ["ps", "-A", "-ww", "-o", "pid=,ppid=,stat=,args="], capture_output=True, text=True
    ).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in table.splitlines():
        child, parent, state, *args = line.split(None, 3)
        if not state.startswith("Z"):  # a zombie is dead already, only not reaped
            children.setdefault(int(parent), []).append((int(child), " ".join(args)))
    found, pending = {}, [pid]
    while pending:
        for child, args in children.get(pending.pop(), []):
            found[child] = args
            pending.append(child)
    return found


class Processes:
    """Starts commands in their own process groups; :meth:`stop_all` ends every group and every
    process descended from them."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory, self.env = directory, env
        self.started: list[subprocess.Popen] = []
        self.descendants: set[int] = set()

    def start(self, name: str, command: list[str], **env: str) -> tuple[subprocess.Popen, Path]:
        log = self.directory / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **env},
                start_new_session=True,
            )
        self.started.append(process)
        return process, log

    def stop_all(self) -> None:
        # Collected first: once a parent is gone its children are re-parented and untraceable.
        for process in self.started:
            self.descendants |= set(process_tree(process.pid))
        for process in self.started:
            with_group(process.pid, signal.SIGTERM)
        for pid in self.descendants:
            with_pid(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in self.started:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            with_group(process.pid, signal.SIGKILL)
            process.wait()
        for pid in self.descendants:
            with_pid(pid, signal.SIGKILL)


def with_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def with_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return bool(state.stdout.strip()) and not state.stdout.strip().startswith("Z")


@pytest.fixture
def processes(tmp_path):
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(tmp_path / "flwr-home"),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    (tmp_path / "logs").mkdir()
    started = Processes(tmp_path / "logs", env)
    yield started
    started.stop_all()
    for process in started.started:  # every process we started is gone ...
        assert process.poll() is not None
    time.sleep(0.5)
    assert not [pid for pid in started.descendants if alive(pid)]  # ... and all they started


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_deployed_federation_with_tls_and_auth_trains_unlearns_and_refuses_a_stranger(
    tmp_path, processes
):
    credentials = write_credentials(
        tmp_path / "credentials", hosts=["localhost", "127.0.0.1"], supernodes=4
    )
    port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "test"\n[superlink.test]\n'
        f'address = "127.0.0.1:{port}"\nroot-certificates = "{credentials.ca_certificate}"\n'
    )
    superlink, superlink_log = processes.start(
        "superlink",
        [
            "bash",
            str(DEPLOY / "start_superlink.sh"),
            str(credentials.ca_certificate.parent),
            str(port),
        ],
        SUPERLINK_HOST="127.0.0.1",
    )
    _wait_for_port(port, superlink, superlink_log)
    for index in range(3):  # the fourth key stays unregistered
        registered = subprocess.run(
            [str(BIN / "flwr"), "supernode", "register", str(credentials.public_key(index))],
            env=processes.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stdout + registered.stderr

    def supernode(index: int, key: Path):
        data_root = tmp_path / f"machine-{index}-data"  # each SuperNode's own data folder
        data_root.mkdir(exist_ok=True)
        return processes.start(
            f"supernode-{index}",
            [
                "bash", str(DEPLOY / "start_supernode.sh"), f"127.0.0.1:{port}",
                str(credentials.ca_certificate), str(key), str(index), "3", str(data_root),
            ],
            SUPERNODE_PORT=str(_free_port()),
        )  # fmt: skip

    nodes = [supernode(i, credentials.supernode_keys[i]) for i in range(3)]
    stranger, stranger_log = supernode(0, credentials.supernode_keys[3])
    assert stranger.wait(timeout=90) != 0  # refused before it could receive anything
    assert "Failed to activate SuperNode" in stranger_log.read_text()

    # The ServerApp's process is killed after round 1; `flwr run` with resume=true continues the
    # training and then unlearns.
    run_config = tmp_path / "run-config.toml"
    run_config.write_text(
        "num-clients = 3\nrounds = 3\nlocal-epochs = 1\nretain-interval = 1\n"
        f'output-dir = "{tmp_path / "runs"}"\nrun-name = "deployed"\n'
        'unlearn-clients = "1"\nunlearn-methods = "federaser"\nnode-wait-seconds = 90\n'
    )
    flwr_run = [str(BIN / "flwr"), "run", str(PROJECT_ROOT), "test", "--stream", "--run-config"]
    first, first_log = processes.start("flwr-run-killed", [*flwr_run, str(run_config)])
    result = tmp_path / "runs" / "deployed"
    deadline = time.monotonic() + 180
    while not (result / "metrics.csv").is_file() or len(pd.read_csv(result / "metrics.csv")) < 2:
        assert time.monotonic() < deadline, first_log.read_text()[-3000:]
        time.sleep(0.1)
    serverapps = [
        pid for pid, args in process_tree(superlink.pid).items() if "flwr-serverapp" in args
    ]
    assert len(serverapps) == 1, process_tree(superlink.pid)
    processes.descendants.add(serverapps[0])
    os.kill(serverapps[0], signal.SIGKILL)
    with_group(first.pid, signal.SIGKILL)  # its log stream has nothing more to show
    first.wait()
    assert not (result / "model_final.safetensors").exists()

    run_config.write_text(run_config.read_text() + "resume = true\n")
    run = subprocess.run(
        [*flwr_run, str(run_config)], env=processes.env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "resuming" in run.stdout, run.stdout[-4000:]
    for node, log in nodes:
        assert node.poll() is None, log.read_text()[-2000:]  # still serving

    metrics = pd.read_csv(result / "metrics.csv")
    assert list(metrics["round"]) == [0, 1, 2, 3]  # each round once, across the kill
    summary = json.loads((result / "summary.json").read_text())
    assert sorted(summary["partition_sizes"]) == ["0", "1", "2"]
    assert summary["retained_rounds"] == [1, 2, 3]
    [recovery] = [json.loads(line) for line in (result / "recovery_log.jsonl").open()]
    assert recovery["resumed_after_round"] >= 1 and recovery["store_problems"] == []
    unlearning = pd.read_csv(result / "unlearning.csv").set_index("method")
    assert "federaser" in unlearning.index
    assert (result / "model_federaser.safetensors").is_file()
    stored = [p.name for p in (result / "store" / "blobs").rglob("*.safetensors")]
    assert stored and "client_000001.safetensors" not in stored  # the forgotten client's updates
