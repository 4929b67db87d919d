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
    marked = {display_name(m) for m in flagged(table)}
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


def unlearning_figure(table: pd.DataFrame, title: str = "", *, reference: str = "fedretrain"):
    """Each method's gap to ``reference`` (FedRetrain), in accuracy points, on the test data and on
    the target's data (and the attack's success when the run was poisoned), and each method's wall
    time. Gaps, not raw 0-1 bars: a 2-point loss is as tall as it matters (Fig. 2 of Liu et al.).

    Without a ``reference`` row the bars are the accuracies themselves, in percent."""
    panels = [
        ("test_accuracy", "test accuracy"),
        ("target_accuracy", "accuracy on the target's data"),
    ]
    if "attack_success" in table and table["attack_success"].notna().any():
        panels.append(("attack_success", "attack success"))
    has_reference = bool((table["method"] == reference).any())
    rows = table[table["method"] != reference] if has_reference else table
    fig, axes = plt.subplots(
        1, len(panels) + 1, figsize=(4.0 * (len(panels) + 1), 4.2), squeeze=False
    )
    *gap_axes, ax_time = axes[0]
    for ax, (column, label) in zip(gap_axes, panels):
        _gap_panel(ax, table, rows, column, label, reference if has_reference else None)
    timed = table[table["seconds"].notna()]
    labelled_bars(
        ax_time,
        range(len(timed)),
        timed["seconds"],
        fmt="{:.2g}",
        color=[method_colour(m) for m in timed["method"]],
    )
    ax_time.set_xticks(range(len(timed)), [display_name(m) for m in timed["method"]])
    ax_time.set_ylabel("unlearning wall time (s)")
    ax_time.set_title("wall time")
    ax_time.margins(y=0.15)
    for ax in axes[0]:
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelrotation=30 if len(table) > 3 else 0)
        mark_flagged_ticks(ax, table)
    caption(fig, _unlearning_caption(reference if has_reference else None))
    _flag_note(fig, table)
    if title:
        fig.suptitle(title)
    return fig


def _gap_panel(ax, table, rows, column: str, label: str, reference: str | None) -> None:
    """One panel of :func:`unlearning_figure`: ``rows``' ``column`` minus the reference's, in
    points (the values in percent without a reference), a line at 0."""
    base = 0.0
    if reference is not None:
        base = float(table.loc[table["method"] == reference, column].iloc[0])
    gaps = [100.0 * (value - base) for value in rows[column]]
    labelled_bars(
        ax,
        range(len(rows)),
        gaps,
        fmt="{:+.1f}" if reference else "{:.1f}",
        color=[method_colour(m) for m in rows["method"]],
    )
    ax.set_xticks(range(len(rows)), [display_name(m) for m in rows["method"]])
    # under the bars: a gap of 0 is a bar outline in its method's colour on this line
    ax.axhline(0.0, color=method_colour(reference or "original"), linewidth=1, zorder=0.5)
    if reference is None:
        ax.set_ylabel("percent")
        ax.set_title(label)
    else:
        ax.set_ylabel("points vs FedRetrain")
        ax.set_title(f"{label}\n(FedRetrain: {base:.3f} = 0)")
    finite = [g for g in gaps if g == g]
    low, high = min([0.0, *finite]), max([0.0, *finite])
    pad = 0.18 * max(high - low, 1.0)  # room for the value above (or below) the longest bar
    ax.set_ylim(low - pad, high + pad)


def _unlearning_caption(reference: str | None) -> str:
    if reference is None:
        return "Accuracies in percent (no FedRetrain row to compare with)."
    return (
        "Bars: accuracy minus FedRetrain's, in points. Test: below 0 = utility lost. "
        "Target's data: 0 = forgotten as retraining forgets; above 0 = the target still remembered."
    )


def _flag_note(fig, table: pd.DataFrame) -> None:
    """The flagged methods and why, in red under the caption."""
    if not flagged(table):
        return
    fig.text(
        0.01,
        -0.06,
        "FLAGGED: " + "; ".join(f"{m}: {f}" for m, f in zip(table["method"], table["flag"]) if f),
        color="tab:red",
        fontsize=8,
        ha="left",
        va="top",
        wrap=True,
    )


def plot_unlearning_comparison(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`unlearning_figure`, saved to ``path``."""
    return save_figure(unlearning_figure(table, title), path)


def neuron_angles_figure(angles: dict[str, list[float]], title: str = ""):
    """Histogram of per-neuron last-layer angles to the retrained model (Fig. 4 of Liu et al.),
    every method's bars side by side and opaque (a 10-class head has 10 neurons: overlapping
    translucent bars would hide them), with a one-line caption."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 3.8))
    values = {m: np.asarray([a for a in v if a == a], dtype=float) for m, v in angles.items()}
    finite = np.concatenate([v for v in values.values()]) if values else np.empty(0)
    top = float(finite.max()) if finite.size else 1.0
    neurons = max((len(v) for v in angles.values()), default=0)
    count = min(20, max(5, neurons))
    bins = np.linspace(0.0, top if top > 0 else 1.0, count + 1)
    if values:
        ax.hist(
            list(values.values()),
            bins=bins,
            color=[method_colour(m) for m in values],
            label=[display_name(m) for m in values],
            rwidth=0.9,
        )
    ax.set_xlabel("angle to FedRetrain's neuron (degrees)")
    ax.set_ylabel("neurons of the last layer")
    integer_ticks(ax, "y")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    caption(
        fig,
        f"Angle between each of the {neurons} output neurons' weights and FedRetrain's: "
        "0° = the direction retraining gives.",
    )
    if title:
        ax.set_title(title)
    return fig


