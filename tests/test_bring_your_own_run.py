"""``fedunlearn-run`` on a researcher's own dataset and model: a module in a temporary folder that is
on no Python path (``code-path`` names it), imported by the launcher's checks, the ServerApp's
``flwr-simulation`` process and the Ray workers that host the ClientApps; trained, then forgotten by
FedEraser and FedRetrain, and the certified head's removals on its features. No file of the package
is edited. The same through the Python API: ``docs/python-api.md`` (tests/test_python_api_docs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

pytestmark = pytest.mark.deployment

MODULE = '''
import numpy as np
from torch import nn


def load(source):
    """Four overlapping Gaussian blobs in 12 dimensions, seeded by the run."""
    rng = np.random.default_rng(source.seed)
    centres = rng.normal(size=(4, 12))
    y = rng.integers(0, 4, size=900)
    x = (centres[y] + rng.normal(size=(900, 12))).astype(np.float32)
    return x[:700], y[:700], x[700:], y[700:]


def build(input_shape, num_classes):
    return nn.Sequential(nn.Linear(input_shape[0], 24), nn.ReLU(), nn.Linear(24, num_classes))
'''


def test_fedunlearn_run_trains_forgets_and_certifies_a_user_dataset_and_model(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "blobs_of_mine.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    keys = {
        "dataset": "blobs_of_mine:load",
        "model": "blobs_of_mine:build",
        "code-path": str(folder),
        "num-clients": 3,
        "rounds": 2,
        "local-epochs": 1,
        "retain-interval": 1,
        "unlearn-clients": "1",
        "unlearn-methods": "federaser,fedretrain",
        "certified-head": "true",
        "certified-removals": 2,
        "run-name": "mine",
    }
    command = [
        sys.executable,
        "-c",
        "from simulations.run_args import main; raise SystemExit(main())",
    ]
    for key, value in keys.items():
        command += ["--set", f"{key}={value}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = project  # the package itself, as an installed one would be; not the module
    done = subprocess.run(
        [*command, "--output-dir", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "mine"
    config = json.loads((run / "config.json").read_text())
    assert (config["dataset"], config["model"]) == ("blobs_of_mine:load", "blobs_of_mine:build")
    table = pd.read_csv(run / "unlearning.csv").set_index("method")
    assert {"fedavg", "federaser", "fedretrain"} <= set(table.index)
    assert (table["test_accuracy"] > 0.4).all(), table["test_accuracy"]  # 4 classes: chance 0.25
    assert (run / "certified_removal.jsonl").is_file()
    assert "certified head: trained on" in done.stdout + done.stderr
