"""Ctrl-C on ``fedunlearn-run``: the streamed command ends, the run is stopped on the SuperLink,
the way to continue it is printed, and the exit status is 130."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from simulations import run as runner
from simulations.console import ConsoleFilter

#: A stand-in for `flwr run --stream`: announces a run and its directory, then keeps running.
FLWR = (
    "import sys, time\n"
    "print('Successfully started run 4242', flush=True)\n"
    "print('[fedunlearn] run directory: /runs/digits-20261126-061654', flush=True)\n"
    # a client's output, in the same stream, cannot redirect the stop request
    "print('(ClientAppActor pid=1) [fedunlearn] run directory: /home', flush=True)\n"
    "print('Successfully started run 1', flush=True)\n"
    "time.sleep(60)\n"
)


def _interrupt_after(seconds: float) -> None:
    """Ctrl-C as a terminal sends it, to this process, from a timer."""
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_ctrl_c_ends_the_streamed_command_and_says_which_run(monkeypatch):
    # Python's own Ctrl-C handler, as in a fresh fedunlearn-run (an in-process Flower simulation
    # earlier in the test session installs its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_case(monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_case(monkeypatch):
    started = []
    popen = runner.subprocess.Popen
    monkeypatch.setattr(
        runner.subprocess, "Popen", lambda *a, **k: started.append(popen(*a, **k)) or started[-1]
    )
    _interrupt_after(1.5)
    began = time.monotonic()
    with pytest.raises(runner.RunInterrupted) as interrupted:
        runner.stream_run([sys.executable, "-c", FLWR], {}, ConsoleFilter(), io.StringIO())
    assert time.monotonic() - began < 30  # not the stand-in's 60 s
    assert interrupted.value.run_id == "4242"
    assert interrupted.value.run_directory == "/runs/digits-20261126-061654"
    assert started[0].poll() is not None  # the command is gone, not left running


def test_the_interrupted_run_is_stopped_and_the_resume_command_printed(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(
        runner.subprocess,
        "run",
        lambda argv, **kwargs: asked.append(argv) or runner.subprocess.CompletedProcess(argv, 0),
    )
    interrupted = runner.RunInterrupted("4242", "/runs/digits-20261126-061654")
    code = runner.stop_interrupted(
        interrupted, ["simulations/digits.toml", "--set", "rounds=50"], {}
    )
    assert code == 130
    assert asked == [["flwr", "stop", "4242"]]
    err = capsys.readouterr().err
    assert "interrupted: stopped run 4242" in err
    assert (
        "fedunlearn-run simulations/digits.toml --set rounds=50 --output-dir /runs "
        "--set run-name=digits-20261126-061654 --set resume=true"
    ) in err


def test_before_a_run_started_nothing_is_stopped(monkeypatch, capsys):
    monkeypatch.setattr(runner.subprocess, "run", lambda *a, **k: pytest.fail("nothing to stop"))
    assert runner.stop_interrupted(runner.RunInterrupted(None, None), [], {}) == 130
    assert "interrupted before the run started" in capsys.readouterr().err


def test_the_stop_request_reaches_the_run_directory_once(tmp_path):
    from fedunlearn.store.run_directory import STOP_REQUEST, RunDirectory, request_stop

    assert not request_stop(tmp_path / "no-such-run")
    assert not (tmp_path / "no-such-run").exists()  # nothing created where no run is
    run = RunDirectory.create(tmp_path / "run", {"rounds": 3})
    assert not run.take_stop_request()
    assert request_stop(run.path)
    assert (run.path / STOP_REQUEST).stat().st_mode & 0o077 == 0
    assert run.take_stop_request() and not run.take_stop_request()


def test_ctrl_c_asks_the_run_directory_to_stop(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        runner.subprocess, "run", lambda argv, **k: runner.subprocess.CompletedProcess(argv, 0)
    )
    (tmp_path / "run").mkdir()
    runner.stop_interrupted(runner.RunInterrupted("7", str(tmp_path / "run")), [], {})
    assert (tmp_path / "run" / "stop-requested").is_file()


def _superlink_port_taken(port: int = 39091) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _stop_processes_of(marker: str) -> None:
    """Stop what the real run left behind (its local SuperLink): the processes whose environment
    holds ``marker``, by process id."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                os.kill(int(environ.parent.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.deployment
@pytest.mark.skipif(
    _superlink_port_taken(), reason="a local SuperLink already runs here; this test starts its own"
)
def test_ctrl_c_on_a_real_run_stops_it_says_how_to_resume_and_exits_130(tmp_path):
    """The real thing: ``fedunlearn-run`` on digits, Ctrl-C (SIGINT to its process group, as a
    terminal sends it) once a few rounds are in ``metrics.csv``; no new row 10 s later."""
    home = tmp_path / "flwr-home"
    ray = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths are limited to 107 bytes
    env = {**os.environ, "FLWR_HOME": str(home), "RAY_TMPDIR": ray}
    run = tmp_path / "out" / "ctrl-c"
    command = [
        str(Path(sys.executable).parent / "fedunlearn-run"),
        *("--output-dir", str(run.parent), "--set", f"run-name={run.name}"),
        *("--set", "rounds=200", "--set", "local-epochs=1", "--set", "num-clients=2"),
    ]
    err = tmp_path / "stderr.txt"
    try:
        with open(tmp_path / "stdout.txt", "w") as out, open(err, "w") as errors:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=errors,
                env=env,
                start_new_session=True,
                # a suite started in the background (`cmd &`) ignores SIGINT, and so would the
                # command: give it a terminal's default, as a user's shell does
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
            deadline = time.monotonic() + 240
            while _rows(run / "metrics.csv") < 3 and time.monotonic() < deadline:
                assert process.poll() is None, (tmp_path / "stdout.txt").read_text()
                time.sleep(0.5)
            assert _rows(run / "metrics.csv") >= 3, "the run did not reach round 2 in 240 s"
            os.killpg(process.pid, signal.SIGINT)
            code = process.wait(timeout=120)
        rows = _rows(run / "metrics.csv")
        time.sleep(10)
        assert _rows(run / "metrics.csv") == rows, "the run went on after Ctrl-C"
        assert code == runner.INTERRUPTED == 130
        said = err.read_text()
        assert "Traceback" not in said and "interrupted" in said
        resume = said.split("continue it with: ", 1)[1].splitlines()[0]
        assert f"run-name={run.name}" in resume and "resume=true" in resume
        assert rows < 200 + 1
    finally:
        _stop_processes_of(f"FLWR_HOME={home}")
        shutil.rmtree(ray, ignore_errors=True)
