"""Figures a person would rather look at than read (matplotlib, headless)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.store.durable_io import atomic_write_bytes  # noqa: E402


def save_figure(fig, path: Path) -> Path:
    """Lay out, save (120 dpi, the format of ``path``'s suffix, PNG without one) and close ``fig``.

    Rendered to memory first, then written atomically with mode 0600 like every file of a run.
    """
    path = Path(path)
    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buffer, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


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
    return save_figure(fig, path)


def plot_unlearning_comparison(table: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Test and target accuracy per method, bars side by side (Fig. 2 of Liu et al.)."""
    methods = list(table["method"])
    positions = range(len(methods))
    width = 0.38
    fig, (ax_acc, ax_time) = plt.subplots(
        1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]}
    )
    ax_acc.bar([p - width / 2 for p in positions], table["test_accuracy"], width, label="test data")
    ax_acc.bar(
        [p + width / 2 for p in positions], table["target_accuracy"], width, label="target's data"
    )
    ax_acc.set_xticks(list(positions), methods)
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1.05)
    ax_acc.grid(axis="y", alpha=0.3)
    ax_acc.legend(loc="lower right")
    timed = table[table["seconds"].notna()]
    ax_time.bar(list(timed["method"]), timed["seconds"], color="tab:gray")
    ax_time.set_ylabel("unlearning wall time (s)")
    ax_time.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def plot_neuron_angles(angles: dict[str, list[float]], path: Path, title: str = "") -> Path:
    """Histogram of per-neuron last-layer angles to the retrained model (Fig. 4 of Liu et al.)."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    finite = [a for values in angles.values() for a in values if a == a]
    top = max(finite) if finite else 1.0
    bins = [top * i / 20 for i in range(21)] if top > 0 else 20
    for method, values in angles.items():
        ax.hist(values, bins=bins, alpha=0.55, label=method)
    ax.set_xlabel("angle to FedRetrain's neuron (degrees)")
    ax.set_ylabel("neurons of the last layer")
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return save_figure(fig, path)


def plot_roc_curves(
    curves: dict[str, tuple], path: Path, title: str = "", *, reference: str = "fedretrain"
) -> Path:
    """Log-log ROC curves of a membership-inference attack, one per model (Carlini et al. 2022 plot
    the low-FPR region this way: an attack that works only at FPR << 1 is invisible on linear axes).

    ``curves`` maps a model's name to ``(fpr, tpr)`` arrays; the ``reference`` model (the one every
    unlearning method is judged against) is drawn dashed and black, chance as a dotted diagonal.
    """
    import numpy as np

    fig, ax = plt.subplots(figsize=(5.5, 5))
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
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "membership inference ROC (log-log)")
    return save_figure(fig, path)
