"""TensorBoard and MLflow are optional: a run asking for one that is not installed is refused at
launch, in one line naming the key and the extra to install; what they log is checked on a real
training and request in tests/federation/test_client_sampling.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.tracking import Tracker, mlflow_uri, numeric_items
from simulations.run import main

REAL_FIND_SPEC = importlib.util.find_spec


def without(module: str, monkeypatch) -> None:
    """Pretend ``module`` is not installed."""
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == module else REAL_FIND_SPEC(name, *args),
    )


@pytest.mark.parametrize(
    ("key", "value", "shown", "module"),
    [("log-tensorboard", "true", "True", "tensorboard"), ("log-mlflow", "run", "'run'", "mlflow")],
)
def test_a_run_asking_for_a_missing_tracker_is_refused_at_launch(
    key, value, shown, module, monkeypatch, capsys, tmp_path
):
    without(module, monkeypatch)
    argv = ["--set", f"{key}={value}", "--output-dir", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"fedunlearn-run: error: invalid {key}={shown}: "
        f"{module} is not installed: pip install 'fedunlearn[{module}]'"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_off_needs_nothing_installed(monkeypatch):
    without("tensorboard", monkeypatch)
    without("mlflow", monkeypatch)
    config = ExperimentConfig.from_run_config({"log-tensorboard": False, "log-mlflow": ""})
    assert not Tracker(Path("unused"), tensorboard=config.log_tensorboard).active


@pytest.mark.parametrize("value", ["mlruns", "./mlflow.db", "run please"])
def test_log_mlflow_is_a_uri_with_its_scheme(value):
    with pytest.raises(ConfigError, match="invalid log-mlflow=.*tracking URI with its scheme"):
        ExperimentConfig.from_run_config({"log-mlflow": value})


def test_run_stands_for_a_sqlite_store_in_the_run_directory(tmp_path):
    assert mlflow_uri("run", tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert mlflow_uri("http://localhost:5000", tmp_path) == "http://localhost:5000"


def test_only_finite_numbers_are_logged():
    row = {"round": 3, "retained": True, "train_loss": float("nan"), "did": "x", "mb": 1.5}
    assert numeric_items(row) == {"round": 3.0, "retained": 1.0, "mb": 1.5}
