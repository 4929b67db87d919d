"""Flower's Deployment Engine on loopback: a SuperLink behind the nginx proxy of the README's start
script, and 3 SuperNodes as separate processes, with TLS and SuperNode authentication, run a short
training and a FedEraser unlearning through ``flwr run``; a SuperNode whose key is not registered is
refused. 127.0.0.2 plays the server's public interface: SuperNodes reach the SuperLink only through
the proxy there, which forwards Fleet calls and nothing else, while the Control API answers on the
server's loopback (127.0.0.1) only. Every process started here, and every process those started, is
stopped, also when the test fails. The ServerApp's process is also killed mid-training once, and the
run resumed. Credentials and data roots have quotes, '$', spaces and backslashes in their paths.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pytest
from safetensors import SafetensorError, safe_open

from simulations.deploy.credentials import Credentials, write_credentials

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEPLOY = PROJECT_ROOT / "simulations" / "deploy"  # the start scripts the README documents


PROTOBUF = "application/protobuf"  # the Fleet and Control APIs' request body
PUBLIC = "127.0.0.2"  # the server's public interface, as SuperNodes on other machines see it
NASTY = "quote\" dollar$ $(x) tick' back\\slash"  # in every path this test hands over


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _wait_for_port(
    host: str, port: int, process: subprocess.Popen, log: Path, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"process exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if _listening(host, port):
            return
        time.sleep(0.2)
    pytest.fail(f"nothing listens on {host}:{port} after {timeout}s:\n{log.read_text()[-3000:]}")


def require_nginx() -> None:
    """The start script puts nginx in front of the SuperLink; CI installs it (.ci/run)."""
    if not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)):
        pytest.fail("nginx is needed for the deployment tests: apt-get install nginx")


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


class Server(NamedTuple):
    """The SuperLink's machine as the start script left it running."""

    script: subprocess.Popen
    log: Path
    public_port: int  # the proxy on PUBLIC: what other machines reach
    loopback_port: int  # the SuperLink itself on 127.0.0.1: Control, Runtime and Fleet APIs


def start_server(
    tmp_path: Path, processes: Processes, credentials: Credentials, *, state_file: bool = True
) -> Server:
    """Start the README's start_superlink.sh with the proxy on PUBLIC, and point ``flwr``'s
    connection ``server`` at the loopback Control API and ``public`` at the public listener;
    the SuperLink keeps its state in a file, or (``state_file=False``) in memory."""
    require_nginx()
    public_port, loopback_port = _free_port(PUBLIC), _free_port()
    home = Path(processes.env["FLWR_HOME"])
    home.mkdir(exist_ok=True)
    ca = json.dumps(str(credentials.ca_certificate))  # a TOML string: the path has quotes in it
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "server"\n'
        f'[superlink.server]\naddress = "127.0.0.1:{loopback_port}"\nroot-certificates = {ca}\n'
        f'[superlink.public]\naddress = "{PUBLIC}:{public_port}"\nroot-certificates = {ca}\n'
    )
    (tmp_path / "proxy-tmp").mkdir()
    state = [str(tmp_path / f"state {NASTY}.db")] if state_file else []
    script, log = processes.start(
        "superlink",
        ["bash", str(DEPLOY / "start_superlink.sh"), str(credentials.ca_certificate.parent),
         str(public_port), *state],
        PUBLIC_HOST=PUBLIC, SUPERLINK_PORT=str(loopback_port), TMPDIR=str(tmp_path / "proxy-tmp"),
    )  # fmt: skip
    _wait_for_port("127.0.0.1", loopback_port, script, log)
    _wait_for_port(PUBLIC, public_port, script, log)
    return Server(script, log, public_port, loopback_port)


def flwr(processes: Processes, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "flwr"), *arguments],
        env=processes.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def post(host: str, port: int, path: str, ca: Path) -> tuple[int, str]:
    """POST an empty protobuf request to ``path`` exactly as written (no client-side
    normalisation); returns the status and the ``Server`` header."""
    context = ssl.create_default_context(cafile=str(ca))
    connection = http.client.HTTPSConnection(host, port, context=context, timeout=30)
    try:
        connection.request("POST", path, body=b"", headers={"content-type": PROTOBUF})
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("server", "")
    finally:
        connection.close()


@pytest.mark.timeout(120)
def _checkpoint_round(run_path: Path) -> int:
    """The round of the run's checkpoint (written atomically), -1 while there is none."""
    path = run_path / "checkpoint.safetensors"
    if not path.is_file():
        return -1
    try:
        with safe_open(str(path), framework="pt") as handle:
            return int((handle.metadata() or {}).get("round", -1))
    except (OSError, ValueError, SafetensorError):  # replaced between the check and the read
        return -1


