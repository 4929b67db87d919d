"""``fedunlearn-run`` on a busy machine: it waits for the local SuperLink longer than Flower's 15 s,
tries ``flwr run`` again while the SuperLink or Ray is still starting, and when it gives up says in
one line what did not start, the machine's load and what to do. No SuperLink is started here: the
process, its health endpoint, the clock and ``flwr run`` are stand-ins."""

from __future__ import annotations

import io
import os
import sys

import pytest

from simulations import attempts
from simulations import local_superlink as link
from simulations import run as runner

FLOWER_BOX = [
    "Starting local SuperLink on 127.0.0.1:39091...",
    "╭─ Error ──────────────────────────────────────────────────────────╮",
    "│ Failed to start local SuperLink within 15s. See logs at          │",
    "│ /root/.flwr/local-superlink/superlink.log.                       │",
    "╰──────────────────────────────────────────────────────────────────╯",
]
RAY_TIMEOUT = [
    "Successfully started run 7",
    "ERROR :     An exception occured!! The current node timed out during startup. This could "
    "happen because some of the raylet failed to startup or the GCS has become overloaded.",
]
STARTED = ["Successfully started run 8", "[fedunlearn] run directory: /tmp/runs/digits-1"]


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeProcess:
    """A detached ``flower-superlink`` that is still running, or exited with ``returncode``."""

    def __init__(self, returncode: int | None = None) -> None:
        self.returncode, self.killed = returncode, False

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.killed = True

    def wait(self) -> int:
        return self.returncode or -9


@pytest.fixture
def superlink(monkeypatch, tmp_path):
    """A local connection under ``tmp_path``; the SuperLink answers once ``up_at`` (fake seconds)
    passed, or never (None). Returns (state, clock); ``state["started"]`` lists the commands."""
    clock = FakeClock()
    state = {"up_at": None, "started": [], "process": FakeProcess()}

    def popen(command, **kwargs):
        state["started"].append(command)
        return state["process"]

    def is_up(self):
        return state["up_at"] is not None and clock() >= state["up_at"]

    monkeypatch.setattr(link.subprocess, "Popen", popen)
    monkeypatch.setattr(link.LocalSuperLink, "is_up", is_up)
    monkeypatch.setattr(link, "listening_process", lambda port, proc=None: None)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    return state, clock


def _ensure(state_clock, timeout):
    _, clock = state_clock
    environ = {"FLWR_HOME": os.environ["FLWR_HOME"]}
    return link.ensure_local_superlink(environ, timeout, clock=clock, sleep=clock.sleep)


def test_a_superlink_slower_than_flowers_15_s_is_awaited(superlink, capsys):
    state, clock = superlink
    state["up_at"] = 40.0  # Flower would have killed it at 15 s
    found = _ensure(superlink, 300)
    assert found is not None and clock() >= 40.0
    assert (
        "the local SuperLink took 40 s to start (flwr run alone waits 15 s"
        in capsys.readouterr().err
    )
    [command] = state["started"]
    assert command[0] == "flower-superlink" and "--simulation" in command
    assert command[command.index("--port") + 1] == "39091"
    assert not state["process"].killed


def test_a_superlink_already_up_is_used_and_nothing_is_started(superlink):
    state, _ = superlink
    state["up_at"] = 0.0
    assert _ensure(superlink, 300) is not None
    assert state["started"] == []


def test_a_superlink_that_never_answers_is_stopped_and_named_with_the_load_and_the_remedy(
    superlink,
):
    state, clock = superlink
    with pytest.raises(link.StartFailure) as failure:
        _ensure(superlink, 5)
    message = str(failure.value)
    assert "the local SuperLink did not start within 5 s" in message
    assert "load average" in message and "--start-timeout 300" in message
    assert state["process"].killed and clock() >= 5


def test_a_superlink_that_exits_while_starting_is_reported_with_its_code(superlink):
    state, _ = superlink
    state["process"] = FakeProcess(returncode=3)
    with pytest.raises(link.StartFailure, match="exited with code 3"):
        _ensure(superlink, 300)


def test_a_connection_with_its_own_address_is_left_to_flwr(superlink, tmp_path):
    state, _ = superlink
    (tmp_path / "flwr").mkdir()
    (tmp_path / "flwr" / "config.toml").write_text(
        '[superlink]\ndefault = "remote"\n[superlink.remote]\naddress = "10.0.0.1:9093"\n'
    )
    assert _ensure(superlink, 300) is None
    assert state["started"] == []


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ('[superlink]\ndefault = "local"\n[superlink.local]\naddress = ":local:"\n', ":local:"),
        (
            '[superlink]\ndefault = "m"\n[superlink.m]\naddress = ":local-in-memory:"\n',
            ":local-in-memory:",
        ),
        ('[superlink]\ndefault = "old"\n[superlink.old]\noptions.num-supernodes = 2\n', ":local:"),
        ("not toml [", None),
    ],
)
def test_the_default_connection_is_read_from_flowers_config(tmp_path, text, address):
    (tmp_path / "config.toml").write_text(text)
    assert link.default_address({"FLWR_HOME": str(tmp_path)}) == address


