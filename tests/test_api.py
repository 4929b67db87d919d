"""The Python API (``fedunlearn.api``) without launching anything: keywords become run-config keys,
an experiment is validated when it is built as ``fedunlearn-run`` validates it, a launch goes through
the launcher's own steps (here a stand-in for ``flwr run``), and ``Run.open`` reads a real finished
run's tables, refusing a folder that is not a run or a run whose records fail their checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedunlearn.api import Experiment, Launch, Run, RunFailed, run_config_keys
from fedunlearn.errors import ConfigError
from simulations import run as launcher

REPOSITORY = Path(__file__).resolve().parents[1]
TINY = {"dataset": "digits", "num_clients": 4, "rounds": 2}


@pytest.fixture
def no_flower(monkeypatch):
    """Fail the test if anything tries to start a process."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"nothing may be started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.fixture
def launched(monkeypatch):
    """``run_checked`` replaced by a stand-in that records what it was given and reports a run
    that finished (or ``launched.status``); returns the records."""
    calls = SimpleNamespace(runs=[], status=("finished:completed", ""), code=0)
    monkeypatch.setattr(launcher.shutil, "which", lambda name, path=None: "/bin/flwr")

    def run_checked(args, config, text, env, out):
        calls.runs.append(SimpleNamespace(args=args, config=config, text=text, env=env, out=out))
        console = SimpleNamespace(error=None)
        return SimpleNamespace(code=calls.code, run_id="7", console=console, status=calls.status)

    monkeypatch.setattr(launcher, "run_checked", run_checked)
    return calls


# ------------------------------------------------------------------ keywords and validation
def test_python_names_become_run_config_keys_and_values_pass_unchanged():
    keys = run_config_keys(
        {"num_clients": 10, "unlearn-clients": "2", "dataset": "mypkg.data:load", "lr": "0.1"}
    )
    assert keys == {
        "num-clients": 10,
        "unlearn-clients": "2",
        "dataset": "mypkg.data:load",
        "lr": "0.1",
    }


def test_an_experiment_is_validated_into_the_launchers_configuration(tmp_path, no_flower):
    experiment = Experiment(**TINY, output_dir=str(tmp_path), **{"unlearn-clients": "2"})
    assert experiment.config.num_clients == 4
    assert experiment.config.unlearn_targets == [2]
    assert experiment.config.output_dir == str(tmp_path)  # resolved as fedunlearn-run resolves it
    assert experiment.keys["unlearn-clients"] == "2"


@pytest.mark.parametrize(
    ("keywords", "parameter", "said"),
    [
        ({"rounds": 0}, "rounds", "a whole number >= 1"),
        ({"dataset": "imagenet"}, "dataset", "one of digits"),
        ({"num_clientz": 4}, "run-config", "did you mean num-clients?"),
        ({"unlearn_clients": "9"}, "unlearn-clients", "partition ids in [0, 3]"),
        ({"python_path": ["/no/such/folder"]}, "python_path", "folders that exist"),
    ],
)
def test_a_bad_key_or_value_raises_a_config_error_naming_it(keywords, parameter, said, no_flower):
    with pytest.raises(ConfigError) as raised:
        Experiment(**{**TINY, **keywords})
    assert raised.value.parameter == parameter
    assert said in str(raised.value)


def test_keywords_are_set_over_the_config_file(tmp_path, no_flower):
    file = tmp_path / "run.toml"
    file.write_text('dataset = "digits"\nnum-clients = 5\nrounds = 3\n', encoding="utf-8")
    experiment = Experiment(file, rounds=4, output_dir=str(tmp_path))
    assert (experiment.config.num_clients, experiment.config.rounds) == (5, 4)
    with pytest.raises(ConfigError, match="invalid config="):
        Experiment(tmp_path / "missing.toml")


def test_with_keys_validates_a_new_experiment(tmp_path, no_flower):
    experiment = Experiment(**TINY, output_dir=str(tmp_path))
    judged = experiment.with_keys(judge_models=3, unlearn_clients="0")
    assert judged.config.judge_models == 3 and experiment.config.judge_models == 0
    with pytest.raises(ConfigError) as raised:
        experiment.with_keys(judge_models=2)
    assert raised.value.parameter == "judge-models"


def test_python_path_folders_go_first_on_sys_path(tmp_path, monkeypatch, no_flower):
    monkeypatch.setattr(sys, "path", list(sys.path))
    Experiment(**TINY, output_dir=str(tmp_path), python_path=[tmp_path])
    assert sys.path[0] == str(tmp_path.resolve())


