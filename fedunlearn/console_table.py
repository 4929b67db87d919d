"""What the console shows of a comparison table (unlearning, scrubbing): the columns that decide
which row to trust, in at most :data:`CONSOLE_WIDTH` characters, then one line per method saying
what it did. The CSV and the ``.md`` beside it keep every column. Flower-free.

In the unlearning comparison the gap to FedRetrain is in test-accuracy points (the flag rule's
unit, :mod:`fedunlearn.unlearning.verdicts`); the attack's success shows only where a model was
attacked.
"""

from __future__ import annotations

import math

import pandas as pd

#: The widest line the console table may print (a terminal's common 120 columns).
CONSOLE_WIDTH = 120

#: (column of the comparison table, its console header, its format), in order. ``gap_points`` is
#: computed here; a column the table lacks prints "-", but for ``attack_success`` and
#: ``forgetting``, left out unless some model was attacked (the forgetting signal). The worst
#: client's drop is in points of accuracy against the original (positive: it lost).
UNLEARNING_COLUMNS = (
    ("method", "method", "{}"),
    ("test_accuracy", "test acc", "{:.4f}"),
    ("gap_points", "vs retrain", "{:+.2f}"),
    ("target_accuracy", "target acc", "{:.4f}"),
    ("attack_success", "attack", "{:.3f}"),
    ("forgetting", "forgot", "{}"),
    ("worst_client_drop", "worst drop", "{:.1f}"),
    ("seconds", "seconds", "{:.1f}"),
    ("client_epochs", "client-epochs", "{:.0f}"),
    ("communication_mb", "comm MB", "{:.1f}"),
    ("retained_mb", "kept MB", "{:.2f}"),
    ("flag", "flag", "{}"),
)
#: The scrubbing readouts (:mod:`fedunlearn.scrubbing.readouts`): errors on D_f (the forgotten
#: samples), D_r (the retained ones) and the test set, epochs to relearn D_f, the information
#: bound, seconds.
SCRUBBING_COLUMNS = (
    ("method", "method", "{}"),
    ("error_f", "error D_f", "{:.4f}"),
    ("error_r", "error D_r", "{:.4f}"),
    ("error_test", "error test", "{:.4f}"),
    ("error_test_class", "error test class", "{:.4f}"),
    ("relearn_epochs", "relearn epochs", "{:.3g}"),
    ("information_nats", "info nats", "{:.3g}"),
    ("seconds", "seconds", "{:.1f}"),
)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "{}" or isinstance(value, str):
        return str(value)
    return fmt.format(value)


def gap_points(table: pd.DataFrame, reference: str = "fedretrain") -> pd.Series:
    """Each row's test accuracy minus ``reference``'s, in points (NaN without a reference row)."""
    rows = table.loc[table["method"] == reference, "test_accuracy"]
    base = float(rows.iloc[0]) if len(rows) else float("nan")
    return (table["test_accuracy"] - base) * 100.0


def console_frame(table: pd.DataFrame, columns=UNLEARNING_COLUMNS) -> pd.DataFrame:
    """The console's cells (strings) of the comparison ``table``: ``columns``, as
    :data:`UNLEARNING_COLUMNS` lists them."""
    table = table.assign(gap_points=gap_points(table)) if "test_accuracy" in table else table
    if {"relearn_epochs", "relearn_reached", "relearn_budget_epochs"} <= set(table.columns):
        never = table["relearn_reached"].astype(str).str.lower() == "false"
        relearn = table["relearn_epochs"].astype(object)
        relearn[never] = [f"> {b:g}" for b in table.loc[never, "relearn_budget_epochs"]]
        table = table.assign(relearn_epochs=relearn)  # not relearned within the budget
    attacked = "attack_success" in table and table["attack_success"].notna().any()
    cells = {}
    for column, header, fmt in columns:
        if column in ("attack_success", "forgetting") and not attacked:
            continue
        if column == "flag":
            flags = table[column] if column in table else pd.Series([""] * len(table))
            cells[header] = ["FLAGGED" if f else "" for f in flags.fillna("")]
            continue
        values = table[column] if column in table else [None] * len(table)
        cells[header] = [_cell(v, fmt) for v in values]
    return pd.DataFrame(cells)


#: Columns given up, in this order, while a table of long method names is wider than the console.
DROPPED_FIRST = (
    "comm MB",
    "seconds",
    "target acc",
    "worst drop",
    "error test class",
    "info nats",
)


def _markdown(frame: pd.DataFrame) -> list[str]:
    """``frame`` (strings) as markdown lines, one space of padding, the first and last columns
    left-aligned, the numbers right-aligned."""
    widths = [max([len(h), 3, *map(len, frame[h])]) for h in frame.columns]
    left = {0, len(widths) - 1} if frame.columns[-1] == "flag" else {0}
    align = [str.ljust if i in left else str.rjust for i in range(len(widths))]
    rule = [":" + "-" * (w + 1) if i in left else "-" * (w + 1) + ":" for i, w in enumerate(widths)]

    def line(cells) -> str:
        return "| " + " | ".join(a(c, w) for a, c, w in zip(align, cells, widths)) + " |"

    return [line(frame.columns), "|" + "|".join(rule) + "|"] + [
        line(row) for row in frame.itertuples(index=False)
    ]


def console_table(
    table: pd.DataFrame, columns=UNLEARNING_COLUMNS, width: int = CONSOLE_WIDTH
) -> str:
    """The comparison ``table`` as the console prints it: a markdown table of ``columns`` no
    wider than ``width`` (columns of :data:`DROPPED_FIRST` given up while it is wider), then
    ``method: did`` for each row with a ``did`` (cut to ``width``)."""
    frame = console_frame(table, columns)
    lines = _markdown(frame)
    for header in DROPPED_FIRST:
        if max(map(len, lines)) <= width:
            break
        if header not in frame:
            continue
        frame = frame.drop(columns=header)
        lines = _markdown(frame)
    if "did" in table:
        for method, did in zip(table["method"], table["did"].fillna("")):
            if did:
                line = f"  {method}: {did}"
                lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return "\n".join(lines)
