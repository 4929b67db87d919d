"""``fedunlearn compare RUN RUN...``: several runs' unlearning comparisons side by side.

One row per (run, request, method) with the columns that decide which method to trust (accuracy
on the test set, on the forgotten clients' data and on the remaining clients', the distance to
retraining, time, the flag, the forgetting verdict and what the method did), after the settings
that differ between the runs (dataset, partitioning, seed, ...). Printed as a console table; with
an output folder also ``compare.csv``, ``compare.md`` and ``compare.png``
(:mod:`fedunlearn.reporting.compare_figure`). Runs are read as untrusted input
(:mod:`fedunlearn.reporting.run_files`); the standard library only, but for the figure.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError
from fedunlearn.reporting.html_blocks import fmt
from fedunlearn.reporting.html_report import UNLEARNING_LOG, request_tables
from fedunlearn.reporting.run_files import RunFolder, Table, number, open_run

__all__ = [
    "COLUMNS",
    "Comparison",
    "compare_runs",
    "differing_settings",
    "run_labels",
    "to_console",
    "to_csv",
    "to_markdown",
    "write_comparison",
]

#: The comparison's columns, after ``run``, ``request``, ``forgot`` (its targets, from the
#: unlearning log) and the differing settings.
#: ``remaining_accuracy``: the mean of the remaining clients' accuracies (client_accuracy.csv).
COLUMNS = (
    "method",
    "test_accuracy",
    "target_accuracy",
    "remaining_accuracy",
    "l2_to_fedretrain",
    "attack_success",
    "seconds",
    "speedup_vs_fedretrain",
    "forgetting",
    "flag",
    "did",
)
#: Settings that differ between any two runs without saying anything about them.
IGNORED_SETTINGS = frozenset({"run-name", "output-dir", "data-root", "resume", "download"})
#: The console shows at most this many characters of ``flag`` and ``did`` (the CSV keeps them).
CONSOLE_TEXT = 48


@dataclass
class Comparison:
    """The side-by-side table: ``columns`` and ``rows`` (dicts of text), and the settings that
    differ between the runs (``{key: [value per run]}``, runs in ``labels`` order)."""

    labels: list[str]
    settings: dict[str, list[Any]]
    columns: list[str]
    rows: list[dict[str, str]]


def run_labels(paths: Sequence[Path]) -> list[str]:
    """Each run's shortest trailing path that tells it from the others (``seed-0``, or
    ``fedavg/digits-1`` where two runs share a name)."""
    parts = [Path(p).resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def _open_all(paths: Sequence[Path]) -> list[RunFolder]:
    """Every run, or one error naming each path that is not a run or holds no comparison."""
    runs = [open_run(p) for p in paths]
    missing = [str(run.path) for run in runs if not request_tables(run)]
    if missing:
        raise ConfigError(
            "RUN",
            ", ".join(missing),
            "run directories holding an unlearning comparison (unlearning.csv, written by a "
            "run with unlearn-clients set); these hold none",
        )
    return runs


def differing_settings(configs: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """``{key: [each run's value]}`` for the keys whose values are not all equal (a key a run
    lacks counts as ``None``), in key order."""
    keys = sorted({k for config in configs for k in config} - IGNORED_SETTINGS)
    found = {}
    for key in keys:
        values = [config.get(key) for config in configs]
        if any(v != values[0] for v in values[1:]):
            found[key] = values
    return found


def _remaining(run: RunFolder, suffix: str) -> dict[str, str]:
    """Each method's mean accuracy over the remaining clients, from client_accuracy.csv."""
    table = run.read_table(f"client_accuracy{suffix}.csv")
    if table is None:
        return {}
    sums: dict[str, list[float]] = {}
    for row in table.rows:
        value = number(row.get("accuracy", ""))
        if value is not None:
            sums.setdefault(row.get("method", ""), []).append(value)
    return {m: repr(sum(v) / len(v)) for m, v in sums.items() if v}


def _rows(run: RunFolder, label: str, settings: dict[str, Any]) -> list[dict[str, str]]:
    targets = {r.get("suffix", ""): r.get("targets") for r in run.read_jsonl(UNLEARNING_LOG)}
    rows = []
    for suffix, name in request_tables(run):
        table: Table | None = run.read_table(name)
        if table is None:
            raise ConfigError("RUN", str(run.path), f"a run whose {name} can be read")
        remaining = _remaining(run, suffix)
        for row in table.rows:
            cells = {c: row.get(c, "") for c in COLUMNS}
            cells["remaining_accuracy"] = remaining.get(row.get("method", ""), "")
            request = {
                "run": label,
                "request": suffix[1:] or "1",
                "forgot": fmt(targets.get(suffix)),
            }
            rows.append({**request, **_texts(settings), **cells})
    return rows


def _texts(settings: Mapping[str, Any]) -> dict[str, str]:
    return {k: fmt(v) for k, v in settings.items()}


def compare_runs(paths: Sequence[Path]) -> Comparison:
    """The side-by-side comparison of the runs ``paths`` (a ConfigError naming each path that is
    not a run, or holds no unlearning comparison)."""
    runs = _open_all(paths)
    labels = run_labels([run.path for run in runs])
    configs = [run.read_json("config.json") for run in runs]
    configs = [c if isinstance(c, dict) else {} for c in configs]
    settings = differing_settings(configs)
    rows = []
    for index, (run, label) in enumerate(zip(runs, labels)):
        rows += _rows(run, label, {k: v[index] for k, v in settings.items()})
    present = [c for c in COLUMNS if c == "method" or any(r[c] for r in rows)]
    return Comparison(labels, settings, ["run", "request", "forgot", *settings, *present], rows)


def to_csv(comparison: Comparison) -> str:
    """Every row and column, the numbers as the runs wrote them."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, comparison.columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(comparison.rows)
    return buffer.getvalue()


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_markdown_cell(c) for c in row) + " |" for row in rows]


def settings_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The differing settings as a table: a row per key, a column per run."""
    rows = [[key, *(fmt(v) for v in values)] for key, values in comparison.settings.items()]
    return ["setting", *comparison.labels], rows


def result_columns(comparison: Comparison) -> list[str]:
    """The columns but the settings (those are in :func:`settings_rows`)."""
    return [c for c in comparison.columns if c not in comparison.settings]


def to_markdown(comparison: Comparison) -> str:
    """The settings that differ (a column per run), then the table (numbers to 4 significant
    digits; every setting column is in the CSV)."""
    lines = [f"Runs: {', '.join(comparison.labels)}.", ""]
    if comparison.settings:
        lines += ["Settings that differ:", "", *_markdown_table(*settings_rows(comparison)), ""]
    else:
        lines += ["The runs' settings are the same (but for their names and folders).", ""]
    columns = result_columns(comparison)
    rows = [[fmt(row.get(c, "")) for c in columns] for row in comparison.rows]
    return "\n".join([*lines, *_markdown_table(columns, rows)]) + "\n"


def _aligned(columns: Sequence[str], cells: Sequence[Sequence[str]], left: set[str]) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if c in left else v.rjust(w) for v, w, c in zip(values, widths, columns)
        ).rstrip()

    header = line(columns)
    return [header, "-" * len(header), *(line(r) for r in cells)]


