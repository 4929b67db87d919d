"""Figures a person would rather look at than read (matplotlib, headless).

Every figure follows the same house rules, kept here once as small helpers: rounds and counts get
integer ticks (:func:`integer_ticks`), bars carry their values and a bar of height zero stays
visible as an outline with its "0" (:func:`labelled_bars`), legends sit outside the axes
(:func:`legend_outside`), and a figure about a forgetting request names every target forgotten so far
(:func:`forgetting_title`). Each ``plot_*`` function draws with its ``*_figure`` twin, which returns
the :class:`~matplotlib.figure.Figure` unsaved (for a notebook, or a test that inspects it).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedunlearn.store.durable_io import atomic_write_bytes  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """Lay out, save (120 dpi, the format of ``path``'s suffix, PNG without one) and close ``fig``.

    Rendered to memory first, then written atomically with mode 0600 like every file of a run. The
    saved area is the figure's tight bounding box, so a legend outside the axes is never cut off.
    """
    path = Path(path)
    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(
            buffer,
            dpi=120,
            format=path.suffix.lstrip(".").lower() or "png",
            bbox_inches="tight",
        )
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


# -------------------------------------------------------------------- method colours, names
#: The colour of every registered method, the same in every figure (``fedunlearn.registry``'s
#: names, the scrubbing and judge baselines, the audited models). The references are black (the
#: retrained model) and grey (the original, trained model); tab:red is kept for FLAGGED marks.
METHOD_COLOURS: dict[str, str] = {
    # references
    "original": "#7f7f7f",
    "fedretrain": "#000000",
    "retrain": "#000000",
    "retrain-independent": "#b8b8b8",
    # client removal (fedunlearn.registry.UNLEARNING)
    "federaser": "#1f77b4",
    "fedaccum": "#ff7f0e",
    "fedrecover": "#2ca02c",
    "crab": "#9467bd",
    "sifu": "#8c564b",
    # scrubbing (fedunlearn.registry.SCRUBBING)
    "newton": "#17becf",
    "newton-forget-only": "#0b6e78",
    "newton-finite": "#7fd3dc",
    "fisher": "#e377c2",
    "fisher-sqrt": "#9c2f7f",
    "fisher-reference": "#f2a9d7",
    "finetune": "#bcbd22",
    "negative-gradient": "#d9a400",
    "random-labels": "#6b6ecf",
    "hiding": "#5fb85f",
    "class-pruning": "#c49c94",
    # audited certified heads (fedunlearn.registry.AUDITED)
    "certified-head-trained": "#aec7e8",
    "certified-head": "#393b79",
}

#: Names shown instead of a method's internal name: the run's trained model is "original".
DISPLAY_NAMES: dict[str, str] = {"fedavg": "original"}

#: Colours for names the map does not know (a method registered later), picked by a stable hash.
FALLBACK_COLOURS = (
    "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
    "#636363", "#969696", "#bd9e39", "#ad494a", "#a55194", "#6baed6", "#fd8d3c", "#74c476",
)  # fmt: skip


def display_name(method: str) -> str:
    """The name a figure shows for ``method``: ``fedavg`` (the trained model) reads "original"."""
    return DISPLAY_NAMES.get(str(method), str(method))


def method_colour(method: str) -> str:
    """The fixed colour of ``method`` (``fedavg`` and "original" share one). A name the map does
    not know gets one of :data:`FALLBACK_COLOURS` chosen by a CRC-32 of the name: the same in every
    figure and every process."""
    name = display_name(method)
    if name in METHOD_COLOURS:
        return METHOD_COLOURS[name]
    return FALLBACK_COLOURS[zlib.crc32(name.encode()) % len(FALLBACK_COLOURS)]


def caption(fig, text: str, *, y: float = -0.01) -> None:
    """One line of ``text`` under the figure's axes (kept by :func:`save_figure`'s tight box)."""
    fig.text(0.5, y, text, ha="center", va="top", fontsize=8, gid="caption")


def spread_labels(ax, texts, *, step: float = 2.0, rounds: int = 300) -> None:
    """Nudge annotations of ``ax`` (placed with ``textcoords="offset points"``) apart vertically,
    ``step`` points at a time, until no two bounding boxes overlap: the labels of nearby points stay
    readable. Draws the figure's canvas to measure them."""
    texts = [t for t in texts if t.get_text()]
    if len(texts) < 2:
        return
    renderer = ax.figure.canvas.get_renderer()
    pixels = step * ax.figure.dpi / 72.0
    for _ in range(rounds):
        boxes = [t.get_window_extent(renderer) for t in texts]
        moved = False
        for i in range(len(texts)):
            for j in range(i + 1, len(texts)):
                if not boxes[i].overlaps(boxes[j]):
                    continue
                upper, lower = (i, j) if boxes[i].y0 >= boxes[j].y0 else (j, i)
                for k, sign in ((upper, 1), (lower, -1)):
                    x, y = texts[k].xyann
                    texts[k].xyann = (x, y + sign * step)
                    boxes[k] = boxes[k].translated(0, sign * pixels)
                moved = True
        if not moved:
            return


