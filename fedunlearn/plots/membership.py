"""Log-log ROC curves of a membership-inference attack, one per model (:func:`roc_figure`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from fedunlearn.plots.style import display_name, legend_outside, method_colour, save_figure

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
