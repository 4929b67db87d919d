"""Progress with an ETA: the ServerApp's progress lines (fedunlearn.progress) and how
fedunlearn-run shows them (simulations.progress_display): bars on a terminal, a few plain lines
elsewhere, none of either with FEDUNLEARN_PROGRESS=0."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedunlearn.progress import (
    Progress,
    ProgressLine,
    eta_seconds,
    format_duration,
    parse_progress,
)
from simulations.console import ConsoleFilter
from simulations.progress_display import PLAIN_INTERVAL, ProgressDisplay, bars_wanted
from simulations.run import stream_run


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_task(durations: list[float], *, min_interval: float = 2.0) -> list[str]:
    """The lines a task whose steps take ``durations`` seconds logs."""
    clock, lines = FakeClock(), []
    progress = Progress("training", len(durations), log=lines.append, clock=clock)
    progress.start()
    for seconds in durations:
        clock.now += seconds
        progress.advance()
    return lines


#: a machine shared with other jobs is slow to generate examples: no deadline, no speed check
SHARED_MACHINE = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SHARED_MACHINE
@given(st.lists(st.floats(0, 1e5, allow_nan=False), min_size=1, max_size=40))
def test_the_eta_is_never_negative_and_the_task_ends_at_100_percent_with_eta_0(durations):
    lines = [parse_progress(line) for line in run_task(durations)]
    assert all(line is not None for line in lines)
    assert all(line.eta is None or line.eta >= 0 for line in lines)
    assert lines[0].done == 0 and lines[0].eta is None  # the start: no pace yet
    last = lines[-1]
    assert (last.done, last.total, last.eta, last.finished) == (len(durations),) * 2 + (0, True)
    assert [line.done for line in lines] == sorted(line.done for line in lines)


def test_the_eta_is_the_mean_pace_times_the_steps_left():
    assert eta_seconds(4, 20, 40.0) == 160.0
    assert eta_seconds(12, 20, 40.0, initial=10) == 160.0  # a resumed run's own pace
    assert eta_seconds(10, 20, 40.0, initial=10) is None
    assert eta_seconds(20, 20, 40.0) == 0.0


@SHARED_MACHINE
@given(
    st.text(
        st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_categories=("Zs", "Cc")),
        min_size=1,
        max_size=20,
    ),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.sampled_from(["rounds", "methods", "procedures"]),
    st.integers(0, 10**7),
    st.one_of(st.none(), st.integers(0, 10**7)),
)
def test_a_line_reads_back_as_it_was_written(task, done, extra, unit, elapsed, eta):
    line = ProgressLine(task, done, done + extra, unit, float(elapsed), eta and float(eta))
    assert parse_progress(line.format()) == line
    assert parse_progress("[fedunlearn] " + line.format()) == line


def test_a_line_reads_as_plain_text_and_other_lines_are_no_progress():
    line = ProgressLine("fedretrain", 7, 20, "rounds", 21.4, 3725.0)
    assert line.format() == "progress: fedretrain 7/20 rounds, elapsed 0:21, ETA 1:02:05"
    assert format_duration(59.99) == "0:59"
    # a task not done never says 0:00 left: the ETA is rounded up, the elapsed time down
    short = ProgressLine("federaser", 1, 10, "rounds", 0.4, 3.6).format()
    assert short.endswith("1/10 rounds, elapsed 0:00, ETA 0:04")
    for other in (
        "[fedunlearn] round 7/20  test accuracy 0.98",
        "[fedunlearn] fedretrain: round 1/20, 9 clients, test accuracy 0.9044, 0.6s",
        "progress: training 3/20 rounds",
    ):
        assert parse_progress(other) is None


def test_lines_come_at_a_modest_rate_but_the_first_and_last_step_always():
    lines = run_task([0.5] * 20)  # 10 s in all, at most one line per 2 s
    done = [parse_progress(line).done for line in lines]
    assert done[:2] == [0, 1] and done[-1] == 20
    assert len(lines) <= 2 + 10 // 2 + 1


def test_a_resumed_task_counts_from_where_it_stopped():
    clock, lines = FakeClock(), []
    progress = Progress("training", 20, log=lines.append, initial=15, clock=clock).start()
    clock.now += 10
    progress.advance()
    assert lines[-1] == "progress: training 16/20 rounds, elapsed 0:10, ETA 0:40"


# ---------------------------------------------------------------- the launcher
def progress_stream(task: str = "training", total: int = 4, step: float = 10.0) -> list[str]:
    lines = []
    for done in range(total + 1):
        eta = None if done == 0 else step * (total - done)
        lines.append(
            "[fedunlearn] " + ProgressLine(task, done, total, "rounds", step * done, eta).format()
        )
        if done:
            lines.append(f"[fedunlearn] round {done}/{total}  test accuracy 0.9")
    return lines


def fake_flwr(lines: list[str], display: ProgressDisplay) -> str:
    """stream_run on a stand-in for `flwr run --stream` printing ``lines``; what reached `out`."""
    script = f"import sys; sys.stdout.write({''.join(line + chr(10) for line in lines)!r})"
    code, _ = stream_run(
        [sys.executable, "-c", script], {}, ConsoleFilter(), display.out, display=display
    )
    assert code == 0
    return display.out.getvalue()


def test_the_launcher_draws_progress_lines_as_a_bar_and_prints_the_others_above_it():
    bars = io.StringIO()
    printed = fake_flwr(progress_stream(), ProgressDisplay(io.StringIO(), bars=True, bar_file=bars))
    assert "progress:" not in printed
    assert printed.splitlines() == [
        f"[fedunlearn] round {r}/4  test accuracy 0.9" for r in range(1, 5)
    ]
    drawn = bars.getvalue()
    assert "training:  25%|" in drawn and "1/4 rounds, elapsed 0:10, ETA 0:30" in drawn
    assert "training: 100%|" in drawn and "4/4 rounds, elapsed 0:40, ETA 0:00" in drawn


def test_an_inner_task_gets_its_own_bar_which_goes_when_the_outer_one_moves_on():
    out, bars = io.StringIO(), io.StringIO()
    display = ProgressDisplay(out, bars=True, bar_file=bars)
    for text in (
        "progress: unlearning 0/3 methods, elapsed 0:00, ETA ?",
        "progress: fedretrain 2/20 rounds, elapsed 0:04, ETA 0:36",  # refused after round 2
    ):
        display.update(parse_progress(text), text)
    assert list(display._open) == ["unlearning", "fedretrain"]
    text = "progress: unlearning 1/3 methods, elapsed 0:05, ETA 0:10"
    display.update(parse_progress(text), text)
    assert list(display._open) == ["unlearning"]
    display.close()
    assert display._open == {} and out.getvalue() == ""


def test_without_a_terminal_a_task_prints_its_first_eta_then_one_line_every_30_s():
    printed = fake_flwr(progress_stream(total=8), ProgressDisplay(io.StringIO(), bars=False))
    shown = [parse_progress(line) for line in printed.splitlines() if parse_progress(line)]
    assert [line.done for line in shown] == [1, 4, 7]  # elapsed 10 s, 40 s, 70 s; not 0/8, 8/8
    assert all(b.elapsed - a.elapsed >= PLAIN_INTERVAL for a, b in zip(shown, shown[1:]))
    assert printed.count("test accuracy") == 8  # every other line of ours


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("tty", "setting", "wanted"),
    [
        (False, None, False),
        (True, None, True),
        (True, "0", False),
        (False, "1", True),
        (True, "", True),
    ],
)
def test_bars_only_on_a_terminal_unless_fedunlearn_progress_says(tty, setting, wanted):
    environ = {} if setting is None else {"FEDUNLEARN_PROGRESS": setting}
    assert bars_wanted(Stream(tty), environ) is wanted


def test_stream_run_draws_no_bar_when_standard_error_is_no_terminal(monkeypatch):
    monkeypatch.delenv("FEDUNLEARN_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", Stream(False))
    out = io.StringIO()
    script = "print('[fedunlearn] progress: training 1/4 rounds, elapsed 0:10, ETA 0:30')"
    stream_run([sys.executable, "-c", script], {}, ConsoleFilter(), out)
    assert sys.stderr.getvalue() == ""  # no bar
    assert out.getvalue() == "[fedunlearn] progress: training 1/4 rounds, elapsed 0:10, ETA 0:30\n"