# ------------------------------------------------------------------------- shared helpers
def integer_ticks(ax, *axes: str) -> None:
    """Ticks only at whole numbers on ``axes`` (``"x"``, ``"y"``): rounds, requests and counts have
    no half values."""
    for name in axes or ("x",):
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True))


def labelled_bars(ax, positions, heights, width=0.8, *, fmt: str = "{:.3g}", **style):
    """Vertical bars with their values written above them. A bar of height zero (or NaN, drawn
    as zero) would vanish: every bar gets an outline in its colour, so a zero bar shows as a line
    on the axis, labelled "0"."""
    heights = [0.0 if h != h else float(h) for h in heights]  # NaN != NaN
    bars = ax.bar(positions, heights, width, **style)
    for bar in bars:
        bar.set_edgecolor(bar.get_facecolor())
        bar.set_linewidth(1.5)
    ax.bar_label(bars, labels=[fmt.format(h) for h in heights], padding=2, fontsize=8)
    return bars


def legend_outside(ax, **options):
    """The axes' legend to the right of the axes, where it cannot cover the data."""
    if not ax.get_legend_handles_labels()[0] and "handles" not in options:
        return None
    options = {"fontsize": 8, **options}
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **options)


def forgetting_title(
    dataset: str, num_clients: int, targets: Sequence[int], earlier: Sequence[int] = ()
) -> str:
    """The title of a forgetting request's figures: the new targets and, after earlier requests,
    every client forgotten so far (the model also lacks those)."""
    title = f"{dataset}, K={num_clients}, forget {sorted(targets)}"
    if earlier:
        title += f" (forgotten so far: {sorted(set(targets) | set(earlier))})"
    return title


def flagged(table: pd.DataFrame) -> set[str]:
    """The methods whose row is flagged (a non-empty ``flag`` column entry): not a result."""
    if "flag" not in table:
        return set()
    return {m for m, f in zip(table["method"], table["flag"]) if isinstance(f, str) and f}


def mark_flagged_ticks(ax, table: pd.DataFrame) -> None:
    """Method tick labels of flagged rows in red with "FLAGGED" under the name."""
    marked = flagged(table)
    labels = ax.get_xticklabels()
    for label in labels:
        if label.get_text() in marked:
            label.set_text(f"{label.get_text()}\nFLAGGED")
            label.set_color("tab:red")
            label.set_fontweight("bold")
    ax.set_xticks(ax.get_xticks(), labels)


