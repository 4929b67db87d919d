"""docs/adding-a-dataset.md, executed as written: its modules are written where it says (in a
temporary folder added to their packages' paths), its registry lines run in the namespace of their
registries' modules, and the toy dataset is then listed, validated (a model that does not fit it
refused before any data is loaded), and run through the ServerApp's whole main job with the toy
model: training, FedEraser, FedRetrain and the certified head, with no other file edited."""

from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd
import pytest
from doc_pages import python_blocks
from federation_grid import serve_in_process

import fedunlearn.dataset_registry as dataset_registry_module
import fedunlearn.model_registry as model_registry_module
from fedunlearn.cli import main as fedunlearn_main
from fedunlearn.config import ExperimentConfig
from fedunlearn.dataset_registry import DATASETS
from fedunlearn.errors import ConfigError
from fedunlearn.model_registry import MODELS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-dataset.md"
REGISTRY_LINES = {
    "DATASETS.register(": dataset_registry_module,
    "MODELS.register(": model_registry_module,
}

pytestmark = pytest.mark.usefixtures("flower_task_identity")


def _blocks() -> list[tuple[str | None, str]]:
    return python_blocks(DOC)


@pytest.fixture
def toys(tmp_path, monkeypatch):
    """The page's modules written and importable, its registry lines run; undone afterwards."""
    for path, code in _blocks():
        if not path or code.startswith(tuple(REGISTRY_LINES)) or not path.startswith("fedunlearn/"):
            continue
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code, encoding="utf-8")
        package = importlib.import_module(path.rpartition("/")[0].replace("/", "."))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(target.parent)])
    before = set(DATASETS.names()), set(MODELS.names())
    try:
        for _, code in _blocks():
            for start, module in REGISTRY_LINES.items():
                if code.startswith(start):
                    exec(compile(code, str(DOC), "exec"), dict(vars(module)))
        yield
    finally:
        for name in set(DATASETS.names()) - before[0]:
            DATASETS.unregister(name)
        for name in set(MODELS.names()) - before[1]:
            MODELS.unregister(name)


def test_the_page_has_one_module_and_one_line_for_each_toy():
    paths = [
        path for path, code in _blocks() if path and not code.startswith(tuple(REGISTRY_LINES))
    ]
    lines = [code for _, code in _blocks() if code.startswith(tuple(REGISTRY_LINES))]
    assert "fedunlearn/data/sources/waves.py" in paths
    assert "fedunlearn/training/architectures/wide_mlp.py" in paths
    assert len(lines) == 2 and all(line.count("\n") == 1 for line in lines)  # one line each


def test_the_toy_dataset_is_listed_and_checked_before_loading(toys, capsys):
    assert "waves" in DATASETS and "wide-mlp" in MODELS
    assert fedunlearn_main(["data", "list"]) == 0 and "waves:" in capsys.readouterr().out
    with pytest.raises(ConfigError) as caught:
        ExperimentConfig.from_run_config({"dataset": "waves", "model": "mnist-cnn"})
    assert caught.value.parameter == "model" and "(16,)" in str(caught.value)


def test_the_toy_dataset_and_model_run_the_main_job(toys, tmp_path):
    run = {
        "dataset": "waves",
        "model": "wide-mlp",
        "num-clients": 3,
        "rounds": 2,
        "local-epochs": 1,
        "retain-interval": 1,
        "unlearn-clients": "1",
        "unlearn-methods": "federaser,fedretrain",
        "certified-head": True,
        "certified-removals": 2,
        "output-dir": str(tmp_path),
        "run-name": "waves",
        "node-wait-seconds": 30,
    }
    serve_in_process(run, num_supernodes=3)
    folder = tmp_path / "waves"
    table = pd.read_csv(folder / "unlearning.csv").set_index("method")
    assert {"fedavg", "federaser", "fedretrain"} <= set(table.index)
    assert table.loc["fedretrain", "test_accuracy"] > 0.7  # one period or two: easy to tell apart
    assert (folder / "certified_removal.jsonl").is_file()