def plot_neuron_angles(angles: dict[str, list[float]], path: Path, title: str = "") -> Path:
    """:func:`neuron_angles_figure`, saved to ``path``."""
    return save_figure(neuron_angles_figure(angles, title), path)


#: Line styles, in the order a name whose colour is taken by another curve gets them.
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def roc_resolution(rates) -> int:
    """How many negatives (for FPRs) or positives (TPRs) the ROC curves ``rates`` were drawn from:
    the rates are multiples of 1/n, and 1/n is their smallest positive step."""
    import numpy as np

    steps = [np.diff(np.unique(np.asarray(r, dtype=float))) for r in rates]
    steps = np.concatenate(steps) if steps else np.empty(0)
    steps = steps[steps > 1e-12]
    return int(round(1.0 / steps.min())) if steps.size else 1


def roc_figure(
    curves: dict[str, tuple],
    title: str = "",
    *,
    reference: str = "fedretrain",
    negatives: int | None = None,
    positives: int | None = None,
):
    """Log-log ROC curves of a membership-inference attack, one per model (Carlini et al. 2022 plot
    the low-FPR region this way: an attack that works only at FPR << 1 is invisible on linear axes).

    ``curves`` maps a model's name to ``(fpr, tpr)`` arrays. Every curve has its method's colour
    and a line style no other curve of its colour has (the ``reference`` model, the one every
    method is judged against, dashed); the legend gives each curve's AUC. From n negatives an FPR
    below 1/n cannot be measured: the x axis starts at 1/``negatives`` (the y axis at
    1/``positives``), read off the curves when not given, and a rate of 0 is drawn on that edge.
    """
    import numpy as np

    negatives = negatives or roc_resolution([fpr for fpr, _ in curves.values()])
    positives = positives or roc_resolution([tpr for _, tpr in curves.values()])
    x_floor, y_floor = 1.0 / max(negatives, 1), 1.0 / max(positives, 1)
    fig, ax = plt.subplots(figsize=(7, 5))
    used: set[tuple] = set()
    for name, (fpr, tpr) in curves.items():
        fpr, tpr = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
        colour, style = _distinct_style(name, "--" if name == reference else "-", used)
        auc = float(np.trapezoid(tpr, fpr)) if fpr.size > 1 else float("nan")
        ax.plot(
            np.maximum(fpr, x_floor),
            np.maximum(tpr, y_floor),
            color=colour,
            linestyle=style,
            linewidth=2 if name == reference else 1.5,
            label=f"{display_name(name)} (AUC {auc:.3f})",
        )
    low = min(x_floor, y_floor)
    ax.plot([low, 1], [low, 1], color="#c8c8c8", linestyle=":", label="chance (AUC 0.5)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_floor, 1)
    ax.set_ylim(y_floor, 1)
    ax.set_xlabel(f"false-positive rate (from {negatives} non-members: ≥ 1/{negatives})")
    ax.set_ylabel(f"true-positive rate (from {positives} members)")
    ax.grid(alpha=0.3, which="both")
    legend_outside(ax)
    ax.set_title(title or "membership inference ROC (log-log)")
    return fig


def _distinct_style(name: str, first: str, used: set) -> tuple[str, object]:
    """``name``'s colour and the first line style, ``first`` preferred, that no curve drawn so far
    has with that colour; the pair is added to ``used``."""
    colour = method_colour(name)
    for style in (first, *LINESTYLES):
        if (colour, style) not in used:
            break
    used.add((colour, style))
    return colour, style


def plot_roc_curves(
    curves: dict[str, tuple],
    path: Path,
    title: str = "",
    *,
    reference: str = "fedretrain",
    negatives: int | None = None,
    positives: int | None = None,
) -> Path:
    """:func:`roc_figure`, saved to ``path``."""
    fig = roc_figure(curves, title, reference=reference, negatives=negatives, positives=positives)
    return save_figure(fig, path)


def tradeoff_figure(table: pd.DataFrame, title: str = "", *, reference: str = "fedretrain"):
    """Every unlearning method as one point: the megabytes of history it needs retained (x)
    against the client-epochs it spent to unlearn (y: retraining, recovery or calibration),
    labelled with its test-accuracy gap to ``reference`` in points: what forgetting costs, in
    storage and in training, and the accuracy each buys.

    ``table`` has columns ``method``, ``retained_mb``, ``client_epochs``, ``test_accuracy``."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    rows = table[~table["method"].isin(["fedavg", "original"])]
    ref = rows.loc[rows["method"] == reference, "test_accuracy"]
    ref_accuracy = float(ref.iloc[0]) if len(ref) else float("nan")
    marked = flagged(table)
    labels = []
    right = float(rows["retained_mb"].max()) if len(rows) else 0.0
    for row in rows.itertuples():
        # a label right of its point, but left of one near the right edge: inside the axes
        left = right > 0 and row.retained_mb > 0.6 * right
        bad = row.method in marked
        ax.scatter(
            row.retained_mb,
            row.client_epochs,
            zorder=3,
            s=90 if bad else 60,
            marker="X" if bad else "o",
            color=method_colour(row.method),
            edgecolors="tab:red" if bad else "none",
        )
        gap = 100 * (row.test_accuracy - ref_accuracy)
        label = display_name(row.method)
        label += " (reference)" if row.method == reference else f": {gap:+.1f} pts"
        label += " FLAGGED" if bad else ""
        labels.append(
            ax.annotate(
                label,
                (row.retained_mb, row.client_epochs),
                textcoords="offset points",
                xytext=(-7, -3) if left else (7, -3),
                ha="right" if left else "left",
                fontsize=8,
                color="tab:red" if bad else method_colour(row.method),
            )
        )
    ax.margins(x=0.25, y=0.15)
    ax.set_xlim(left=max(ax.get_xlim()[0], -0.05 * max(right, 1e-9)))  # no negative storage
    ax.set_xlabel("history retained during training (MB)")
    ax.set_ylabel("client-epochs spent to unlearn\n(retraining, recovery or calibration)")
    ax.grid(alpha=0.3)
    ax.set_title(title or "what unlearning costs: storage vs training")
    caption(fig, "Labels: test-accuracy points vs FedRetrain (0 = as accurate as retraining).")
    fig.tight_layout()
    spread_labels(ax, labels)
    return fig


def plot_tradeoff(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`tradeoff_figure`, saved to ``path``."""
    return save_figure(tradeoff_figure(table, title), path)


def certified_removal_figure(
    table: pd.DataFrame,
    budget: float,
    title: str = "",
    *,
    retrained: Sequence[int] | None = None,
):
    """The certified head over its removal requests: test accuracy (left) and the certified
    gradient-residual bound β against its budget (right, log y). Requests after which the head was
    retrained from scratch (β over budget) are marked on both panels; the budget line is always
    within the y range.

    ``table`` has columns ``requests``, ``test_accuracy``, ``beta`` and ``retrains`` (cumulative
    count at that row); ``retrained`` lists the requests that retrained (read off the rows where
    ``retrains`` went up when not given)."""
    import numpy as np

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(table["requests"], table["test_accuracy"], marker="o", ms=3, color="#393b79")
    left.set_ylabel("test accuracy")
    left.set_title("accuracy of the certified head")
    beta = table["beta"].to_numpy(dtype=float)
    positive = beta[np.isfinite(beta) & (beta > 0)]
    floor = min(float(positive.min()) if positive.size else budget, budget) / 3
    right.plot(
        table["requests"],
        np.maximum(beta, floor),
        marker="o",
        ms=3,
        color="#393b79",
        label="β (certified residual bound)",
    )
    right.axhline(
        budget, color="tab:red", linestyle="--", linewidth=1.5, label=f"budget {budget:.3g}"
    )
    top = max(float(positive.max()) if positive.size else budget, budget)
    right.set_yscale("log")
    right.set_ylim(floor, top * 3)
    right.set_ylabel("cumulative bound β")
    right.set_title("gradient residual bound vs budget")
    retrained = retrain_requests(table) if retrained is None else list(retrained)
    for ax in (left, right):
        for k, request in enumerate(retrained):
            ax.axvline(
                request,
                color="#ff7f0e",
                linestyle=":",
                linewidth=1.5,
                label="retrained (β reached the budget)" if k == 0 else None,
            )
        ax.set_xlabel("removal requests")
        integer_ticks(ax, "x")
        ax.grid(alpha=0.3)
    legend_outside(right)
    caption(
        fig,
        "β bounds the gradient left by the removals; when a removal would take β over the budget, "
        "the head is retrained without the removed samples.",
    )
    if title:
        fig.suptitle(title)
    return fig


def retrain_requests(table: pd.DataFrame) -> list[int]:
    """The request counts of the rows at which the cumulative ``retrains`` count went up."""
    if "retrains" not in table or table.empty:
        return []
    counts = table["retrains"].fillna(0).to_numpy()
    requests = table["requests"].to_numpy()
    return [int(requests[i]) for i in range(1, len(counts)) if counts[i] > counts[i - 1]]


def plot_certified_removal(
    table: pd.DataFrame,
    budget: float,
    path: Path,
    title: str = "",
    *,
    retrained: Sequence[int] | None = None,
) -> Path:
    """:func:`certified_removal_figure`, saved to ``path``."""
    return save_figure(certified_removal_figure(table, budget, title, retrained=retrained), path)
