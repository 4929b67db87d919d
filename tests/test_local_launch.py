"""``fedunlearn-run --engine local`` (:mod:`simulations.local_launch`): the checked run served by
a fork of the launcher (or, where it cannot fork, ``python -m simulations.local_engine``), its
lines filtered as ``flwr run``'s are, its exit status the run's: 0 with the results, 1 with the
app's refusal or an engine that failed, 2 for a bad key with nothing started, 130 on Ctrl-C."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from simulations import local_launch
from simulations import run as launcher
from simulations.console import ConsoleFilter
from simulations.local_engine import visible_gpus

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL = ["--set", "num-clients=3", "--set", "rounds=2", "--set", "local-epochs=1"]


def _launch(argv: list[str], capfd) -> tuple[int, str, str]:
    code = launcher.main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def test_the_main_job_runs_on_the_local_engine(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPOSITORY)
    argv = ["simulations/digits.toml", "--engine", "local", *SMALL, "--output-dir", str(tmp_path)]
    code, out, err = _launch(argv, capfd)
    assert code == 0, err
    assert "local engine: 3 clients in " in out and "no SuperLink, no Ray" in out
    assert "[fedunlearn] results in" in out
    assert "INFO :" not in out  # Flower's log lines are hidden, as from flwr run
    (run,) = tmp_path.iterdir()
    assert (run / "model_federaser.safetensors").is_file()
    assert (run / "unlearning.csv").is_file()


def test_a_bad_key_starts_nothing(tmp_path, capfd):
    argv = ["--engine", "local", "--set", "rounds=0", "--output-dir", str(tmp_path)]
    code, _, err = _launch(argv, capfd)
    assert code == 2 and "rounds" in err
    assert not any(tmp_path.iterdir())


def test_a_dry_run_says_what_would_start(tmp_path, capfd):
    code, out, _ = _launch(["--engine", "local", "--dry-run", "--output-dir", str(tmp_path)], capfd)
    assert code == 0 and "local engine: 10 clients" in out
    assert not any(tmp_path.iterdir())


def test_an_unknown_engine_is_refused_naming_the_choices(capfd):
    with pytest.raises(SystemExit) as stopped:
        launcher.main(["--engine", "ray"])
    assert stopped.value.code == 2
    assert "--engine" in capfd.readouterr().err


def _stream(serve, out_path: Path) -> tuple[int, ConsoleFilter, str]:
    console = ConsoleFilter(verbose=False, color=False)
    with out_path.open("w") as out:
        code, _ = launcher.stream_process(local_launch.ForkedEngine(serve), console, out)
    return code, console, out_path.read_text()


def test_the_apps_refusal_fails_the_launch_with_its_line(tmp_path):
    def refuse():
        print("[fedunlearn] error: invalid rounds=3: no", flush=True)
        raise RuntimeError("invalid rounds=3: no")

    code, console, shown = _stream(refuse, tmp_path / "out.txt")
    assert code == 1 and console.error == "invalid rounds=3: no"
    assert local_launch.local_verdict(code, console, verbose=False)[0] == 1
    assert "[fedunlearn] error: invalid rounds=3: no" in shown


def test_an_engine_that_failed_otherwise_shows_its_traceback(tmp_path):
    def crash():
        raise ZeroDivisionError("a bug")

    code, console, shown = _stream(crash, tmp_path / "out.txt")
    assert code == 1 and console.error is None
    assert "ZeroDivisionError: a bug" in shown  # an error is never hidden
    said = local_launch.local_verdict(code, console, verbose=False)
    assert said == (1, "run failed (the local engine exited with 1)")


def test_a_terminated_engine_stops_at_once(tmp_path):
    engine = local_launch.ForkedEngine(lambda: time.sleep(600))
    started = time.monotonic()
    engine.terminate()
    assert engine.wait() != 0 and time.monotonic() - started < 30
    assert engine.wait() == engine.returncode  # waited once, then known


def test_where_it_cannot_fork_the_engine_is_its_own_process(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPOSITORY)
    monkeypatch.setattr(local_launch, "fork_is_safe", lambda: False)  # macOS, or a GPU machine
    forked = []
    monkeypatch.setattr(local_launch, "ForkedEngine", lambda *a: forked.append(a))
    argv = ["--engine", "local", *SMALL, "--set", "rounds=1", "--output-dir", str(tmp_path)]
    code, out, err = _launch(argv, capfd)
    assert code == 0, err
    assert not forked and "[fedunlearn] results in" in out


def test_ctrl_c_ends_the_engine_and_says_how_to_continue(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(REPOSITORY)

    def interrupt_on_round_one(process, console, out, seen=None, display=None):
        for line in process.stdout:
            if line.startswith("[fedunlearn] run directory: "):
                run_directory = line.split(": ", 1)[1].strip()
            if line.startswith("[fedunlearn] round 1/"):
                process.terminate()
                process.wait()
                raise launcher.RunInterrupted(None, run_directory)
        pytest.fail("the run ended before round 1")

    monkeypatch.setattr(local_launch, "stream_process", interrupt_on_round_one)
    argv = ["--engine", "local", *SMALL, "--set", "rounds=20", "--output-dir", str(tmp_path)]
    code, _, err = _launch(argv, capfd)
    assert code == launcher.INTERRUPTED == 130
    assert "interrupted: the local engine stopped" in err
    assert "--set resume=true" in err and str(tmp_path) in err


@pytest.mark.skipif(bool(visible_gpus()), reason="this machine shows a GPU")
def test_a_gpu_share_on_a_machine_without_gpu_is_refused_before_anything_starts(tmp_path, capfd):
    argv = ["--engine", "local", "--num-gpus", "0.5", "--output-dir", str(tmp_path)]
    code, _, err = _launch(argv, capfd)
    assert code == 2 and "--num-gpus" in err and "no NVIDIA GPU" in err
    assert not any(tmp_path.iterdir())