@pytest.mark.deployment
def test_the_public_listener_forwards_only_fleet_calls_and_stops_with_the_superlink(
    tmp_path, processes
):
    credentials = write_credentials(tmp_path / f"credentials {NASTY}", hosts=[PUBLIC], supernodes=1)
    server = start_server(tmp_path, processes, credentials)
    ca = credentials.ca_certificate
    # Routed by Flower from loopback; refused by nginx on the public listener, however spelled.
    assert post("127.0.0.1", server.loopback_port, "/v1/control/list-nodes", ca)[0] == 200
    for path in [
        "/v1/control/list-nodes",
        "/v1/control/register-node",
        "/v1/control/start-run",
        "/v1/runtime/pull-messages",
        "/v1/fleet/../control/list-nodes",
        "/v1/fleet/%2e%2e/control/list-nodes",
        "/v1/fleet/..%2fcontrol/list-nodes",
        "/v1/fleet/get-run/../../control/list-nodes",
        "//v1/control/list-nodes",
        "/v1/Fleet/../control/list-nodes",
        "/docs",
        "/openapi.json",
    ]:
        assert post(PUBLIC, server.public_port, path, ca) == (404, "nginx"), path
    # A Fleet call goes through to the SuperLink, whose node authentication answers it.
    assert post(PUBLIC, server.public_port, "/v1/fleet/register-node", ca)[0] == 401

    # The SuperLink stops: so do the proxy and the script, which removes the proxy's files.
    started = process_tree(server.script.pid)
    [superlink] = [pid for pid, args in started.items() if "bin/flower-superlink" in args]
    proxy = [pid for pid, args in started.items() if args.startswith("nginx: ")]
    assert len(proxy) == 2, started  # its master and its worker
    os.kill(superlink, signal.SIGTERM)
    status = server.script.wait(timeout=30)
    said = f"the SuperLink exited with status {status}; stopping the proxy"
    assert said in server.log.read_text()
    assert not _listening(PUBLIC, server.public_port)
    assert not [pid for pid in proxy if alive(pid)]
    assert list((tmp_path / "proxy-tmp").iterdir()) == []


@pytest.mark.deployment
@pytest.mark.timeout(420)
def test_a_deployed_federation_with_tls_and_auth_trains_unlearns_and_refuses_a_stranger(
    tmp_path, processes
):
    credentials = write_credentials(tmp_path / f"credentials {NASTY}", hosts=[PUBLIC], supernodes=4)
    server = start_server(tmp_path, processes, credentials)
    # The Control API is not reachable from other machines: registering the fourth key there fails.
    refused = flwr(processes, "supernode", "register", str(credentials.public_key(3)), "public")
    assert refused.returncode != 0 and "404 Not Found" in refused.stdout + refused.stderr
    assert flwr(processes, "ls", "public").returncode != 0
    for index in range(3):  # on the server machine it works; the fourth key stays unregistered
        registered = flwr(processes, "supernode", "register", str(credentials.public_key(index)))
        assert registered.returncode == 0, registered.stdout + registered.stderr

    def supernode(index: int, key: Path):
        data_root = tmp_path / f"machine-{index} {NASTY}"  # each SuperNode's own data folder
        data_root.mkdir(exist_ok=True)
        return processes.start(
            f"supernode-{index}",
            [
                "bash", str(DEPLOY / "start_supernode.sh"), f"{PUBLIC}:{server.public_port}",
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
        # 3 short rounds leave FedEraser flagged: without FedRetrain, auto would refuse it
        'unlearn-adopt = "federaser"\n'
    )
    flwr_run = [str(BIN / "flwr"), "run", str(PROJECT_ROOT), "server", "--stream", "--run-config"]
    first, first_log = processes.start("flwr-run-killed", [*flwr_run, str(run_config)])
    result = tmp_path / "runs" / "deployed"
    deadline = time.monotonic() + 180
    # Kill once round 1 is checkpointed: its metrics row is written just before the checkpoint,
    # so waiting for the row alone raced the kill against that write (resumed after round 0).
    while _checkpoint_round(result) < 1:
        assert time.monotonic() < deadline, first_log.read_text()[-3000:]
        time.sleep(0.1)
    serverapps = [
        pid for pid, args in process_tree(server.script.pid).items() if "flwr-serverapp" in args
    ]
    assert len(serverapps) == 1, process_tree(server.script.pid)
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
    # Every retained update is readable by the server's account only (the script's umask 077).
    written = [tmp_path / "runs", *(tmp_path / "runs").rglob("*")]
    assert not [p for p in written if stat.S_IMODE(p.stat().st_mode) & 0o077]
