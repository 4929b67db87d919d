"""Training curves of a run: test accuracy and losses per round (``metrics.csv``).

The first evaluation (round 0, the initial model) is near chance and round 1 often jumps most of
the way to the final accuracy: on one linear axis every later round is a flat line at the top.
When that is so, a second accuracy panel zooms on the rounds after the first
(:func:`zoom_is_worthwhile`), and the losses, which shrink by decades, are on a log axis.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle

from fedunlearn.plots.style import caption, integer_ticks, legend_outside, save_figure

#: The zoomed panel is drawn when the later rounds span at most this fraction of all rounds' range.
ZOOM_FRACTION = 0.25
#: The losses are drawn on a log axis when the largest is more than this many times the smallest.
LOG_LOSS_RATIO = 10.0
#: Colour of the zoomed region and the box that marks it on the full panel.
ZOOM_COLOUR = "#fdae6b"


def zoom_is_worthwhile(values) -> bool:
    """Whether the rounds after the first deserve their own, zoomed axis: there are at least two
    of them and their range is at most :data:`ZOOM_FRACTION` of the range with the first."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) < 3:
        return False
    full, later = np.ptp(values), np.ptp(values[1:])
    return full > 0 and later <= ZOOM_FRACTION * full


def training_curves_figure(metrics: pd.DataFrame, title: str = ""):
    """Test accuracy and losses per round, retained rounds marked (``metrics.csv`` of a run).

    Panels: accuracy over every round; when :func:`zoom_is_worthwhile`, the accuracy of the rounds
    after the first on an axis of their own (their region boxed on the first panel); the test and
    clients' train loss, on a log axis when they fall by more than a decade."""
    zoom = zoom_is_worthwhile(metrics["test_accuracy"])
    fig, axes = plt.subplots(1, 3 if zoom else 2, figsize=(14, 3.8) if zoom else (11, 3.8))
    ax_acc, ax_loss = axes[0], axes[-1]
    _accuracy(ax_acc, metrics)
    if zoom:
        ax_zoom = axes[1]
        _accuracy(ax_zoom, metrics.iloc[1:])
        ax_zoom.set_title(f"from round {int(metrics['round'].iloc[1])} (zoomed)", fontsize=10)
        ax_zoom.set_facecolor(_tint(ZOOM_COLOUR))
        ax_acc.set_title("every round", fontsize=10)
        _mark_zoom(ax_acc, ax_zoom)
    _losses(ax_loss, metrics)
    for ax in axes:
        ax.set_xlabel("round")
        integer_ticks(ax, "x")
        ax.grid(alpha=0.3)
    if "retained" in metrics and metrics["retained"].astype(bool).any():
        caption(fig, "Red rings: the rounds whose updates were retained for unlearning.")
    if title:
        fig.suptitle(title)
    return fig


def _accuracy(ax, metrics: pd.DataFrame) -> None:
    """Test accuracy per round, the retained rounds ringed (the caption says what the rings are:
    a legend beside each accuracy panel would push the panels apart)."""
    ax.plot(metrics["round"], metrics["test_accuracy"], marker="o", label="test accuracy")
    if "retained" in metrics:
        kept = metrics[metrics["retained"].astype(bool)]
        ax.scatter(
            kept["round"],
            kept["test_accuracy"],
            s=80,
            facecolors="none",
            edgecolors="tab:red",
            label="retained round",
            zorder=3,
        )
    ax.set_ylabel("test accuracy")


def _mark_zoom(ax_full, ax_zoom) -> None:
    """A box on the full panel around the region the zoomed panel shows."""
    (x0, x1), (y0, y1) = ax_zoom.get_xlim(), ax_zoom.get_ylim()
    ax_full.add_patch(
        Rectangle(
            (x0, y0),
            x1 - x0,
            y1 - y0,
            facecolor=_tint(ZOOM_COLOUR),
            edgecolor=ZOOM_COLOUR,
            linewidth=1.5,
            zorder=0.5,
        )
    )
    ax_full.annotate(
        "zoomed →",
        (x1, y0),
        textcoords="offset points",
        xytext=(0, -3),
        ha="right",
        va="top",
        fontsize=8,
        color="#a63603",
    )


def _tint(colour: str, alpha: float = 0.18):
    """``colour`` made light for a background (RGBA with ``alpha``)."""
    return to_rgba(colour, alpha)


def _losses(ax, metrics: pd.DataFrame) -> None:
    """Test loss and the clients' train loss; a log axis when every drawn loss is positive and
    they span more than :data:`LOG_LOSS_RATIO` (a cross-entropy falling by decades: on a linear
    axis every round after the first would be a line at 0)."""
    ax.plot(metrics["round"], metrics["test_loss"], marker="o", label="test loss")
    columns = ["test_loss"]
    if "train_loss" in metrics:
        ax.plot(metrics["round"], metrics["train_loss"], marker="s", label="train loss (clients)")
        columns.append("train_loss")
    values = metrics[columns].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if values.size and (values > 0).all() and values.max() > LOG_LOSS_RATIO * values.min():
        ax.set_yscale("log")
        ax.set_ylabel("cross-entropy (log axis)")
    else:
        ax.set_ylabel("cross-entropy")
    legend_outside(ax)


def plot_training_curves(metrics: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`training_curves_figure`, saved to ``path``."""
    return save_figure(training_curves_figure(metrics, title), path)
