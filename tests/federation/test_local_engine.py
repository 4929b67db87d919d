"""The local engine (``fedunlearn-run --engine local``, :mod:`simulations.local_engine`): the real
ServerApp and ClientApp without a SuperLink or Ray. Its worker processes give every model the
in-process federation gives, bit for bit (and that one equals a Ray run's:
``test_warm_ray.py``); a node keeps its state from one message to the next; a message to no node,
a ClientApp that raised and a worker that died each get an error reply, never a wait or a hang;
no worker outlives its engine; the launcher's exit status is the run's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from federation_grid import SMALL_RUN, run_models, serve_in_process
from flwr.app import ConfigRecord, Message, RecordDict

from simulations import local_engine
from simulations.local_engine import FIRST_NODE, LocalGrid, flower_task_identity, serve_locally

REPOSITORY = Path(__file__).resolve().parents[2]


def test_worker_processes_give_the_models_of_the_in_process_federation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {}
    for name, workers in (("workers", 2), ("in-process", 0)):
        overrides = {**SMALL_RUN, "output-dir": str(tmp_path), "run-name": name}
        if workers:
            serve_locally(REPOSITORY, overrides, 3, workers)
        else:
            serve_in_process(overrides, 3)
        runs[name] = run_models(tmp_path / name)
    assert set(runs["workers"]) == set(runs["in-process"]) and runs["workers"]
    assert "model_federaser.safetensors" in runs["workers"]
    for file, tensors in runs["workers"].items():
        other = runs["in-process"][file]
        assert tensors.keys() == other.keys()
        for key, tensor in tensors.items():
            assert tensor.dtype == other[key].dtype
            assert tensor.equal(other[key]), f"{file}:{key} differs"


# A Flower App of the test's own: its ClientApp counts the messages each node got (in the node's
# Context state), raises when asked to and kills its process when asked to.
APP_MODULE = """
import os
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(message, context):
    action = message.content["q"]["action"]
    if action == "die":
        os._exit(3)
    if action == "raise":
        raise RuntimeError("asked to raise")
    seen = context.state.config_records.get("seen", ConfigRecord({"n": 0}))
    seen["n"] = int(seen["n"]) + 1
    context.state.config_records["seen"] = seen
    reply = {
        "n": seen["n"],
        "partition": int(context.node_config["partition-id"]),
        "pid": os.getpid(),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
    }
    return Message(RecordDict({"reply": ConfigRecord(reply)}), reply_to=message)
"""


@pytest.fixture()
def probe_app(tmp_path):
    app = tmp_path / "probe_app"
    app.mkdir()
    (app / "probe_clientapp.py").write_text(APP_MODULE)
    (app / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [project]
            name = "probe"
            version = "1.0.0"

            [tool.flwr.app]
            publisher = "tests"

            [tool.flwr.app.components]
            serverapp = "probe_clientapp:app"
            clientapp = "probe_clientapp:app"

            [tool.flwr.app.config]
            """
        )
    )
    return app


def _query(node: int, action: str = "count") -> Message:
    content = RecordDict({"q": ConfigRecord({"action": action})})
    return Message(content, dst_node_id=node, message_type="query")


def _replies(grid: LocalGrid, messages: list[Message], timeout: float = 60) -> dict[str, Message]:
    sent = dict(zip(grid.push_messages(messages), messages, strict=True))
    replies: dict[str, Message] = {}
    deadline = time.monotonic() + timeout
    while len(replies) < len(sent) and time.monotonic() < deadline:
        for reply in grid.pull_messages(set(sent) - set(replies)):
            replies[reply.metadata.reply_to_message_id] = reply
        time.sleep(0.02)
    assert len(replies) == len(sent), "a message got no reply"
    return replies


@pytest.mark.parametrize("workers", [0, 2])
def test_a_node_keeps_its_state_and_partition_on_its_worker(probe_app, workers):
    with flower_task_identity(), LocalGrid({}, 4, workers, app_dir=probe_app) as grid:
        assert grid.get_node_ids() == [FIRST_NODE + k for k in range(4)]
        pids = {}
        for expected in (1, 2, 3):
            messages = [_query(node) for node in grid.get_node_ids()]
            replies = _replies(grid, messages)
            for reply in replies.values():
                record = reply.content["reply"]
                node = reply.metadata.src_node_id
                assert record["n"] == expected  # the node's own Context, kept
                assert record["partition"] == node - FIRST_NODE
                pids.setdefault(node, set()).add(record["pid"])
        assert all(len(p) == 1 for p in pids.values())  # a node never changes worker
        if workers:
            assert len(set().union(*pids.values())) == 2 and os.getpid() not in pids[FIRST_NODE]
            # a client without a GPU share sees no GPU, as in Flower's simulation
            assert {r.content["reply"]["cuda"] for r in replies.values()} == {""}