def test_no_flower_config_yet_means_flowers_default_local_connection(tmp_path):
    assert link.default_address({"FLWR_HOME": str(tmp_path / "none")}) == ":local:"


def test_the_start_timeout_comes_from_the_option_then_the_environment():
    assert link.start_timeout(12.0, {"FEDUNLEARN_START_TIMEOUT": "99"}) == 12.0
    assert link.start_timeout(None, {"FEDUNLEARN_START_TIMEOUT": "99"}) == 99.0
    assert link.start_timeout(None, {}) == link.DEFAULT_START_TIMEOUT


def test_rays_gcs_timeouts_are_raised_unless_set():
    env = link.launch_environment({"RAY_gcs_rpc_server_reconnect_timeout_s": "5"}, 600)
    assert env["RAY_gcs_server_request_timeout_seconds"] == "600"
    assert env["RAY_gcs_rpc_server_reconnect_timeout_s"] == "5"


# ------------------------------------------------------------------------- the attempts
@pytest.mark.parametrize(
    ("lines", "run_id", "status", "cause"),
    [
        (FLOWER_BOX, None, None, "the local SuperLink"),
        (RAY_TIMEOUT, "7", ("finished:failed", ""), "Ray"),
        (
            ["Successfully started run 7"],
            "7",
            ("finished:failed", "timed out during startup"),
            "Ray",
        ),
        # the run made its run directory: it may have written files, never tried again
        ([*STARTED, *RAY_TIMEOUT[1:]], "8", ("finished:failed", ""), ""),
        (["Successfully started run 9"], "9", ("finished:failed", "ValueError: boom"), ""),
        (STARTED, "8", ("finished:completed", ""), ""),
    ],
)
def test_what_did_not_start_is_read_from_the_attempts_output(lines, run_id, status, cause):
    assert attempts.start_problem(lines, run_id, status) == cause


def _scripted(outputs: list[list[str]], seen_commands: list):
    """A stand-in for ``stream_run`` printing one of ``outputs`` per call."""

    def stream(command, env, console, out, lines):
        printed = outputs[len(seen_commands)]
        seen_commands.append(command)
        lines.extend(printed)
        run_id = next(
            (x.split()[-1] for x in printed if x.startswith("Successfully started")), None
        )
        return (1 if run_id is None else 0), run_id

    return stream


class _Console:
    error = None


def _run(outputs, *, timeout=300.0, status=("finished:completed", ""), local="a SuperLink"):
    calls, ensured = [], []
    outcome = attempts.run_until_started(
        ["flwr", "run"],
        {},
        timeout=timeout,
        stream=_scripted(outputs, calls),
        status=lambda run_id, env: status,
        ensure=lambda env, left: ensured.append(left) or local,
        new_console=_Console,
        out=io.StringIO(),
    )
    return outcome, calls, ensured


def test_flowers_failed_superlink_start_is_tried_again_and_the_run_goes_on(capsys):
    outcome, calls, ensured = _run([FLOWER_BOX, STARTED])
    assert (outcome.attempts, outcome.run_id, outcome.code) == (2, "8", 0)
    assert len(calls) == 2 and len(ensured) == 2  # the SuperLink is awaited before each attempt
    assert "the local SuperLink did not start; trying again (attempt 2" in capsys.readouterr().err


def test_a_ray_that_did_not_start_is_tried_again():
    statuses = iter([("finished:failed", "RuntimeError"), ("finished:completed", "")])
    calls = []
    outcome = attempts.run_until_started(
        ["flwr", "run"],
        {},
        timeout=300.0,
        stream=_scripted([RAY_TIMEOUT, STARTED], calls),
        status=lambda run_id, env: next(statuses),
        ensure=lambda env, left: "a SuperLink",
        new_console=_Console,
        out=io.StringIO(),
    )
    assert outcome.attempts == 2 and outcome.status == ("finished:completed", "")


def test_a_deployments_superlink_that_does_not_answer_is_not_tried_again():
    outcome, calls, _ = _run([FLOWER_BOX, STARTED], local=None)
    assert outcome.attempts == 1 and outcome.run_id is None


def test_a_run_that_failed_otherwise_is_not_tried_again():
    outcome, calls, _ = _run([["Successfully started run 3"]], status=("finished:failed", "boom"))
    assert outcome.attempts == 1 and outcome.status == ("finished:failed", "boom")


def test_it_gives_up_after_its_attempts_with_one_line_naming_the_cause_and_the_remedy():
    with pytest.raises(link.StartFailure) as failure:
        _run([FLOWER_BOX] * attempts.MAX_ATTEMPTS)
    message = str(failure.value)
    assert message.startswith(f"the local SuperLink did not start ({attempts.MAX_ATTEMPTS} attempt")
    assert "load average" in message and "--start-timeout" in message
    assert "\n" not in message


