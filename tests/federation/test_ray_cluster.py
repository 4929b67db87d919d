"""An existing multi-node Ray cluster: Flower's Simulation Engine attaches to a Ray that is already
running (its backend calls ``ray.init`` only when Ray is not initialised), so the main job runs on
every node of the cluster. Two Ray nodes of one CPU each on this machine
(``ray.cluster_utils.Cluster``, each node its own raylet and resources): the clients' training runs
on both, and every model equals, bit for bit, the same job's run in this process without Ray (the
suite's federation, ``tests/federation_grid.py``; docs/scale.md)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import ray
from federation_grid import serve_in_process
from ray.cluster_utils import Cluster
from safetensors.torch import load_file

from simulations import run as runner

SCALE = Path(__file__).resolve().parents[2] / "docs" / "scale.md"


def record_ray_node(path):
    """A Flower mod: appends the Ray node id its ClientApp runs on to ``path`` for each training
    message (the actor's node, as Ray placed it)."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train":
            with open(path, "a") as out:
                out.write(ray.get_runtime_context().get_node_id() + "\n")
        return reply

    return mod


def _models(run_dir) -> dict[str, dict]:
    return {p.name: load_file(p) for p in sorted(run_dir.glob("model_*.safetensors"))}


@pytest.mark.ray
def test_the_main_job_runs_on_both_nodes_of_a_ray_cluster_and_equals_one_node(
    tmp_path, simulate_ray
):
    overrides = {
        "num-clients": 4,
        "rounds": 2,
        "local-epochs": 1,
        "output-dir": str(tmp_path),
        "run-name": "two-nodes",
        "node-wait-seconds": 60,
    }
    nodes = tmp_path / "ray-nodes.txt"
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        pythonpath = os.pathsep.join(sys.path)  # the actors import the apps as this process does
        ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        simulate_ray(overrides, num_supernodes=4, client_mods=[record_ray_node(nodes)])
    finally:
        ray.shutdown()
        cluster.shutdown()
    placed = nodes.read_text().split()
    assert len(placed) >= 4 * 2 and len(set(placed)) == 2  # training ran on both Ray nodes
    # the same job in this process, without Ray (the suite's federation): the placement of the
    # clients' training changes no bit of any model
    serve_in_process({**overrides, "run-name": "one-node"}, num_supernodes=4)
    two, one = _models(tmp_path / "two-nodes"), _models(tmp_path / "one-node")
    assert set(two) == set(one) and "model_final.safetensors" in two
    for name, state in two.items():
        assert all(state[k].equal(one[name][k]) for k in state), name


def _recipe() -> list[str]:
    """The shell lines of docs/scale.md's multi-node Ray section, comments dropped."""
    section = SCALE.read_text().split("## An existing multi-node Ray cluster", 1)[1]
    section = section.split("\n## ", 1)[0]  # up to the next section
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def test_the_recipes_ray_start_lines_are_what_ray_start_accepts():
    from ray.scripts.scripts import start  # Ray's own click command, parsed without running it

    head, worker = [shlex.split(line)[2:] for line in _recipe() if line.startswith("ray start")]
    head_options = start.make_context("start", head).params
    worker_options = start.make_context("start", worker).params
    assert head_options["head"] and not worker_options["head"]
    exported = next(line for line in _recipe() if line.startswith("export RAY_ADDRESS="))
    assert worker_options["address"] == exported.split("=", 1)[1]
    assert worker_options["address"].endswith(f":{head_options['port']}")


def test_the_recipes_run_passes_flower_no_ray_init_arguments(tmp_path, capsys, monkeypatch):
    # Ray refuses num_cpus / num_gpus when it connects to a running cluster
    (command,) = [line for line in _recipe() if line.startswith("fedunlearn-run")]
    monkeypatch.chdir(SCALE.parents[1])
    argv = [*shlex.split(command)[1:], "--output-dir", str(tmp_path), "--dry-run"]
    assert runner.main(argv) == 0
    printed = capsys.readouterr().out
    assert "flwr run" in printed and "num-supernodes=40" in printed
    assert "init-args" not in printed