# ------------------------------------------------------------------------------ figures
def training_curves_figure(metrics: pd.DataFrame, title: str = ""):
    """Test accuracy and losses per round, retained rounds marked (``metrics.csv`` of a run)."""
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_acc.plot(metrics["round"], metrics["test_accuracy"], marker="o", label="test accuracy")
    if "retained" in metrics:
        kept = metrics[metrics["retained"].astype(bool)]
        ax_acc.scatter(
            kept["round"],
            kept["test_accuracy"],
            s=80,
            facecolors="none",
            edgecolors="tab:red",
            label="retained round",
            zorder=3,
        )
    ax_acc.set_ylabel("accuracy")
    ax_loss.plot(metrics["round"], metrics["test_loss"], marker="o", label="test loss")
    if "train_loss" in metrics:
        ax_loss.plot(
            metrics["round"], metrics["train_loss"], marker="s", label="train loss (clients)"
        )
    ax_loss.set_ylabel("cross-entropy")
    for ax in (ax_acc, ax_loss):
        ax.set_xlabel("round")
        integer_ticks(ax, "x")
        ax.grid(alpha=0.3)
        legend_outside(ax)
    if title:
        fig.suptitle(title)
    return fig


def plot_training_curves(metrics: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`training_curves_figure`, saved to ``path``."""
    return save_figure(training_curves_figure(metrics, title), path)


def unlearning_figure(table: pd.DataFrame, title: str = ""):
    """Test and target accuracy per method, bars side by side (Fig. 2 of Liu et al.), the
    attack's success when the run was poisoned, and each method's wall time."""
    methods = list(table["method"])
    positions = list(range(len(methods)))
    bars = [("test_accuracy", "test data"), ("target_accuracy", "target's data")]
    if "attack_success" in table and table["attack_success"].notna().any():
        bars.append(("attack_success", "attack success"))
    width = 0.76 / len(bars)
    fig, (ax_acc, ax_time) = plt.subplots(
        1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]}
    )
    for i, (column, label) in enumerate(bars):
        offset = (i - (len(bars) - 1) / 2) * width
        labelled_bars(
            ax_acc,
            [p + offset for p in positions],
            table[column],
            width,
            fmt="{:.2f}",
            label=label,
        )
    ax_acc.set_xticks(positions, methods)
    ax_acc.set_ylabel("accuracy" if len(bars) == 2 else "accuracy / success rate")
    ax_acc.set_ylim(0, 1.12)  # room for the value labels above a bar at 1.0
    ax_acc.grid(axis="y", alpha=0.3)
    legend_outside(ax_acc)
    timed = table[table["seconds"].notna()]
    labelled_bars(ax_time, list(timed["method"]), timed["seconds"], color="tab:gray", fmt="{:.2g}")
    ax_time.set_ylabel("unlearning wall time (s)")
    if len(methods) > 5:  # six recovery methods' names do not fit side by side
        ax_acc.tick_params(axis="x", labelrotation=30)
        ax_time.tick_params(axis="x", labelrotation=30)
    ax_time.margins(y=0.15)
    ax_time.grid(axis="y", alpha=0.3)
    mark_flagged_ticks(ax_acc, table)
    mark_flagged_ticks(ax_time, timed)
    if flagged(table):
        fig.text(
            0.01,
            -0.02,
            "FLAGGED: "
            + "; ".join(f"{m}: {f}" for m, f in zip(table["method"], table["flag"]) if f),
            color="tab:red",
            fontsize=8,
            ha="left",
            va="top",
            wrap=True,
        )
    if title:
        fig.suptitle(title)
    return fig


def plot_unlearning_comparison(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`unlearning_figure`, saved to ``path``."""
    return save_figure(unlearning_figure(table, title), path)


def neuron_angles_figure(angles: dict[str, list[float]], title: str = ""):
    """Histogram of per-neuron last-layer angles to the retrained model (Fig. 4 of Liu et al.)."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    finite = [a for values in angles.values() for a in values if a == a]
    top = max(finite) if finite else 1.0
    bins = [top * i / 20 for i in range(21)] if top > 0 else 20
    for method, values in angles.items():
        ax.hist(values, bins=bins, alpha=0.55, label=method)
    ax.set_xlabel("angle to FedRetrain's neuron (degrees)")
    ax.set_ylabel("neurons of the last layer")
    integer_ticks(ax, "y")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    if title:
        ax.set_title(title)
    return fig


def plot_neuron_angles(angles: dict[str, list[float]], path: Path, title: str = "") -> Path:
    """:func:`neuron_angles_figure`, saved to ``path``."""
    return save_figure(neuron_angles_figure(angles, title), path)


def roc_figure(curves: dict[str, tuple], title: str = "", *, reference: str = "fedretrain"):
    """Log-log ROC curves of a membership-inference attack, one per model (Carlini et al. 2022 plot
    the low-FPR region this way: an attack that works only at FPR << 1 is invisible on linear axes).

    ``curves`` maps a model's name to ``(fpr, tpr)`` arrays; the ``reference`` model (the one every
    unlearning method is judged against) is drawn dashed and black, chance as a dotted diagonal.
    """
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 5))
    floor = 1e-5
    for name, (fpr, tpr) in curves.items():
        fpr = np.maximum(np.asarray(fpr, dtype=float), floor)
        tpr = np.maximum(np.asarray(tpr, dtype=float), floor)
        style = {"color": "black", "linestyle": "--", "linewidth": 2} if name == reference else {}
        ax.plot(fpr, tpr, label=name, **style)
    ax.plot([floor, 1], [floor, 1], color="grey", linestyle=":", label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1)
    ax.set_ylim(floor, 1)
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")
    ax.grid(alpha=0.3, which="both")
    legend_outside(ax)
    ax.set_title(title or "membership inference ROC (log-log)")
    return fig


def plot_roc_curves(
    curves: dict[str, tuple], path: Path, title: str = "", *, reference: str = "fedretrain"
) -> Path:
    """:func:`roc_figure`, saved to ``path``."""
    return save_figure(roc_figure(curves, title, reference=reference), path)


def tradeoff_figure(table: pd.DataFrame, title: str = "", *, reference: str = "fedretrain"):
    """Every unlearning method as one point: the megabytes of history it needs retained (x)
    against the client-epochs its recovery asked for (y), labelled with its accuracy gap to
    ``reference`` in points: storage against recovery cost, with the accuracy each buys.

    ``table`` has columns ``method``, ``retained_mb``, ``client_epochs``, ``test_accuracy``."""
    fig, ax = plt.subplots(figsize=(7, 4.8))
    rows = table[table["method"] != "fedavg"]
    ref = rows.loc[rows["method"] == reference, "test_accuracy"]
    ref_accuracy = float(ref.iloc[0]) if len(ref) else float("nan")
    marked = flagged(table)
    for i, row in enumerate(rows.itertuples()):
        gap = 100 * (row.test_accuracy - ref_accuracy)
        bad = row.method in marked
        style = {"marker": "X", "color": "tab:red", "s": 90} if bad else {"s": 60}
        ax.scatter(row.retained_mb, row.client_epochs, zorder=3, **style)
        label = row.method if row.method == reference else f"{row.method} ({gap:+.1f} pts)"
        label += " FLAGGED" if bad else ""
        # alternate above / below: methods often share a point (two full retrainings)
        ax.annotate(
            label,
            (row.retained_mb, row.client_epochs),
            textcoords="offset points",
            xytext=(6, 5 if i % 2 == 0 else -12),
            fontsize=8,
            color="tab:red" if bad else "black",
        )
    ax.margins(x=0.2, y=0.12)
    ax.set_xlabel("history retained during training (MB)")
    ax.set_ylabel("client-epochs spent by the recovery")
    ax.grid(alpha=0.3)
    ax.set_title(title or f"storage vs recovery cost; accuracy gap to {reference} in points")
    return fig


def plot_tradeoff(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`tradeoff_figure`, saved to ``path``."""
    return save_figure(tradeoff_figure(table, title), path)
