"""Figures a person would rather look at than read (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_training_curves(metrics: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Test accuracy and losses per round, retained rounds marked (``metrics.csv`` of a run)."""
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
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
    ax_acc.set_xlabel("round")
    ax_acc.set_ylabel("accuracy")
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(loc="lower right")
    ax_loss.plot(metrics["round"], metrics["test_loss"], marker="o", label="test loss")
    if "train_loss" in metrics:
        ax_loss.plot(
            metrics["round"], metrics["train_loss"], marker="s", label="train loss (clients)"
        )
    ax_loss.set_xlabel("round")
    ax_loss.set_ylabel("cross-entropy")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
