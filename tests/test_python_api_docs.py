"""docs/python-api.md, executed as written: its python blocks run one after the other in one
namespace, in a temporary working directory (the page's ``output_dir="runs"``), and launch real
runs through ``fedunlearn-run``'s steps (the local SuperLink, ``flwr run``, Ray). Its dataset and
model are a module of a temporary folder (``code_path``): the ServerApp's ``flwr-simulation`` and
the Ray workers that host the ClientApps import it, and no file of the package is edited."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest

pytestmark = pytest.mark.deployment

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_python_api_page_runs_as_written(tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in _blocks():
        exec(compile(block, str(DOC), "exec"), namespace)
    run, table = namespace["run"], namespace["table"]
    assert run.path.parent == tmp_path / "runs"
    assert run.config["dataset"] == "usr_blobs:load" and run.config["model"] == "usr_blobs:build"
    assert list(run.metrics["round"]) == [0, 1, 2, 3]
    assert list(table["method"]) == ["fedavg", "federaser", "fedretrain", "certified head"]
    assert table["test_accuracy"].between(0.5, 1.0).all()
    assert [request["targets"] for request in namespace["same"].requests] == [[1]]
    assert namespace["request"].figures["unlearning"].is_file()
