"""The certified head over its removal requests: accuracy, and the gradient-residual bound β
against its budget (:func:`certified_removal_figure`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from fedunlearn.plots.style import caption, integer_ticks, legend_outside, save_figure

#: The accuracy axis spans at least this many points: a dip of half a point must not fill the
#: panel and look like a cliff.
ACCURACY_MIN_SPAN_POINTS = 5.0


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
    _accuracy_panel(left, table)
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


def _accuracy_panel(ax, table: pd.DataFrame) -> None:
    """Test accuracy in percent per request, on an axis of at least
    :data:`ACCURACY_MIN_SPAN_POINTS` points (:func:`accuracy_limits`), the spread in the title."""
    percent = 100.0 * pd.to_numeric(table["test_accuracy"], errors="coerce")
    ax.plot(table["requests"], percent, marker="o", ms=3, color="#393b79")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(*accuracy_limits(percent))
    title = "accuracy of the certified head"
    finite = percent[percent.notna()]
    if len(finite):
        low, high = float(finite.min()), float(finite.max())
        title += f"\n(from {low:.1f} to {high:.1f} %: {high - low:.2g} points apart)"
    ax.set_title(title, fontsize=10)


def accuracy_limits(percent, span: float = ACCURACY_MIN_SPAN_POINTS) -> tuple[float, float]:
    """The y limits (percent) of an accuracy axis: the values' range with a margin, widened about
    its middle to at least ``span`` points, shifted back inside [0, 100]."""
    values = pd.to_numeric(pd.Series(percent), errors="coerce").dropna().to_numpy(dtype=float)
    if not len(values):
        return 0.0, 100.0
    low, high = float(values.min()), float(values.max())
    width = min(100.0, max(span, 1.2 * (high - low)))
    bottom = (low + high - width) / 2
    bottom = min(max(bottom, 0.0), 100.0 - width)
    return bottom, bottom + width


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
