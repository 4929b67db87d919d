"""``fedunlearn report RUN``: one self-contained HTML page of a run directory.

The page shows the run's training (``metrics.csv``, ``training.png``), each unlearning request's
comparison (``unlearning[-n].csv`` with its ``flag``, ``forgetting`` and ``did`` columns, what the
request adopted), the certified head's ledger and summary, the scrubbing, judge and membership
tables, every figure of the run (``*.png``, embedded as data URIs, each once, beside its table when
it has one) and the configuration, grouped as ``docs/configuration.md`` groups it. It carries no
script and loads nothing: one file to open in a browser or send by mail.

The run directory is untrusted input (:mod:`fedunlearn.reporting.run_files`): every string is
escaped, links out of the run are not followed, every file is read up to a cap. Flower-free.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedunlearn.reporting import html_blocks as blocks
from fedunlearn.reporting.config_table import config_html
from fedunlearn.reporting.run_files import RunFolder, Table, number, open_run

__all__ = ["REPORT_NAME", "build_report", "request_tables", "write_report"]

REPORT_NAME = "report.html"
#: :data:`fedunlearn.store.run_directory.UNLEARNING_LOG` and ``CERTIFIED_LEDGER``, spelled here:
#: that module imports PyTorch, and a report needs none (a test checks they agree).
UNLEARNING_LOG = "unlearning_log.jsonl"
CERTIFIED_LEDGER = "certified_removal.jsonl"
#: The comparison's columns shown first (the rest under "every column"); attack and forgetting
#: only where some row has a value.
KEY_COLUMNS = (
    "method",
    "test_accuracy",
    "target_accuracy",
    "attack_success",
    "forgetting",
    "l2_to_fedretrain",
    "worst_client_drop",
    "seconds",
    "flag",
    "did",
)
_OPTIONAL = ("attack_success", "forgetting")
#: The ledger's columns shown (``fedunlearn certificates`` prints the same).
LEDGER_COLUMNS = (
    "request kind removed n_after beta_after budget retrained certified total_epsilon "
    "total_delta seconds"
).split()
#: The figures each section shows (``{s}``: a request's suffix, "" or "-<n>").
REQUEST_FIGURES = ("unlearning{s}.png", "tradeoff{s}.png", "last_layer_angles{s}.png")
SECTIONS = (
    ("Certified removal", "certified_removal", ("certified_removal*.png",)),
    ("Scrubbing", "scrubbing", ("scrubbing*.png",)),
    ("Scrubbing tradeoff", "scrubbing_tradeoff", ()),
    ("Judge", "judge", ("judge*.png",)),
    ("Membership audit", "membership", ("membership*.png",)),
)


def request_tables(run: RunFolder) -> list[tuple[str, str]]:
    """(suffix, file name) of each request's comparison, in request order."""
    found = []
    for name in run.names("unlearning*.csv"):
        match = re.fullmatch(r"unlearning(-\d+)?\.csv", name)
        if match:
            found.append((match.group(1) or "", name))
    return sorted(found, key=lambda item: int(item[0][1:] or 1))


class _Page:
    """The page as it is built: its sections, and the figures already shown."""

    def __init__(self, run: RunFolder) -> None:
        self.run = run
        self.sections: list[tuple[str, str]] = []
        self.shown: set[str] = set()

    def add(self, title: str, body: str) -> None:
        if body:
            self.sections.append((title, body))

    def figures(self, names) -> str:
        """The figures ``names`` not shown yet (each PNG of the run appears once)."""
        parts = []
        for name in names:
            if name in self.shown or self.run.file(name) is None:
                continue
            self.shown.add(name)
            image = self.run.read_png(name)
            if image is not None:
                parts.append(blocks.figure_html(name, *image))
        return "".join(parts)

    def matching(self, pattern: str) -> list[str]:
        return self.run.names(pattern)


def _training(page: _Page) -> str:
    metrics = page.run.read_table("metrics.csv")
    body = ""
    if metrics is not None and metrics.rows:
        body += blocks.key_value_html(_training_facts(metrics))
        body += blocks.details_html(
            f"every round ({len(metrics.rows)} rows of metrics.csv)", blocks.csv_table_html(metrics)
        )
    summary = page.run.read_json("summary.json")
    if isinstance(summary, dict):
        body += "<h3>summary.json</h3>" + blocks.key_value_html(blocks.flatten(summary))
    return body + page.figures(["training.png"])


