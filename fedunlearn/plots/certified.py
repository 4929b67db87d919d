"""The certified head over its removal requests: accuracy, and the gradient-residual bound β
against its budget (:func:`certified_removal_figure`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from fedunlearn.plots.style import caption, integer_ticks, legend_outside, save_figure


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
