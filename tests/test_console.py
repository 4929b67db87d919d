"""fedunlearn-run's console: our progress lines by default, Flower's and Ray's with --verbose, no
ANSI codes unless the output is a terminal, and never a hidden error."""

from __future__ import annotations

import io
import sys

from simulations.console import ConsoleFilter, strip_ansi, use_color
from simulations.run import stream_run

GREEN, YELLOW, RED, RESET = "\x1b[92m", "\x1b[93m", "\x1b[91m", "\x1b[0m"

# What `flwr run --stream` printed in a real run of simulations/digits.toml (shortened).
FLOWER_AND_RAY = [
    "",
    "Flower configuration not found. Created default configuration at /root/.flwr/config.toml",
    "Starting local SuperLink on 127.0.0.1:39091...",
    "Using SuperLink: local (127.0.0.1:39091)",
    "Successfully started run 17787992685208633057",
    f"{GREEN}INFO {RESET}:      Starting Flower Simulation",
    f"{YELLOW}WARNING {RESET}:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "Successfully installed fedunlearn to /root/.flwr/apps/fedunlearn.fedunlearn.0.1.0.7e44ee69.",
    "/venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future "
    "versions of Ray, Ray will no longer override accelerator visible devices env var",
    "  warnings.warn(",
    f"{YELLOW}WARNING {RESET}:   fraction_evaluate is set to 0.0. Federated evaluation will be skipped.",
    f"{GREEN}INFO {RESET}:      configure_train: Sampled 10 nodes (out of 10)",
    f"{GREEN}INFO {RESET}:      aggregate_train: Received 10 results and 0 failures",
    f"{GREEN}INFO {RESET}:      ",
    f"(ClientAppActor pid=9226) {YELLOW}WARNING {RESET}:   Manually terminating ClientAppActor",
]
OURS = [
    "[fedunlearn] run directory: /tmp/runs/digits-20261124-003806",
    "[fedunlearn] round 1/20  test accuracy 0.6444  test loss 1.9951  clients 10/10  3.1s",
    "| method     |   test_accuracy |",
    "|:-----------|----------------:|",
    # Lines nobody recognises are shown: an error must never be hidden.
    f"{RED}ERROR {RESET}:     ServerApp thread raised an exception",
    # ... and so is a Flower warning that is not one of the two known ones.
    f"{YELLOW}WARNING {RESET}:   Node 12 did not reply in time",
    "Traceback (most recent call last):",
    '  File "server/server_app.py", line 42, in main',
]


def interleaved() -> list[str]:
    lines = FLOWER_AND_RAY[:10] + OURS[:2] + FLOWER_AND_RAY[10:] + OURS[2:]
    return [line + "\n" for line in lines]


def run_fake_flwr(console: ConsoleFilter) -> tuple[int, str | None, str]:
    """stream_run on a stand-in for `flwr run --stream` that prints the recorded lines."""
    script = f"import sys; sys.stdout.write({''.join(interleaved())!r})"
    out = io.StringIO()
    code, run_id = stream_run([sys.executable, "-c", script], {}, console, out)
    return code, run_id, out.getvalue()


def test_by_default_only_our_lines_and_unknown_ones_are_printed():
    code, run_id, printed = run_fake_flwr(ConsoleFilter())
    assert code == 0 and run_id == "17787992685208633057"  # read even though the line is hidden
    expected = [strip_ansi(line) for line in OURS]
    assert printed.splitlines() == expected
    for marker in ("INFO", "Flower", "SuperLink", "ray", "warnings.warn", "Sampled", "fraction_"):
        assert marker not in printed
    assert [line for line in printed.splitlines() if "WARNING" in line] == [
        "WARNING :   Node 12 did not reply in time"
    ]


def test_verbose_prints_flowers_and_rays_lines_too():
    _, _, printed = run_fake_flwr(ConsoleFilter(verbose=True))
    assert printed.splitlines() == [strip_ansi(line.rstrip("\n")) for line in interleaved()]
    assert "INFO :      configure_train: Sampled 10 nodes (out of 10)" in printed
    assert "FutureWarning" in printed and "warnings.warn(" in printed