def _training_facts(metrics: Table) -> list[tuple[str, str]]:
    accuracy = [number(v) for v in metrics.column("test_accuracy")]
    accuracy = [a for a in accuracy if a is not None]
    rounds = [number(v) for v in metrics.column("round")]
    facts = [("rounds", max((r for r in rounds if r is not None), default=0))]
    if accuracy:
        facts += [("final test accuracy", accuracy[-1]), ("best test accuracy", max(accuracy))]
    elapsed = [number(v) for v in metrics.column("elapsed_seconds")]
    if elapsed and elapsed[-1] is not None:
        facts.append(("seconds", elapsed[-1]))
    return facts


def _request(page: _Page, suffix: str, name: str, record: dict | None) -> str:
    table = page.run.read_table(name)
    if table is None:
        return ""
    body = _request_line(record) if record else ""
    key = [c for c in KEY_COLUMNS if c in table.columns]
    key = [c for c in key if c not in _OPTIONAL or any(v.strip() for v in table.column(c))]
    body += blocks.csv_table_html(table, key)
    flagged = [(r.get("method", ""), r.get("flag", "")) for r in table.rows if r.get("flag")]
    if flagged:
        body += "".join(
            f'<p class="flag">flag: {blocks.esc(m)}: {blocks.esc(f)}</p>' for m, f in flagged
        )
    body += blocks.details_html(f"every column ({name})", blocks.csv_table_html(table))
    clients = page.run.read_table(f"client_accuracy{suffix}.csv")
    if clients is not None:
        body += f"<h3>client_accuracy{blocks.esc(suffix)}.csv</h3>" + _pivot(clients)
    names = [f.format(s=suffix) for f in REQUEST_FIGURES] + [f"client_accuracy{suffix}.png"]
    return body + page.figures(names)


def _request_line(record: dict) -> str:
    parts = [f"forgot client(s) {record.get('targets')}"]
    if record.get("adopted"):
        parts.append(f"adopted {record['adopted']} ({record.get('adoption', '')})")
    if record.get("refused_methods"):
        parts.append(f"refused: {record['refused_methods']}")
    when = f" at {record['time']}" if record.get("time") else ""
    return (
        f"<p>request {blocks.esc(record.get('request'))}{blocks.esc(when)}: "
        + blocks.esc("; ".join(parts))
        + "</p>"
    )


def _pivot(clients: Table) -> str:
    """``client_accuracy.csv`` (method, client, accuracy rows) as a method x client table."""
    if not {"method", "client", "accuracy"} <= set(clients.columns):
        return blocks.csv_table_html(clients)
    methods = list(dict.fromkeys(clients.column("method")))
    ids = list(dict.fromkeys(clients.column("client")))
    cell = {(r["method"], r["client"]): r["accuracy"] for r in clients.rows}
    rows = [[m, *(blocks.fmt(cell.get((m, c), "")) for c in ids)] for m in methods]
    return blocks.table_html(["method", *(f"client {c}" for c in ids)], rows)


def _requests(page: _Page) -> None:
    records = {r.get("suffix", ""): r for r in page.run.read_jsonl(UNLEARNING_LOG)}
    for suffix, name in request_tables(page.run):
        number_ = suffix[1:] or "1"
        page.add(f"Unlearning request {number_}", _request(page, suffix, name, records.get(suffix)))


def _certified(page: _Page) -> str:
    body = ""
    summary = page.run.read_json("certified_summary.json")
    if isinstance(summary, dict):
        body += "<h3>certified_summary.json</h3>" + blocks.key_value_html(blocks.flatten(summary))
    ledger = page.run.read_jsonl(CERTIFIED_LEDGER)
    if ledger:
        rows = [[blocks.fmt(r.get(c)) for c in LEDGER_COLUMNS] for r in ledger]
        shown = (
            rows if len(rows) <= blocks.MAX_ROWS else rows[:20] + rows[-(blocks.MAX_ROWS - 20) :]
        )
        body += f"<h3>{CERTIFIED_LEDGER}: {len(ledger)} certificate(s)</h3>"
        body += (
            '<p class="note">seals not checked here: fedunlearn store verify RUN checks them</p>'
        )
        body += blocks.table_html(LEDGER_COLUMNS, shown, total=len(rows), source=CERTIFIED_LEDGER)
    return body


