"""End to end, in process: a few virtual clients train on digits and the retained rounds land on disk.

Through the suite's Ray-free federation (``simulate``: the real ServerApp and ClientApp in this
process), and once through Flower's Simulation Engine on Ray (``simulate_ray``, marked ``ray``:
``run_simulation`` is deprecated in Flower but still the in-process way to run a Ray simulation
inside a test; product code runs under ``flwr run``).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from fedunlearn.errors import ConfigError
from fedunlearn.store.update_store import UpdateStore


def test_digits_four_clients_two_rounds_learns_and_retains(tmp_path, simulate):
    overrides = {
        "num-clients": 4,
        "rounds": 2,
        "local-epochs": 2,
        "retain-interval": 1,
        "output-dir": str(tmp_path),
        "run-name": "e2e",
        "node-wait-seconds": 60,
        "unlearn-clients": "",  # training and retention only; unlearning has its own test
    }
    simulate(overrides, num_supernodes=4)

    run_dir = tmp_path / "e2e"
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert list(metrics["round"]) == [0, 1, 2]
    assert metrics["test_accuracy"].iloc[-1] > 0.5  # chance is 0.1 on ten digits
    assert list(metrics["clients_replied"].iloc[1:]) == [4, 4]

    store = UpdateStore(run_dir / "store")
    assert store.rounds() == [1, 2]
    assert [store.clients(t) for t in (1, 2)] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    sizes = store.num_examples(1)
    assert sum(sizes.values()) == 1347 and max(sizes.values()) - min(sizes.values()) <= 1

    # Round 1's global model is the saved initial model M^1; the final model is on disk too.
    m1 = load_file(str(run_dir / "model_initial.safetensors"))
    stored = store.read_global(1)
    assert all(torch.equal(m1[k], stored[k]) for k in m1)
    assert (run_dir / "model_final.safetensors").is_file()
    assert (run_dir / "training.png").stat().st_size > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["retained_rounds"] == [1, 2]


@pytest.mark.ray
def test_without_num_clients_the_app_adopts_the_federation_size_and_runs_the_main_job(
    tmp_path, simulate_ray, capfd
):
    """``flwr run . --stream`` on Flower's default federation (2 SuperNodes): no num-clients set,
    so the app adopts 2, trains, forgets client 0 and prints the comparison."""
    overrides = {
        "rounds": 2,
        "local-epochs": 1,
        "retain-interval": 1,
        "unlearn-methods": "federaser,fedretrain",
        "output-dir": str(tmp_path),
        "run-name": "adopted",
        "node-wait-seconds": 60,
    }
    simulate_ray(overrides, num_supernodes=2)

    out = capfd.readouterr().out
    assert "num-clients not set (0): adopting the federation's size, 2 SuperNode(s)" in out
    assert "now checking what needs it: every client gets data" in out  # named, then checked
    assert "unlearning results (every column: unlearning.csv):" in out and "| federaser" in out
    run_dir = tmp_path / "adopted"
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["num-clients"] == 2  # the run is recorded with the adopted K
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert list(metrics["clients_replied"].iloc[1:]) == [2, 2]
    table = pd.read_csv(run_dir / "unlearning.csv")
    assert table["method"].tolist() == ["fedavg", "federaser", "fedretrain"]


def test_federation_smaller_than_num_clients_fails_before_writing(tmp_path, simulate):
    overrides = {
        "num-clients": 4,
        "rounds": 1,
        "output-dir": str(tmp_path / "out"),
        "node-wait-seconds": 60,
    }
    with pytest.raises(ConfigError) as info:
        simulate(overrides, num_supernodes=3)
    assert info.value.parameter == "num-clients" and "num-supernodes=4" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_finished_run_can_be_reopened_to_forget_a_client_and_not_twice(tmp_path, simulate):
    common = {
        "num-clients": 3,
        "rounds": 2,
        "local-epochs": 1,
        "retain-interval": 1,
        "output-dir": str(tmp_path),
    }
    common |= {"run-name": "base", "node-wait-seconds": 60}
    simulate({**common, "unlearn-clients": ""}, num_supernodes=3)
    request = {
        **common,
        "unlearn-only": True,
        "unlearn-clients": "1",
        "unlearn-methods": "federaser,fedaccum",
        # two short rounds leave FedEraser flagged; without FedRetrain, auto would refuse it
        "unlearn-adopt": "federaser",
    }
    simulate(request, num_supernodes=3)

    run_dir = tmp_path / "base"
    table = pd.read_csv(run_dir / "unlearning.csv")
    assert table["method"].tolist() == ["fedavg", "federaser", "fedaccum"]
    assert UpdateStore(run_dir / "store").clients() == [0, 2]
    log = [json.loads(line) for line in (run_dir / "unlearning_log.jsonl").read_text().splitlines()]
    assert [entry["targets"] for entry in log] == [[1]]
    # The trained run's settings were kept: still two rounds, still the same training metrics.
    assert json.loads((run_dir / "config.json").read_text())["rounds"] == 2

    with pytest.raises(ConfigError, match="already were"):
        simulate(request, num_supernodes=3)


def test_an_auto_named_run_is_reopened_by_its_printed_name(tmp_path, simulate):
    """The default run name (``<dataset>-<timestamp>``, ``run-name`` left empty) is what the
    README's unlearn-only recipe names: both the launcher's checks and the server reopen it."""
    from simulations import run as runner

    common = {"num-clients": 3, "rounds": 2, "local-epochs": 1, "retain-interval": 1}
    common |= {"output-dir": str(tmp_path), "node-wait-seconds": 60}
    simulate({**common, "unlearn-clients": ""}, num_supernodes=3)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert json.loads((run_dir / "config.json").read_text())["run-name"] == ""
    request = ["--set", f"run-name='{run_dir.name}'", "--set", "unlearn-only=true"]
    request += ["--set", "unlearn-clients='1'", "--output-dir", str(tmp_path), "--dry-run"]
    assert runner.main(request) == 0
    simulate(
        {**common, "run-name": run_dir.name, "unlearn-only": True, "unlearn-clients": "1",
         "unlearn-methods": "federaser,fedretrain"},
        num_supernodes=3,
    )  # fmt: skip
    table = pd.read_csv(run_dir / "unlearning.csv")
    assert table["method"].tolist() == ["fedavg", "federaser", "fedretrain"]
    assert UpdateStore(run_dir / "store").clients() == [0, 2]
