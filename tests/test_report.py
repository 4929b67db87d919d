"""``fedunlearn report`` and ``fedunlearn compare`` on a real finished run, without a browser: the
page shows every figure of the run as its own bytes and every method of the comparison, escapes
what a hostile run directory plants, follows no link out of the run; a folder that is not a run,
and a run without its comparison, are refused by name."""

from __future__ import annotations

import base64
import csv
import json
import shutil
import stat
from pathlib import Path

import pytest

from fedunlearn.cli import main
from fedunlearn.errors import ConfigError
from fedunlearn.reporting import html_report, run_files
from fedunlearn.reporting.compare import compare_runs, to_console, to_csv, write_comparison
from fedunlearn.reporting.html_report import build_report
from simulations.benchmarks.report_in_browser import check_dom

HOSTILE = "<script>alert(1)</script>"


def _copy(run: Path, target: Path) -> Path:
    shutil.copytree(run, target, symlinks=True)
    return target


def _edit_config(run: Path, **changes) -> None:
    path = run / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_the_page_holds_every_figure_as_its_bytes_and_every_method_row(finished_run):
    page = build_report(finished_run)
    figures = sorted(finished_run.glob("*.png"))
    assert len(figures) >= 5  # training, unlearning, tradeoff, client accuracy, certified ...
    for figure in figures:
        assert base64.b64encode(figure.read_bytes()).decode() in page, figure.name
    assert check_dom(finished_run, page) == []  # the browser test's own check, on the file
    methods = [row["method"] for row in csv.DictReader((finished_run / "unlearning.csv").open())]
    assert {"fedavg", "federaser", "fedaccum", "fedretrain"} <= set(methods)
    ledger = (finished_run / "certified_removal.jsonl").read_text().splitlines()
    assert f"certified_removal.jsonl: {len(ledger)} certificate(s)" in page
    assert "adopted federaser" in page and "<script" not in page
    assert page.count("<img ") == len(figures)


def test_a_hostile_run_directory_is_escaped_and_its_links_out_not_followed(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path / "run")
    _edit_config(run, **{"run-name": HOSTILE, '"><img src=x onerror=alert(1)>': HOSTILE})
    with open(run / "unlearning.csv") as handle:
        rows = list(csv.DictReader(handle))
    rows[1]["did"], rows[1]["method"] = HOSTILE, "<b onmouseover=alert(1)>m</b>"
    with open(run / "unlearning.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    shutil.copy(run / "training.png", run / "<script>alert(1).png")
    secret = tmp_path / "outside.png"
    secret.write_bytes((run / "unlearning.png").read_bytes() + b"outside")
    (run / "linked.png").symlink_to(secret)
    (run / "metrics.csv").unlink()
    (run / "metrics.csv").symlink_to(tmp_path / "outside.csv")
    (tmp_path / "outside.csv").write_text("round,test_accuracy\n1,0.123456789\n")
    page = build_report(run)
    assert "<script" not in page.lower() and "<img src=x" not in page and "<b " not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert base64.b64encode(secret.read_bytes()).decode() not in page
    assert "linked.png: a link out of the run, not followed" in page
    assert "0.1235" not in page  # the linked-out metrics
    assert check_dom(run, page) == []  # the planted figure too, under its escaped name


def test_a_figure_over_the_cap_is_left_out_and_named(finished_run, monkeypatch):
    monkeypatch.setattr(run_files, "FIGURE_CAP", 1000)
    page = build_report(finished_run)
    assert "<img " not in page
    assert "training.png: over 1,000 bytes, left out" in page


def test_the_logs_names_are_the_run_directorys():
    from fedunlearn.store import run_directory

    assert html_report.UNLEARNING_LOG == run_directory.UNLEARNING_LOG
    assert html_report.CERTIFIED_LEDGER == run_directory.CERTIFIED_LEDGER


def test_report_writes_one_private_page_into_the_run_and_refuses_a_non_run(
    finished_run, tmp_path, capsys
):
    run = _copy(finished_run, tmp_path / "run")
    assert main(["report", str(run)]) == 0
    page = run / "report.html"
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"invalid RUN='{tmp_path}'" in error and "config.json" in error
    with pytest.raises(ConfigError, match="a run directory"):
        build_report(tmp_path / "missing")


def test_compare_refuses_the_runs_without_a_comparison_by_name(finished_run, tmp_path):
    bare = _copy(finished_run, tmp_path / "bare")
    (bare / "unlearning.csv").unlink()
    with pytest.raises(ConfigError) as refused:
        compare_runs([finished_run, bare])
    assert str(bare) in str(refused.value) and f"'{finished_run}" not in str(refused.value)
    assert "unlearning.csv" in str(refused.value)


def test_compare_shows_each_run_s_methods_and_the_settings_that_differ(
    finished_run, tmp_path, capsys
):
    other = _copy(finished_run, tmp_path / "seeds" / "finished")
    _edit_config(other, seed=7)
    comparison = compare_runs([finished_run, other])
    assert comparison.settings == {"seed": [0, 7]}
    labels = comparison.labels
    assert len(set(labels)) == 2 and all(label.endswith("finished") for label in labels)
    methods = [row["method"] for row in csv.DictReader((finished_run / "unlearning.csv").open())]
    assert [(r["run"], r["method"]) for r in comparison.rows] == [
        (label, method) for label in labels for method in methods
    ]
    table = list(csv.DictReader(to_csv(comparison).splitlines()))
    assert {"seed", "test_accuracy", "target_accuracy", "remaining_accuracy", "did"} <= set(
        table[0]
    )
    assert "seed" in to_console(comparison)
    written = write_comparison(comparison, tmp_path / "out")
    assert [p.name for p in written] == ["compare.csv", "compare.md", "compare.png"]
    assert run_files.png_size((tmp_path / "out" / "compare.png").read_bytes()) is not None
    assert main(["compare", str(finished_run), str(other)]) == 0
    assert "fedretrain" in capsys.readouterr().out


def test_the_judge_s_intervals_fold_into_their_value_and_partition_sizes_into_one_row(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"seed": 1}')
    (run / "judge.csv").write_text("population,f,f-low,f-high,seconds\nfedau,0.5,0.4,0.6,2\n")
    (run / "summary.json").write_text('{"partition_sizes": {"0": 135, "1": 134}}')
    page = build_report(run)
    assert "0.5 [0.4, 0.6]" in page and "f-low" not in page
    assert "<td>partition_sizes</td>" in page.replace(' class="text"', "")
    assert "0: 135, 1: 134" in page