def to_console(comparison: Comparison) -> str:
    """The differing settings, then an aligned table; ``flag`` and ``did`` cut to
    :data:`CONSOLE_TEXT` characters (the CSV keeps them whole)."""

    def shown(row: Mapping[str, str], column: str) -> str:
        text = fmt(row.get(column, "")).replace("\n", " ")
        if column in ("flag", "did") and len(text) > CONSOLE_TEXT:
            return text[: CONSOLE_TEXT - 3] + "..."
        return text or "-"

    lines = []
    if comparison.settings:
        columns, rows = settings_rows(comparison)
        lines += ["settings that differ:", *_aligned(columns, rows, set(columns)), ""]
    columns = result_columns(comparison)
    cells = [[shown(row, c) for c in columns] for row in comparison.rows]
    return "\n".join(
        lines + _aligned(columns, cells, {"run", "method", "forgetting", "flag", "did"})
    )


def write_comparison(comparison: Comparison, folder: Path) -> list[Path]:
    """Write ``compare.csv``, ``compare.md`` and ``compare.png`` into ``folder``; their paths."""
    from fedunlearn.reporting.compare_figure import plot_comparison
    from fedunlearn.store.durable_io import atomic_write_bytes

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError("--out", str(folder), "a folder to write compare.csv/.md/.png into")
    written = []
    for name, text in (
        ("compare.csv", to_csv(comparison)),
        ("compare.md", to_markdown(comparison)),
    ):
        atomic_write_bytes(folder / name, text.encode("utf-8"))
        written.append(folder / name)
    written.append(plot_comparison(comparison, folder / "compare.png"))
    return written
