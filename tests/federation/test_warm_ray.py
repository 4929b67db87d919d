"""One Ray for many runs: with ``RAY_ADDRESS`` naming a Ray that is already running, every run of
Flower's Simulation Engine attaches to it (its backend's ``ray.init`` connects instead of starting a
Ray; its ``ray.shutdown`` at the end disconnects, leaving that Ray up for the next run). Two runs
of the main job one after the other on one running Ray: both run their clients there, the Ray
outlives them, and every model equals, bit for bit, the same job run in this process without Ray
(docs/scale.md, "Start-up: one SuperLink and one Ray for many runs")."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import ray
from federation_grid import SMALL_RUN, run_models, serve_in_process
from ray.cluster_utils import Cluster
from test_ray_cluster import record_ray_node


def _run_on_running_ray(overrides: dict, nodes_file) -> None:
    """The apps in Flower's Simulation Engine, with no Ray arguments of their own (Ray refuses
    ``num_cpus`` when it connects to a running one): it attaches to ``RAY_ADDRESS``'s."""
    from flwr.simulation import run_simulation

    from clients.client_app import create_client_app
    from server.server_app import create_server_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(
            server_app=create_server_app(overrides),
            client_app=create_client_app(overrides, mods=[record_ray_node(nodes_file)]),
            num_supernodes=overrides["num-clients"],
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )


@pytest.mark.ray
def test_two_runs_on_one_running_ray_use_it_and_equal_a_run_without_ray(tmp_path, monkeypatch):
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))  # the actors import the apps
    head = cluster.head_node.node_id
    try:
        for name in ("first", "second"):
            overrides = {**SMALL_RUN, "output-dir": str(tmp_path), "run-name": name}
            _run_on_running_ray(overrides, tmp_path / f"{name}-nodes.txt")
            assert not ray.is_initialized()  # the run disconnected ...
            assert cluster.head_node.dead_processes() == []  # ... and left the Ray running
    finally:
        ray.shutdown()
        cluster.shutdown()
    for name in ("first", "second"):  # each run's clients trained on that Ray's node
        assert set((tmp_path / f"{name}-nodes.txt").read_text().split()) == {head}
    serve_in_process({**SMALL_RUN, "output-dir": str(tmp_path), "run-name": "alone"}, 3)
    alone = run_models(tmp_path / "alone")
    assert "model_final.safetensors" in alone and "model_federaser.safetensors" in alone
    for name in ("first", "second"):
        models = run_models(tmp_path / name)
        assert set(models) == set(alone)
        for file, state in models.items():
            assert all(state[k].equal(alone[file][k]) for k in state), (name, file)
