"""Figures of client removal, every unlearning method against FedRetrain: the accuracy gaps and
wall time (:func:`unlearning_figure`), the last layer's neuron angles (:func:`neuron_angles_figure`),
the storage-vs-training trade-off (:func:`tradeoff_figure`) and what each method did to the clients
that stay (:func:`client_accuracy_figure`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from fedunlearn.plots.style import (
    caption,
    display_name,
    flagged,
    integer_ticks,
    labelled_bars,
    legend_outside,
    mark_flagged_ticks,
    method_colour,
    save_figure,
    spread_labels,
)


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


#: Bin widths (degrees) :func:`angle_bins` chooses from: ticks read as whole, round numbers.
ANGLE_BIN_WIDTHS = (0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0)
#: The most bins :func:`angle_bins` makes (a group of bars per bin, one bar per method).
MAX_ANGLE_BINS = 12


def angle_bins(top: float) -> np.ndarray:
    """Bin edges from 0 past ``top`` degrees: the narrowest of :data:`ANGLE_BIN_WIDTHS` that needs
    at most :data:`MAX_ANGLE_BINS` bins; the last bin lies wholly above ``top`` (a value on an edge
    counts in the bin above it)."""
    top = max(float(top), 0.0)
    width = next((w for w in ANGLE_BIN_WIDTHS if top < w * MAX_ANGLE_BINS), ANGLE_BIN_WIDTHS[-1])
    return width * np.arange(int(top // width) + 2)


def neuron_angles_figure(angles: dict[str, list[float]], title: str = ""):
    """Histogram of per-neuron last-layer angles to the retrained model (Fig. 4 of Liu et al.):
    round bins (:func:`angle_bins`), each a group of opaque bars side by side, one per method with
    neurons there (a 10-class head has 10 neurons: overlapping translucent bars would hide them),
    centred on the bin's tick, which names the bin's range; a caption says how to read it."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    values = {m: np.asarray([a for a in v if a == a], dtype=float) for m, v in angles.items()}
    finite = np.concatenate([v for v in values.values()]) if values else np.empty(0)
    edges = angle_bins(float(finite.max()) if finite.size else 1.0)
    width = edges[1] - edges[0]
    centres = (edges[:-1] + edges[1:]) / 2
    counts = {m: np.histogram(v, bins=edges)[0] for m, v in values.items()}
    bar = 0.85 * width / max(len(values), 1)
    places = _grouped_places(counts, centres, bar)
    for method, count in counts.items():
        shown = count > 0
        ax.bar(places[method][shown], count[shown], bar, color=method_colour(method),
               label=display_name(method))  # fmt: skip
    ax.set_xticks(centres, [f"{a:g}–{b:g}" for a, b in zip(edges[:-1], edges[1:])])
    ax.set_xticks(edges, minor=True)  # the bins' borders, as light lines
    ax.tick_params(axis="x", which="minor", length=0)
    ax.tick_params(axis="x", labelrotation=30 if len(centres) > 8 else 0, labelsize=8)
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel("angle to FedRetrain's neuron (degrees; one group of bars per bin)")
    ax.set_ylabel("neurons of the last layer")
    integer_ticks(ax, "y")
    ax.grid(axis="y", alpha=0.3)
    ax.grid(axis="x", which="minor", alpha=0.5)
    legend_outside(ax)
    neurons = max((len(v) for v in angles.values()), default=0)
    caption(fig, _angles_caption(neurons, "fedavg" in angles or "original" in angles))
    if title:
        ax.set_title(title)
    return fig


def _grouped_places(counts: dict, centres: np.ndarray, bar: float) -> dict[str, np.ndarray]:
    """Each method's bar position in every bin: the bins' non-empty bars side by side in the
    methods' order, their group centred on the bin's centre (one bar alone sits on the tick)."""
    places = {method: centres.copy() for method in counts}
    for b, centre in enumerate(centres):
        present = [method for method, count in counts.items() if count[b] > 0]
        for k, method in enumerate(present):
            places[method][b] = centre + (k - (len(present) - 1) / 2) * bar
    return places


def _angles_caption(neurons: int, with_original: bool) -> str:
    """What the angles are, and, with the original model drawn, why it is often close to 0
    (wrapped to the figure's width)."""
    text = (
        f"Angle between each of the {neurons} output neurons' weights and FedRetrain's: "
        "0° = the direction retraining gives."
    )
    if with_original:
        text += (
            " original (no unlearning) and FedRetrain start from the same initial model with the "
            "same seeds, rounds and local epochs, and FedRetrain only lacks the targets' data: "
            "the original's neurons are often close to retraining's. A method right of the "
            "original ends further from retraining than not unlearning at all."
        )
    return textwrap.fill(text, width=110)


def plot_neuron_angles(angles: dict[str, list[float]], path: Path, title: str = "") -> Path:
    """:func:`neuron_angles_figure`, saved to ``path``."""
    return save_figure(neuron_angles_figure(angles, title), path)


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


def client_accuracy_figure(clients: pd.DataFrame, title: str = ""):
    """Each remaining client's accuracy change against the original model, per method: one dot
    per client (points; below 0, the request cost that client accuracy), the worst client's dot
    ringed and labelled with its client id.

    ``clients`` has columns ``method``, ``client``, ``accuracy`` (the original: ``fedavg``)."""
    before = clients[clients["method"] == "fedavg"].set_index("client")["accuracy"]
    methods = [m for m in dict.fromkeys(clients["method"]) if m != "fedavg"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(methods) + 2), 4.2))
    for i, method in enumerate(methods):
        part = clients[clients["method"] == method]
        change = 100 * (part["accuracy"].to_numpy() - before.reindex(part["client"]).to_numpy())
        jitter = np.linspace(-0.18, 0.18, len(change)) if len(change) > 1 else np.zeros(1)
        ax.scatter(i + jitter, change, s=18, color=method_colour(method), zorder=3)
        if np.isfinite(change).any():
            worst = int(np.nanargmin(change))
            ax.scatter(i + jitter[worst], change[worst], s=70, facecolors="none",
                       edgecolors="black", linewidths=1.0, zorder=4)  # fmt: skip
            ax.annotate(f"client {int(part['client'].iloc[worst])}",
                        (i + jitter[worst], change[worst]), textcoords="offset points",
                        xytext=(6, -3), fontsize=7)  # fmt: skip
    ax.axhline(0.0, color=method_colour("original"), linewidth=1, zorder=0.5)
    ax.set_xticks(range(len(methods)), [display_name(m) for m in methods])
    ax.tick_params(axis="x", labelrotation=30 if len(methods) > 3 else 0)
    ax.set_ylabel("accuracy change vs the original (points)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or "the clients that stay: accuracy after unlearning")
    caption(
        fig,
        "One dot per remaining client: the test set's per-class accuracies weighted by its labels, "
        "minus the original model's. Ringed: the client that lost most.",
    )
    return fig


def plot_client_accuracy(clients: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`client_accuracy_figure`, saved to ``path``."""
    return save_figure(client_accuracy_figure(clients, title), path)
