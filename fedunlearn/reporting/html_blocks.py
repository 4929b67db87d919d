"""The pieces of a report page: escaped text, tables, embedded figures, collapsible blocks.

Every string that comes from a run directory goes through :func:`esc` (``html.escape`` with
quotes) before it reaches the page; the page holds no script and no link to another resource.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedunlearn.reporting.run_files import Table, number

#: At most this many rows of a table are shown (the file keeps them all).
MAX_ROWS = 200
#: A value with its interval, as :func:`csv_table_html` folds ``x``, ``x-low``, ``x-high``.
INTERVAL = re.compile(r"\S+ \[\S+, \S+\]")
#: The columns that give a row of a comparison its class (``flag`` non-empty: flagged).
FLAG_COLUMN = "flag"

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1320px; color: #1b1b1b;
  padding: 0 16px; background: #fff; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { border-bottom: 2px solid #d0d7de; padding-top: 12px; }
h3 { margin-bottom: 6px; } .muted { color: #57606a; }
nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f6f8fa; text-align: left; }
td.text, th.text { text-align: left; } td.long { text-align: left; min-width: 240px; max-width: 480px; }
td.interval { white-space: nowrap; font-size: 12px; }
.group { display: inline-block; vertical-align: top; margin-right: 24px; }
tr.flagged td { background: #ffebe9; } tr.changed td { background: #fff8c5; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { display: block; margin: 8px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
figcaption { font-family: ui-monospace, monospace; font-size: 12px; color: #57606a; }
details { margin: 6px 0 14px; } summary { cursor: pointer; color: #0550ae; }
.flag { color: #a40e26; font-weight: 600; } .note { color: #57606a; font-size: 12px; }
code { font-family: ui-monospace, monospace; font-size: 12px; }
"""


def esc(value: Any) -> str:
    """``value`` as HTML text (``&``, ``<``, ``>`` and both quotes escaped)."""
    return html.escape(str(value), quote=True)


def anchor(text: str) -> str:
    """An id for a heading: lower-case letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "section"


def fmt(value: Any) -> str:
    """A table cell as shown: whole numbers as integers, other numbers to 4 significant digits,
    text as it is, nothing for empty and nan."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        parsed = number(value)
        if parsed is None:
            return "" if value.strip().lower() == "nan" else value
        if re.fullmatch(r"[+-]?\d+", value.strip()):
            return value.strip()
        value = parsed
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
    kind = "long" if len(text) > 30 else ("text" if number(text) is None and text else "")
    if INTERVAL.fullmatch(text):
        kind = "interval"
    return f'<td class="{kind}">{esc(text)}</td>' if kind else f"<td>{esc(text)}</td>"


def table_html(
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    row_classes: Sequence[str] | None = None,
    total: int | None = None,
    source: str = "",
) -> str:
    """An HTML table of text cells (escaped here); ``total`` rows when some were left out."""
    rows = list(rows)
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for index, row in enumerate(rows):
        css = row_classes[index] if row_classes else ""
        attribute = f' class="{esc(css)}"' if css else ""
        body.append(f"<tr{attribute}>" + "".join(_cell(str(c)) for c in row) + "</tr>")
    note = ""
    if total is not None and total > len(rows):
        note = f'<p class="note">{len(rows)} of {total} rows shown; every row: {esc(source)}</p>'
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>{note}"
    )


def interval_columns(columns: Sequence[str]) -> list[str]:
    """The columns shown: ``x-low`` and ``x-high`` fold into ``x`` when all three are there."""
    present = set(columns)

    def folded(column: str) -> bool:
        stem, _, end = column.rpartition("-")
        return end in ("low", "high") and {stem, f"{stem}-low", f"{stem}-high"} <= present

    return [c for c in columns if not folded(c)]


def _shown(row: Mapping[str, str], column: str, present: set[str]) -> str:
    text = fmt(row.get(column, ""))
    if {f"{column}-low", f"{column}-high"} <= present and text:
        low, high = (fmt(row.get(f"{column}-{end}", "")) for end in ("low", "high"))
        return f"{text} [{low}, {high}]"
    return text


def csv_table_html(table: Table, columns: Sequence[str] | None = None) -> str:
    """``table`` (its ``columns``, by default all, intervals folded) with flagged rows marked."""
    present = set(table.columns)
    shown = [c for c in (columns or interval_columns(table.columns)) if c in present]
    rows = table.rows[:MAX_ROWS]
    cells = [[_shown(row, c, present) for c in shown] for row in rows]
    classes = ["flagged" if row.get(FLAG_COLUMN, "").strip() else "" for row in rows]
    return table_html(shown, cells, row_classes=classes, total=len(table.rows), source=table.name)


def key_value_html(items: Iterable[tuple[str, Any]], classes: Sequence[str] = ()) -> str:
    """A two-column table, ``(name, value)`` a row."""
    items = list(items)
    return table_html(
        ["", "value"], [(k, fmt(v)) for k, v in items], row_classes=list(classes) or None
    )


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A JSON object as ``(dotted.key, leaf)`` pairs; lists stay whole, and so does an object
    keyed by numbers (partition sizes per client: one row, ``0: 135, 1: 135, ...``)."""
    if isinstance(value, dict) and value and prefix and all(str(k).isdigit() for k in value):
        if not any(isinstance(v, (dict, list)) for v in value.values()):
            return [(prefix, ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()))]
    if isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            pairs += flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return pairs or [(prefix, "{}")]
    return [(prefix, value)]


def figure_html(name: str, data: bytes, width: int, height: int) -> str:
    """A PNG embedded as a data URI, captioned with its file name."""
    encoded = base64.b64encode(data).decode("ascii")
    return (
        f'<figure id="figure-{anchor(name)}"><img src="data:image/png;base64,{encoded}" '
        f'width="{int(width)}" height="{int(height)}" alt="{esc(name)}" data-file="{esc(name)}">'
        f"<figcaption>{esc(name)} ({int(width)}×{int(height)})</figcaption></figure>"
    )


def details_html(summary: str, body: str) -> str:
    """A block that opens on a click (no script: HTML's own ``<details>``)."""
    return f"<details><summary>{esc(summary)}</summary>{body}</details>"


def page_html(title: str, body: str) -> str:
    """The whole page: no script, no external resource (its policy forbids both)."""
    policy = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
