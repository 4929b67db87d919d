"""The ServerApp checks everything it can before it writes anything."""

from __future__ import annotations

import json
from unittest.mock import Mock

import pytest
import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError, DatasetNotFoundError
from fedunlearn.store.durable_io import atomic_write_bytes
from fedunlearn.store.run_directory import RunDirectory
from server.training.original import train_federated


def _config(tmp_path, **values):
    values = {"num-clients": 10, "output-dir": str(tmp_path / "out"), **values}
    return ExperimentConfig.from_run_config(values)


def test_more_clients_than_samples(tmp_path):
    grid = Mock()
    with pytest.raises(ConfigError) as info:
        train_federated(grid, _config(tmp_path, **{"num-clients": 5000}), log=lambda _: None)
    assert info.value.parameter == "num-clients" and "5000" in str(info.value)
    assert not grid.method_calls and not (tmp_path / "out").exists()


def test_data_root_without_the_dataset_names_the_expected_path(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    grid = Mock()
    with pytest.raises(DatasetNotFoundError) as info:
        train_federated(
            grid, _config(tmp_path, dataset="mnist", **{"data-root": str(root)}), log=print
        )
    assert str(root / "MNIST") in str(info.value)
    assert not grid.method_calls and not (tmp_path / "out").exists()


def test_dirichlet_that_cannot_give_every_client_data(tmp_path):
    values = {"partitioning": "dirichlet", "alpha": 0.001, "num-clients": 600}
    with pytest.raises(ConfigError) as info:
        train_federated(Mock(), _config(tmp_path, **values), log=print)
    assert info.value.parameter in ("alpha", "num-clients")
    assert not (tmp_path / "out").exists()


def test_an_existing_run_is_never_overwritten(tmp_path):
    run = RunDirectory.create(tmp_path / "r", {"a": 1})
    run.write_json("summary.json", {"x": 1})
    with pytest.raises(ConfigError, match="already exists and is not empty.*resume=true"):
        RunDirectory.create(tmp_path / "r", {"a": 2})
    assert (tmp_path / "r" / "config.json").read_text().strip().endswith("}")
    assert '"a": 1' in (tmp_path / "r" / "config.json").read_text()


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"old")

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr("fedunlearn.store.run_directory.os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_cohort_the_federation_cannot_supply_stops_the_server_before_training(tmp_path):
    from flwr.app import Context, RecordDict

    from server.server_app import create_server_app

    app = create_server_app({"output-dir": str(tmp_path / "out"), "unlearn-clients": ""})
    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={"num-clients": 10, "scrub": True, "scrub-forget": "samples:0:500:5"},
    )
    grid = Mock()
    with pytest.raises(ConfigError) as info:
        app._main(grid, context)
    assert info.value.parameter == "scrub-forget" and "at most" in str(info.value)
    assert not grid.method_calls and not (tmp_path / "out").exists()


def test_a_supernode_reads_its_data_from_its_own_data_root(tmp_path):
    from flwr.app import Context, RecordDict

    from clients.client_state import client_setup

    def context(node_config):
        return Context(
            run_id=1,
            node_id=7,
            node_config={"partition-id": 1, "num-partitions": 4, **node_config},
            state=RecordDict(),
            run_config={"num-clients": 4},
        )

    setup = client_setup(context({}))
    assert setup.partition_id == 1 and len(setup.data.y) > 0
    missing = tmp_path / "no-such-root"
    with pytest.raises(ConfigError) as info:  # the node's own folder is the one used
        client_setup(context({"data-root": str(missing)}))
    assert info.value.parameter == "data-root" and str(missing) in str(info.value)


@pytest.mark.parametrize(("key", "value"), [("rounds", 7), ("seed", 3), ("retain-interval", 1)])
def test_resuming_with_other_training_settings_is_refused_before_any_client_is_asked(
    tmp_path, key, value
):
    started = _config(tmp_path, **{"run-name": "r", "rounds": 5})
    RunDirectory.create(started.run_directory(), started.to_run_config())
    grid = Mock()
    resumed = _config(tmp_path, **{"run-name": "r", "rounds": 5, "resume": True, key: value})
    with pytest.raises(ConfigError) as info:
        train_federated(grid, resumed, log=lambda _: None)
    assert info.value.parameter == key
    assert f"the value {started.run_directory()} was started with" in str(info.value)
    assert not grid.method_calls
    assert sorted(p.name for p in started.run_directory().iterdir()) == [
        "config.json",
        "identity.json",
    ]


def _server_main(tmp_path, run_config):
    """Run the ServerApp's main on a Mock grid; returns the grid (to check nobody was asked). K is
    set, as the launcher sets it: with num-clients = 0 the server first asks the federation's
    size (read-only), then checks what needs K."""
    from flwr.app import Context, RecordDict

    from server.server_app import create_server_app

    app = create_server_app({"num-clients": 10, "output-dir": str(tmp_path / "out")})
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    grid = Mock()
    try:
        app._main(grid, context)
    finally:
        assert not grid.method_calls


@pytest.mark.parametrize(
    ("run_config", "key"),
    [
        ({"run-name": "party-\U0001f389"}, "run-name"),
        ({"certified-head": True, "certified-removals": 5000}, "certified-removals"),
        ({"scrub": True, "scrub-forget": "class:99"}, "scrub-forget"),
        ({"model": "mnist-cnn"}, "model"),
        ({"seed": 2**32}, "seed"),
    ],
)
def test_the_server_refuses_what_the_launcher_refuses_before_asking_anyone(
    tmp_path, run_config, key
):
    with pytest.raises(ConfigError) as info:
        _server_main(tmp_path, run_config)
    assert info.value.parameter == key
    assert not (tmp_path / "out").exists()


def test_the_server_refuses_an_occupied_run_directory_before_asking_anyone(tmp_path):
    (tmp_path / "out" / "r1").mkdir(parents=True)
    (tmp_path / "out" / "r1" / "metrics.csv").write_text("round\n")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        _server_main(tmp_path, {"run-name": "r1"})
    assert [p.name for p in (tmp_path / "out" / "r1").iterdir()] == ["metrics.csv"]


def test_the_server_refuses_to_forget_a_client_twice_before_asking_anyone(tmp_path):
    trained = _config(tmp_path, **{"run-name": "done", "num-clients": 4})
    run = RunDirectory.create(trained.run_directory(), trained.to_run_config())
    for name in ("model_initial", "model_final"):
        run.save_model(name, {"w": torch.zeros(1)})
    run.write_json("summary.json", {})
    run.append_metrics({"round": 0})
    run.append_log("unlearning_log.jsonl", {"targets": [2]})
    run.append_log("history_log.jsonl", {"request": 1, "targets": [2]})  # finished and adopted
    files = {p.name: p.read_bytes() for p in run.path.iterdir()}
    request = {"run-name": "done", "num-clients": 4, "unlearn-only": True, "unlearn-clients": "2"}
    with pytest.raises(ConfigError, match="already were") as info:
        _server_main(tmp_path, request)
    assert info.value.parameter == "unlearn-clients"
    assert {p.name: p.read_bytes() for p in run.path.iterdir()} == files
    assert json.loads((run.path / "config.json").read_text())["num-clients"] == 4
