"""``compare.png``: each method's accuracy per run, grouped bars (one colour per run and request),
on the test set and on the forgotten clients' data; a flagged row's bar is hatched and outlined in
red, a method a run did not run has no bar."""

from __future__ import annotations

from pathlib import Path

from fedunlearn.reporting.run_files import number

#: The panels: (column, title).
PANELS = (
    ("test_accuracy", "test accuracy (higher: kept more)"),
    ("target_accuracy", "accuracy on the forgotten clients' data\n(near FedRetrain's: forgot)"),
)


def _series(comparison) -> list[tuple[str, dict[str, dict[str, str]]]]:
    """(label, {method: row}) per run and request, in the comparison's order."""
    series: dict[str, dict[str, dict[str, str]]] = {}
    requests = {(r["run"], r["request"]) for r in comparison.rows}
    several = len(requests) > len({run for run, _ in requests})
    for row in comparison.rows:
        label = row["run"] + (f" (request {row['request']})" if several else "")
        series.setdefault(label, {})[row["method"]] = row
    return list(series.items())


def _bars(axis, rows, methods, column, index, width, colour, label) -> None:
    """One run's bars: a bar per method it ran, hatched and red-edged where flagged."""
    for position, method in enumerate(methods):
        value = number(rows.get(method, {}).get(column, ""))
        if value is None:
            continue
        flagged = bool(rows[method].get("flag", "").strip())
        axis.bar(
            position - 0.4 + width * (index + 0.5),
            value,
            width,
            color=colour,
            label=label,
            hatch="//" if flagged else None,
            edgecolor="tab:red" if flagged else "white",
        )
        label = None  # once per run in the legend


def plot_comparison(comparison, path: Path) -> Path:
    """Draw the comparison's grouped bars into ``path`` (PNG, written atomically)."""
    from fedunlearn.plots import plt
    from fedunlearn.plots.style import display_name, save_figure

    series = _series(comparison)
    methods = list(dict.fromkeys(r["method"] for r in comparison.rows))
    width = 0.8 / max(len(series), 1)
    colours = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 3]  # red: flags
    fig, axes = plt.subplots(1, len(PANELS), figsize=(max(7.0, 1.1 * len(methods) * 2), 4.6))
    for axis, (column, title) in zip(axes, PANELS):
        for index, (label, rows) in enumerate(series):
            _bars(axis, rows, methods, column, index, width, colours[index % len(colours)], label)
        ticks = [display_name(m) for m in methods]
        axis.set_xticks(range(len(methods)), ticks, rotation=30, ha="right")
        axis.set_ylim(0, 1.05)
        axis.set_title(title, fontsize=10)
        axis.grid(axis="y", alpha=0.3)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="run")
    fig.suptitle("unlearning comparison per run (hatched, red edge: flagged)", fontsize=11)
    return save_figure(fig, path)