@pytest.mark.parametrize("workers", [0, 2])
def test_no_node_and_a_raising_client_app_get_error_replies(probe_app, workers):
    with flower_task_identity(), LocalGrid({}, 2, workers, app_dir=probe_app) as grid:
        replies = _replies(grid, [_query(99), _query(FIRST_NODE, "raise")])
        errors = sorted(reply.error.reason for reply in replies.values())
        assert all(reply.has_error() for reply in replies.values())
        assert "no node 99 in this federation" in errors[1] or "no node 99" in errors[0]
        assert any("asked to raise" in e for e in errors), errors


def test_a_worker_that_died_answers_with_an_error_and_the_other_worker_goes_on(probe_app):
    with flower_task_identity(), LocalGrid({}, 2, 2, app_dir=probe_app) as grid:
        died = _replies(grid, [_query(FIRST_NODE, "die")])
        (reply,) = died.values()
        assert reply.has_error() and "local worker 0 died (exit code 3)" in reply.error.reason
        alive = _replies(grid, [_query(FIRST_NODE + 1)])
        assert not next(iter(alive.values())).has_error()
        # send_and_receive does not wait out its timeout for a dead worker's reply
        started = time.monotonic()
        (again,) = grid.send_and_receive([_query(FIRST_NODE)], timeout=120)
        assert again.has_error() and time.monotonic() - started < 30


def test_bad_sizes_are_refused_naming_the_parameter(probe_app):
    with pytest.raises(ValueError, match="num_nodes: 0"):
        LocalGrid({}, 0, app_dir=probe_app)
    with pytest.raises(ValueError, match="workers: -1"):
        LocalGrid({}, 2, -1, app_dir=probe_app)
    with pytest.raises(ValueError, match="num_cpus: 0"):
        local_engine.worker_count(0, 4)
    assert local_engine.worker_count(1, 10, cpus=2) == 2
    assert local_engine.worker_count(1, 1, cpus=8) == 1  # never more workers than nodes
    assert local_engine.worker_count(4, 10, cpus=2) == 1


def test_the_gpus_are_found_without_starting_cuda(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia10"):
        (tmp_path / name).touch()
    assert local_engine.visible_gpus({}, tmp_path) == ["0", "1", "10"]
    assert local_engine.visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"}, tmp_path) == ["2", "3"]
    assert local_engine.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == []
    assert local_engine.worker_count(1, 10, cpus=16, num_gpus=0.25, gpus=1) == 4  # as Ray fits
    assert local_engine.worker_count(1, 10, cpus=2, num_gpus=0.25, gpus=1) == 2
    with pytest.raises(ValueError, match="num_gpus: 0.5; allowed: 0 on a machine without"):
        local_engine.worker_count(1, 10, num_gpus=0.5, gpus=0)
    with pytest.raises(ValueError, match="num_gpus: 2"):
        local_engine.worker_count(1, 10, num_gpus=2)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_worker_outlives_a_killed_engine(probe_app):
    # an engine killed outright (no chance to stop its workers): they notice and leave
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPOSITORY)!r})
        from simulations.local_engine import LocalGrid
        grid = LocalGrid({{}}, 2, 2, app_dir={str(probe_app)!r})
        print(" ".join(str(p.pid) for p in grid._processes), flush=True)
        time.sleep(600)
        """
    )
    engine = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in engine.stdout.readline().split()]
    assert len(workers) == 2
    engine.kill()
    engine.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)


def test_spawned_workers_serve_as_forked_ones_do(probe_app, monkeypatch):
    # a GPU machine, or a platform without fork: the workers are fresh interpreters
    monkeypatch.setattr(local_engine, "fork_is_safe", lambda: False)
    with flower_task_identity(), LocalGrid({}, 3, 2, app_dir=probe_app) as grid:
        assert {p._start_method for p in grid._processes} == {"spawn"}
        for expected in (1, 2):
            replies = _replies(grid, [_query(node) for node in grid.get_node_ids()])
            records = [reply.content["reply"] for reply in replies.values()]
            assert sorted(r["partition"] for r in records) == [0, 1, 2]
            assert {r["n"] for r in records} == {expected} and {r["cuda"] for r in records} == {""}