def test_python_path_folders_go_first_on_the_runs_pythonpath(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    args = Launch().arguments(None)
    env = launcher.run_environment(args, "/bin", [str(tmp_path)])
    assert env["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    assert launcher.run_environment(args, "/bin")["PYTHONPATH"] == "/elsewhere"


def test_importing_fedunlearn_imports_neither_the_api_nor_torch():
    script = (
        "import sys, fedunlearn\n"
        "before = 'fedunlearn.api' in sys.modules\n"
        "fedunlearn.Experiment\n"
        "print(before, 'torch' in sys.modules, 'flwr' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "False", "False"]


# ------------------------------------------------------------------ launching (flwr run stood in)
def test_train_launches_the_checked_config_and_returns_its_run(tmp_path, launched):
    run = Experiment(**TINY, output_dir=str(tmp_path), quiet=True).train()
    (call,) = launched.runs
    assert 'run-name = "digits-' in call.text and "num-clients = 4\n" in call.text
    assert run.path.parent == tmp_path and run.path.name.startswith("digits-")
    assert call.out is not sys.stdout  # quiet: the launcher's lines go nowhere
    assert call.env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"


def test_a_run_that_did_not_finish_raises_run_failed_saying_why(tmp_path, launched):
    launched.status = ("finished:failed", "the ServerApp raised")
    with pytest.raises(RunFailed, match="run 7 finished:failed: the ServerApp raised"):
        Experiment(**TINY, output_dir=str(tmp_path), quiet=True).train()


def test_forget_sends_an_unlearn_only_request_to_the_run(finished_run, launched):
    run = Run.open(finished_run, quiet=True)
    again = run.forget(clients=[2], methods=["federaser", "fedretrain"], certified_head=True)
    (call,) = launched.runs
    for line in (
        "unlearn-only = true",
        'unlearn-clients = "2"',
        'unlearn-methods = "federaser,fedretrain"',
        "certified-head = true",
        f'run-name = "{finished_run.name}"',
        "num-clients = 4",  # the trained run's data settings, filled in by the launcher
    ):
        assert line in call.text.splitlines()
    assert again.path == run.path


def test_forget_refuses_a_client_the_run_already_forgot(finished_run, launched):
    with pytest.raises(ConfigError) as raised:
        Run.open(finished_run).forget(clients=[1])
    assert raised.value.parameter == "unlearn-clients" and launched.runs == []


# ------------------------------------------------------------------ reading a run
def test_a_finished_run_reads_as_dataframes(finished_run):
    run = Run.open(finished_run)
    assert list(run.metrics["round"]) == [0, 1, 2]
    assert {"test_accuracy", "test_loss", "train_loss", "retained"} <= set(run.metrics.columns)
    assert list(run.comparison["method"]) == ["fedavg", "federaser", "fedaccum", "fedretrain"]
    assert {"test_accuracy", "did", "flag", "client_epochs"} <= set(run.comparison.columns)
    assert run.comparison["did"].notna().all()
    assert run.summary["final_test_accuracy"] == pytest.approx(run.metrics.test_accuracy.iloc[-1])
    assert list(run.certified["requests"])[-1] == 3
    assert run.judge is None
    assert {"training", "unlearning", "certified_removal"} <= set(run.figures)
    assert all(path.is_file() and path.suffix == ".png" for path in run.figures.values())
    assert [request["targets"] for request in run.requests] == [[1]]
    assert run.config["num-clients"] == 4


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "metrics.csv").write_text("round\n0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="a run directory written by a fedunlearn run") as raised:
        Run.open(tmp_path)
    assert raised.value.parameter == "path" and "no identity.json, config.json" in str(raised.value)
    with pytest.raises(ConfigError, match="no folder there"):
        Run.open(tmp_path / "metrics.csv")


def test_a_run_with_an_edited_record_is_refused(finished_run, tmp_path):
    copy = tmp_path / finished_run.name
    shutil.copytree(finished_run, copy)
    log = copy / "unlearning_log.jsonl"
    log.write_text(log.read_text(encoding="utf-8").replace('"targets": [1]', '"targets": [2]'))
    with pytest.raises(ConfigError, match="a run whose records all pass their checks"):
        Run.open(copy)


def test_a_table_that_is_a_link_is_not_followed(finished_run, tmp_path):
    copy = tmp_path / finished_run.name
    shutil.copytree(finished_run, copy)
    (copy / "metrics.csv").unlink()
    (copy / "metrics.csv").symlink_to(tmp_path / "elsewhere.csv")
    (tmp_path / "elsewhere.csv").write_text("round\n0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="a link"):
        _ = Run.open(copy).metrics


def test_a_running_superlink_not_started_with_the_folders_is_named(tmp_path, monkeypatch, capsys):
    from fedunlearn import api
    from simulations import local_superlink

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    monkeypatch.setattr(api, "_SUPERLINK_FOLDERS", {})
    up = {"now": True}
    monkeypatch.setattr(local_superlink.LocalSuperLink, "is_up", lambda self: up["now"])
    api._say_if_superlink_lacks([str(tmp_path)], dict(os.environ))
    assert "was already running: the run sees python_path only if" in capsys.readouterr().err
    up["now"] = False  # this process's launch starts it, with the folders
    api._say_if_superlink_lacks([str(tmp_path)], dict(os.environ))
    up["now"] = True
    api._say_if_superlink_lacks([str(tmp_path)], dict(os.environ))
    api._say_if_superlink_lacks([], dict(os.environ))
    assert capsys.readouterr().err == ""
