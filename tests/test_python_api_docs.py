"""docs/python-api.md, executed as written: its python blocks run one after the other in one
namespace, in a temporary working directory (the page's ``output_dir="runs"``), and launch real
runs through ``fedunlearn-run``'s steps (the local SuperLink, ``flwr run``, Ray). And the page's
claim about modules of your own: a ``python_path`` folder is on the path of every process of the run
(the ServerApp's ``flwr-simulation`` and the Ray workers that host the ClientApps)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import matplotlib
import pytest

from fedunlearn import Experiment
from simulations.local_superlink import LOCAL_ADDRESSES, LocalSuperLink, default_address

pytestmark = pytest.mark.deployment

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"

#: Imported by every Python process that starts with the folder on its path: it leaves a file
#: naming the process, so the test sees which processes of a run could import a module from it.
SEEN = """
import os, sys
folder = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(folder, f"seen-{os.getpid()}"), "w") as out:
    out.write(" ".join(sys.argv))
"""


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


# First in the module: a SuperLink this module's other test started would not have the folder.
def _superlink_up() -> bool:
    address = default_address(os.environ)
    return address in LOCAL_ADDRESSES and LocalSuperLink.of(os.environ, address).is_up()


def test_a_python_path_folder_is_on_the_path_of_the_server_and_the_clients(tmp_path):
    if _superlink_up():
        pytest.skip("a local SuperLink already runs: it keeps the environment it started with")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SEEN, encoding="utf-8")
    experiment = Experiment(
        dataset="digits",
        num_clients=2,
        rounds=1,
        local_epochs=1,
        unlearn_clients="",
        output_dir=str(tmp_path / "runs"),
        python_path=[folder],
        quiet=True,
    )
    experiment.train()
    seen = [path.read_text(encoding="utf-8") for path in folder.glob("seen-*")]
    assert any("flwr-simulation" in argv for argv in seen), seen  # the ServerApp's process
    assert any("default_worker.py" in argv for argv in seen), seen  # Ray's ClientApp workers


def test_the_python_api_page_runs_as_written(tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in _blocks():
        exec(compile(block, str(DOC), "exec"), namespace)
    run, table = namespace["run"], namespace["table"]
    assert run.path.parent == tmp_path / "runs"
    assert list(run.metrics["round"]) == [0, 1, 2, 3]
    assert list(table["method"]) == ["fedavg", "federaser", "fedretrain", "certified head"]
    assert table["test_accuracy"].between(0.5, 1.0).all()
    assert [request["targets"] for request in namespace["same"].requests] == [[1]]
    assert namespace["request"].figures["unlearning"].is_file()