# ------------------------------------------------------------------ through fedunlearn-run
def test_fedunlearn_run_tries_flwr_again_and_finishes(tmp_path, monkeypatch, capsys):
    """A stand-in ``flwr run`` that fails with Flower's box the first time, then runs."""
    marker = tmp_path / "tried"
    box = "\n".join(FLOWER_BOX)
    script = (
        "import pathlib, sys\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        f"if not m.exists():\n    m.write_text('1'); print({box!r}); sys.exit(1)\n"
        "print('Successfully started run 42')\n"
    )
    monkeypatch.setattr(runner, "build_flwr_command", lambda *a: [sys.executable, "-c", script])
    monkeypatch.setattr(runner, "ensure_local_superlink", lambda env, timeout: "up")
    monkeypatch.setattr(runner, "_run_status", lambda run_id, env: ("finished:completed", ""))
    assert runner.main(["--output-dir", str(tmp_path / "out"), "--set", "rounds=1"]) == 0
    assert "trying again (attempt 2" in capsys.readouterr().err


def test_fedunlearn_run_gives_up_with_exit_75_and_one_line(tmp_path, monkeypatch, capsys):
    def never(env, timeout):
        raise link.StartFailure(f"the local SuperLink did not start within {timeout:.0f} s; ...")

    monkeypatch.setattr(runner, "ensure_local_superlink", never)
    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("flwr started"))
    argv = ["--output-dir", str(tmp_path / "out"), "--set", "rounds=1", "--start-timeout", "7"]
    assert runner.main(argv) == runner.START_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fedunlearn-run: error: the local SuperLink did not start within 7 s; ..."]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_bad_start_timeout_exits_2_before_anything_starts(tmp_path, value, capsys):
    argv = ["--dry-run", "--output-dir", str(tmp_path), f"--start-timeout={value}"]
    assert runner.main(argv) == 2
    assert "invalid --start-timeout=" in capsys.readouterr().err


# ------------------------------------------------------------------ a SuperLink already up
def _fake_proc(root, argv, port="39093", inode="424242"):
    """A /proc with one process (id 4242, command line ``argv``) listening on ``port``."""
    (root / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = f"   0: 0100007F:{int(port):04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode} 1\n"
    (root / "net" / "tcp").write_text(header + row)
    (root / "4242" / "fd").mkdir(parents=True)
    os.symlink(f"socket:[{inode}]", root / "4242" / "fd" / "3")
    (root / "4242" / "cmdline").write_bytes(b"\0".join(part.encode() for part in argv) + b"\0")
    (root / "self").mkdir()
    return root


def test_a_superlink_whose_environment_was_deleted_is_named_not_waited_for(tmp_path):
    """Its Python is gone: flwr run would wait for a run it can never start (a 9-minute hang seen
    after a fresh clone was deleted under its SuperLink); one line names the process to stop."""
    gone = tmp_path / "deleted-venv" / "bin"
    proc = _fake_proc(tmp_path / "proc", [str(gone / "python3"), str(gone / "flower-superlink")])
    assert link.listening_process("39093", proc) == (
        4242,
        [str(gone / "python3"), str(gone / "flower-superlink")],
    )
    superlink = link.LocalSuperLink.of({"FLWR_HOME": str(tmp_path)}, link.LOCAL_ADDRESSES[0])
    with pytest.raises(
        link.StartFailure, match=r"\(process 4242\) runs from .*no longer exists.*kill 4242"
    ):
        link.check_environment(superlink, proc)


def test_a_superlink_of_another_environment_is_used_with_a_warning(tmp_path, capsys):
    other = tmp_path / "other-venv" / "bin"
    other.mkdir(parents=True)
    for name in ("python3", "flower-superlink"):
        (other / name).write_text("")
    proc = _fake_proc(tmp_path / "proc", [str(other / "python3"), str(other / "flower-superlink")])
    superlink = link.LocalSuperLink.of({"FLWR_HOME": str(tmp_path)}, link.LOCAL_ADDRESSES[0])
    link.check_environment(superlink, proc)
    assert "runs from " + str(other.parent) in capsys.readouterr().err


def test_a_superlink_of_this_environment_passes_quietly(tmp_path, capsys):
    script = os.path.join(os.path.dirname(sys.executable), "flower-superlink")  # flwr installs it
    proc = _fake_proc(tmp_path / "proc", [sys.executable, script])
    superlink = link.LocalSuperLink.of({"FLWR_HOME": str(tmp_path)}, link.LOCAL_ADDRESSES[0])
    link.check_environment(superlink, proc)
    assert capsys.readouterr().err == ""


def test_a_port_no_process_listens_on_tells_nothing(tmp_path):
    proc = _fake_proc(tmp_path / "proc", ["/usr/bin/python3"], port="39091")
    assert link.listening_process("39093", proc) is None
