"""Training curves of a run: test accuracy and losses per round (``metrics.csv``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from fedunlearn.plots.style import integer_ticks, legend_outside, save_figure


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