def test_colour_codes_reach_a_terminal_only():
    line = f"{GREEN}INFO {RESET}:      configure_train: Sampled 10 nodes\n"
    assert ConsoleFilter(verbose=True, color=False)(line) == "INFO :      configure_train: Sampled 10 nodes\n"
    assert ConsoleFilter(verbose=True, color=True)(line) == line
    assert strip_ansi("\x1b[1;31mbold red\x1b[0m plain\x1b[2K") == "bold red plain"


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_colour_only_on_a_terminal_and_never_with_no_color():
    assert use_color(Stream(tty=True), environ={})
    assert not use_color(Stream(tty=False), environ={})  # redirected to a file or a pipe
    assert not use_color(Stream(tty=True), environ={"NO_COLOR": "1"})
    assert use_color(Stream(tty=True), environ={"NO_COLOR": ""})  # no-color.org: set and non-empty
    assert not use_color(object(), environ={})  # no isatty at all


def test_a_ray_warning_hides_only_its_own_source_line():
    console = ConsoleFilter()
    assert console("  warnings.warn(\n") is not None  # not after a warning: someone else's line
    assert console("/x/site-packages/ray/_private/worker.py:1: FutureWarning: Tip\n") is None
    assert console("  warnings.warn(\n") is None
    assert console("  warnings.warn(\n") is not None


# What `flwr run --stream` printed after a refusal the ServerApp raised once K was adopted.
REFUSED = [
    "[fedunlearn] error: invalid unlearn-clients='5': comma-separated partition ids in [0, 1]",
    f"{RED}ERROR {RESET}:     Simulation raised an exception",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/flwr/simulation/app.py", line 337, in run',
    "    simulation_result = _run_simulation(",
    '  File "/apps/fedunlearn/fedunlearn/config/rules.py", line 75, in partition_ids',
    "    raise ConfigError(key, value, allowed)",
    "fedunlearn.errors.ConfigError: invalid unlearn-clients='5': comma-separated partition ids "
    "in [0, 1]",
    f"{RED}ERROR {RESET}:     Exit Code: 700",
    "",
    "An unhandled exception occurred when running the simulation.",
    "For more information, visit: <https://flower.ai/docs/framework/1.42/en/ref-exit-codes/700.html>",
]


def feed(console: ConsoleFilter, lines: list[str]) -> str:
    shown = [console(line + "\n") for line in lines]
    return "".join(s for s in shown if s is not None) + console.finish()


def test_a_refusal_after_start_is_its_one_line_without_flowers_traceback():
    console = ConsoleFilter()
    printed = feed(console, REFUSED)
    assert printed == REFUSED[0] + "\n"
    assert console.error == REFUSED[0].removeprefix("[fedunlearn] error: ")
    assert "Traceback" in feed(ConsoleFilter(verbose=True), REFUSED)  # --verbose keeps it


def test_another_error_after_a_refusal_is_never_hidden():
    other = REFUSED[:7] + ["RuntimeError: CUDA out of memory"] + REFUSED[8:]
    printed = feed(ConsoleFilter(), other)
    assert "Traceback (most recent call last):" in printed
    assert "RuntimeError: CUDA out of memory" in printed
    assert "Simulation raised an exception" in printed  # Flower's error lines stay too
    # A traceback that names no exception at all (cut short) is shown as well.
    assert "Traceback" in feed(ConsoleFilter(), REFUSED[:5])
    # Our own later lines keep flowing as they come.
    console = ConsoleFilter()
    assert console(REFUSED[0] + "\n") is not None
    assert console("[fedunlearn] results in /tmp/x\n") == "[fedunlearn] results in /tmp/x\n"


def test_fedunlearn_run_ends_a_refused_run_with_one_line_and_status_1(tmp_path, monkeypatch, capsys):
    import simulations.run as runner

    printed = tmp_path / "stream.txt"  # the stand-in's output; its command line is echoed
    printed.write_text("".join(x + "\n" for x in REFUSED))
    script = f"import sys; sys.stdout.write(open({str(printed)!r}).read())"
    monkeypatch.setattr(runner, "build_flwr_command", lambda *a: [sys.executable, "-c", script])
    monkeypatch.setattr(runner, "ensure_local_superlink", lambda env, timeout: None)  # no SuperLink
    code = runner.main(["--output-dir", str(tmp_path / "out"), "--set", "rounds=1"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in out + err and "Exit Code" not in out + err
    assert out.count("invalid unlearn-clients='5'") == 1
    assert "fedunlearn-run: run None failed: invalid unlearn-clients='5'" in err