def _tables(page: _Page) -> None:
    """The certified head's, scrubbing's, the judge's and the audit's tables and figures."""
    for title, stem, figures in SECTIONS:
        body = _certified(page) if stem == "certified_removal" else ""
        table = page.run.read_table(f"{stem}.csv")
        if table is not None:
            body += f"<h3>{stem}.csv</h3>" + blocks.csv_table_html(table)
        if stem == "judge":
            verdict = page.run.read_json("judge.json")
            if isinstance(verdict, dict):
                body += "<h3>judge.json</h3>" + blocks.key_value_html(blocks.flatten(verdict))
        body += page.figures([n for pattern in figures for n in page.matching(pattern)])
        page.add(title, body)


def _covered(name: str) -> bool:
    stems = ("metrics", "unlearning", "client_accuracy", *(stem for _, stem, _ in SECTIONS))
    return any(re.fullmatch(rf"{re.escape(s)}(-\d+)?\.csv", name) for s in stems)


def _other_tables(page: _Page) -> str:
    body = ""
    for name in page.run.names("*.csv"):
        table = None if _covered(name) else page.run.read_table(name)
        if table is not None:
            body += f"<h3>{blocks.esc(name)}</h3>" + blocks.csv_table_html(table)
    return body


def _history(page: _Page) -> str:
    rows = [
        [r.get(c, "") for c in ("request", "time", "targets", "adopted", "original", "moved")]
        for r in page.run.read_jsonl("history_log.jsonl")
    ]
    if not rows:
        return ""
    columns = ["request", "time", "targets", "adopted", "kept under", "moved"]
    return blocks.table_html(columns, [[blocks.fmt(c) for c in row] for row in rows])


def build_report(path: Path) -> str:
    """The HTML page of the run directory ``path``; a ConfigError when it is not one."""
    run = open_run(path)
    page = _Page(run)
    config = run.read_json("config.json")
    config = config if isinstance(config, dict) else {}
    page.add("Training", _training(page))
    _requests(page)
    page.add("History rewrites (history_log.jsonl)", _history(page))
    _tables(page)
    page.add("Other tables", _other_tables(page))
    page.add("Other figures", page.figures(run.figures()))
    page.add("Configuration (config.json)", config_html(config))
    notes = list(dict.fromkeys(run.skipped))
    if notes:
        page.add("Left out", "<ul>" + "".join(f"<li>{blocks.esc(n)}</li>" for n in notes) + "</ul>")
    return blocks.page_html(f"fedunlearn report: {run.path.name}", _body(run, config, page))


def _body(run: RunFolder, config: dict, page: _Page) -> str:
    identity = run.read_json("identity.json")
    facts = [f"run directory {run.path}"]
    if isinstance(identity, dict) and identity.get("run_id"):
        facts.append(f"run id {identity['run_id']}, created {identity.get('created_at', '?')}")
    settings = ("dataset", "partitioning", "num-clients", "rounds", "seed", "unlearn-clients")
    facts.append(", ".join(f"{k} {config[k]}" for k in settings if k in config))
    nav = "".join(f'<a href="#{blocks.anchor(t)}">{blocks.esc(t)}</a>' for t, _ in page.sections)
    parts = [
        f"<h1>{blocks.esc(config.get('run-name') or run.path.name)}</h1>",
        *(f'<p class="muted">{blocks.esc(f)}</p>' for f in facts if f),
        f"<nav>{nav}</nav>",
    ]
    for title, body in page.sections:
        parts.append(
            f'<section id="{blocks.anchor(title)}"><h2>{blocks.esc(title)}</h2>{body}</section>'
        )
    return "\n".join(parts)


def write_report(path: Path, out: Path | None = None) -> Path:
    """Write the page of run ``path`` to ``out`` (default ``path/report.html``), mode 0600 like
    every file of a run, whole or not at all; returns where it went."""
    from fedunlearn.store.durable_io import atomic_write_bytes

    page = build_report(path)
    target = Path(out) if out is not None else Path(path) / REPORT_NAME
    if target.is_dir():
        target = target / REPORT_NAME
    atomic_write_bytes(target, page.encode("utf-8"))
    return target
