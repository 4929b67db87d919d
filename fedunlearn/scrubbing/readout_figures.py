"""Figures of the readouts of forgetting (Golatkar et al. 2020, Section 5.3; the readouts
themselves are in :mod:`fedunlearn.scrubbing.readouts`), drawn by :mod:`fedunlearn.plots`' house
rules:

* **Entropy** per split and method (:func:`entropy_figure`, :func:`plot_entropy_histograms`): a
  model that forgot D_f is as uncertain on D_f as on unseen D_test; much *higher* entropy on D_f
  than on D_test gives the forgetting away (the *Streisand effect*).
* **Relearn time** per method (:func:`relearn_figure`, :func:`plot_relearn_times`): faster than
  the retrained model means information about D_f is still in the weights.
* **Remaining information vs. error** (:func:`information_tradeoff_figure`,
  :func:`plot_information_tradeoff`, the paper's Fig. 2): the scrub's noise weight lambda trades
  the bound on the information left about D_f (Proposition 2, in nats) against the error on D_f
  and D_test.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from fedunlearn.errors import ConfigError
from fedunlearn.plots import (
    caption,
    display_name,
    legend_outside,
    lift_off_line,
    marker_boxes,
    method_colour,
    place_labels,
    save_figure,
)
from fedunlearn.scrubbing.readouts import is_integer, is_real

#: The lowest entropy (nats) the log axis may reach; lower ones (and 0) are drawn at the axis'
#: floor, and a method whose median is there is labelled so.
ENTROPY_FLOOR = 1e-6
#: The white box behind a λ label: readable where it crosses a line.
LABEL_BOX = {"boxstyle": "round,pad=0.05", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
#: The trade-off figure's markers, one per method in order: colours alone tell the Fisher variants
#: apart only at a second look.
TRADEOFF_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
#: An error on D_f at least this high (a fraction) reads "100 %": the class is never predicted.
ALWAYS_FORGETS_ERROR = 0.995
#: Why a method sits at 100 % error on D_f at every λ, for the trade-off's caption (read with the
#: method's name and "100 % error on D_f at every λ" before it).
ALWAYS_FORGETS = {
    "fisher-reference": (
        ", as a model retrained without a forgotten class is: the authors' recipe resets that "
        "class's last-layer row to the prior mean 0\n(as the hiding baseline does), so the class is never "
        "predicted whatever the noise; λ moves only its error on D_test"
    ),
}
#: The splits' colours (D_r, D_f, D_test in that order): not any method's colour.
SPLIT_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#dadaeb", "#fdd0a2")


def d_f_caption(forget: str | None = None) -> str:
    """The caption line that says what D_f, D_r and D_test are (``forget``: which data D_f is,
    e.g. "class:3 (137 samples)")."""
    what = f" ({forget})" if forget else ""
    return (
        f"D_f: the data to forget{what}; D_r: the retained training data; "
        "D_test: held-out test data."
    )


def entropy_figure(
    entropies: Mapping[str, Mapping[str, np.ndarray]],
    *,
    num_classes: int | None = None,
    forget: str | None = None,
):
    """Output entropy per split and method in one panel (Section 5.3): a box per (method, split),
    quartiles and median, whiskers at the 5th and 95th percentiles, on a log axis (the entropies
    of confident predictions span decades near 0, where histograms show only spikes).

    Parameters
    ----------
    entropies : mapping
        ``{method: {split: entropies}}``, splits typically ``"D_r"``, ``"D_f"``, ``"D_test"``
        (from :func:`output_entropy`). Empty arrays and non-finite values are skipped.
    num_classes : int, optional
        K; a dotted line marks log K, the entropy of the uniform prediction.
    forget : str, optional
        Which data D_f is, for the caption.
    """
    if not entropies:
        raise ConfigError("entropies", dict(entropies), "at least one method's entropies")
    if num_classes is not None and not (is_integer(num_classes) and num_classes >= 2):
        raise ConfigError("num_classes", num_classes, "an integer >= 2, or None")
    cleaned = _finite_entropies(entropies)
    split_names = list(dict.fromkeys(s for splits in entropies.values() for s in splits))
    colours = {split: SPLIT_COLOURS[i % len(SPLIT_COLOURS)] for i, split in enumerate(split_names)}
    fig, ax = plt.subplots(figsize=(max(7.0, 0.85 * len(cleaned) + 2.5), 4.6))
    width = 0.8 / max(len(split_names), 1)
    floor = _entropy_floor(cleaned)
    for i, split in enumerate(split_names):
        offset = (i - (len(split_names) - 1) / 2) * width
        _entropy_boxes(ax, cleaned, split, (offset, width * 0.9), colours[split], floor)
    _floor_labels(ax, cleaned, floor)
    handles = [Patch(facecolor=colours[s], edgecolor="black", label=s) for s in split_names]
    if num_classes is not None:
        uniform = ax.axhline(
            math.log(num_classes),
            color="black",
            linestyle=":",
            linewidth=1,
            label=f"uniform prediction (log {num_classes})",
        )
        handles.append(uniform)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, (math.log(num_classes) if num_classes else 3.0) * 2)
    ax.set_xticks(range(len(cleaned)), list(cleaned), rotation=30, ha="right")
    ax.set_ylabel(f"entropy of the softmax output\n(nats, log axis; below {floor:g} drawn at it)")
    ax.grid(axis="y", alpha=0.3, which="both")
    legend_outside(ax, handles=handles)
    ax.set_title(
        "Output entropy (Golatkar et al. 2020, Sec. 5.3): a model that forgot D_f is as uncertain\n"
        "on D_f as on D_test; much higher entropy on D_f gives the forgetting away (Streisand)",
        fontsize=10,
    )
    caption(
        fig,
        d_f_caption(forget) + " Boxes: quartiles and median; whiskers: 5th to 95th percentile.",
    )
    return fig


def _entropy_floor(cleaned: Mapping[str, Mapping[str, np.ndarray]]) -> float:
    """The log axis' lowest entropy: a power of ten under every split's 5th percentile (so that
    every box shows, a near-certain model's too), 1e-4 at most, :data:`ENTROPY_FLOOR` at least
    (a saturated softmax's entropies of 1e-15 would squeeze every other box into a line)."""
    lows = [np.percentile(v, 5) for splits in cleaned.values() for v in splits.values()]
    lows = [low for low in lows if low > 0]
    low = min(lows, default=1e-4)
    return max(ENTROPY_FLOOR, min(1e-4, 10.0 ** math.floor(math.log10(low))))


def _entropy_boxes(ax, cleaned, split: str, place, colour, floor: float) -> None:
    """One split's box in every method's group (a method without that split gets none), at
    ``place`` = (offset from the group's centre, width)."""
    offset, width = place
    positions, data = [], []
    for index, splits in enumerate(cleaned.values()):
        if split in splits:
            positions.append(index + offset)
            data.append(np.maximum(splits[split], floor))
    if not data:
        return
    boxes = ax.boxplot(
        data,
        positions=positions,
        widths=width,
        whis=(5, 95),
        showfliers=False,
        patch_artist=True,
        manage_ticks=False,
        medianprops={"color": "black"},
    )
    for box in boxes["boxes"]:
        box.set_facecolor(colour)


def _floor_labels(ax, cleaned, floor: float) -> None:
    """Above a method whose boxes are squashed on the axis' floor, one label saying which."""
    for index, splits in enumerate(cleaned.values()):
        low = [split for split, values in splits.items() if np.median(values) <= floor]
        if low:
            which = "" if len(low) == len(splits) else f"{', '.join(low)}: "
            ax.annotate(
                f"{which}median\n≤ {floor:g}",
                (index, floor),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                va="bottom",
                fontsize=7,
                zorder=5,
                bbox=LABEL_BOX,  # over the whiskers
            )


def plot_entropy_histograms(
    entropies: Mapping[str, Mapping[str, np.ndarray]],
    path: str | Path,
    *,
    num_classes: int | None = None,
    forget: str | None = None,
) -> Path:
    """:func:`entropy_figure`, saved to ``path`` (the name is the figure's first form, one
    histogram per method; the boxes now share one panel). Returns ``path``."""
    fig = entropy_figure(entropies, num_classes=num_classes, forget=forget)
    return save_figure(fig, Path(path))


def _finite_entropies(
    entropies: Mapping[str, Mapping[str, np.ndarray]],
) -> dict[str, dict[str, np.ndarray]]:
    """``{method: {split: values}}`` with non-finite values and empty splits left out."""
    cleaned: dict[str, dict[str, np.ndarray]] = {}
    for method, splits in entropies.items():
        cleaned[method] = {}
        for split, values in splits.items():
            values = np.asarray(values, dtype=np.float64).ravel()
            values = values[np.isfinite(values)]
            if values.size:
                cleaned[method][split] = values
    return cleaned


def _check_columns(frame: pd.DataFrame, required: tuple[str, ...]) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ConfigError(
            "frame",
            f"columns {list(frame.columns)} (missing {missing})",
            f"a DataFrame with columns {list(required)}",
        )


def relearn_figure(frame: pd.DataFrame, *, forget: str | None = None):
    """Relearn time per method, in epochs, as vertical bars in each method's colour (Section 5.3).

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per method, columns ``method`` and ``relearn_epochs`` (NaN/None when the threshold
        was not reached), optionally ``relearn_budget_epochs`` (the budget, where a method that did
        not reach the threshold is drawn hatched and labelled "not reached"; without it the
        largest value in the plot stands in) and ``relearn_reached`` (bool). A dashed line marks
        the ``retrain`` row, the reference every forgetting method should match.
    forget : str, optional
        Which data D_f is, for the caption.

    A method that relearned at once (0 epochs: it kept D_f) is an outlined bar of height 0 with
    its "0", drawn above the axis (the y axis starts a little below 0), as is the retrain line.
    A value the retrain line would cross is lifted above it (:func:`lift_off_line`).
    """
    _check_columns(frame, ("method", "relearn_epochs"))
    methods = [str(m) for m in frame["method"]]
    lengths, reached = _relearn_lengths(frame)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(methods) + 2.5), 4.4))
    top = max(float(lengths.max()) if lengths.size else 1.0, 1e-12)
    labels = []
    for position, method, length, hit in zip(range(len(methods)), methods, lengths, reached):
        colour = method_colour(method)
        if hit:  # the outline keeps a bar of height 0 (relearned at once) visible
            ax.bar(position, length, 0.7, color=colour, edgecolor=colour, linewidth=2)
            label = f"{length:.2g}" if length else "0"
        else:
            ax.bar(position, length, 0.7, color="white", edgecolor=colour, hatch="//")
            label = f"not reached\n(> {length:.2g})"
        labels.append(
            ax.annotate(
                label,
                (position, length),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        )
    reference = None
    if "retrain" in methods:
        reference = lengths[methods.index("retrain")]
        ax.axhline(
            reference,
            color=method_colour("retrain"),
            linestyle="--",
            linewidth=1.2,
            label=f"retrain (reference): {reference:.2g} epochs",
        )
    handles, _ = ax.get_legend_handles_labels()
    if not reached.all():
        handles.append(
            Patch(facecolor="white", edgecolor="tab:gray", hatch="//", label="not reached: budget")
        )
    if handles:
        legend_outside(ax, handles=handles)
    ax.set_xticks(range(len(methods)), [display_name(m) for m in methods], rotation=30, ha="right")
    ax.set_ylim(-0.04 * top, 1.3 * top)  # below 0: a zero bar and a retrain line at 0 show
    ax.set_ylabel("epochs of fine-tuning on D = D_r + D_f\nuntil D_f's loss is relearned")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(
        "Relearn time (Golatkar et al. 2020, Sec. 5.3): faster than retrain\n"
        "means information about D_f is still in the weights",
        fontsize=10,
    )
    caption(fig, d_f_caption(forget))
    if reference is not None:
        for _ in range(2):  # a move changes the layout a little: measure again
            fig.tight_layout()
            lift_off_line(ax, labels, reference)
    return fig


def _relearn_lengths(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's bar height (its relearn time, or the budget when it was not reached) and
    whether it was reached."""
    values = pd.to_numeric(frame["relearn_epochs"], errors="coerce").to_numpy(dtype=float)
    reached = np.isfinite(values)
    if "relearn_reached" in frame.columns:
        reached &= frame["relearn_reached"].fillna(False).astype(bool).to_numpy()
    if "relearn_budget_epochs" in frame.columns:
        budgets = pd.to_numeric(frame["relearn_budget_epochs"], errors="coerce").to_numpy(float)
    else:
        budgets = np.full(len(frame), np.nan)
    known = np.concatenate([values[reached], budgets[np.isfinite(budgets)]])
    fallback = float(known.max()) if known.size and known.max() > 0 else 1.0
    budgets = np.where(np.isfinite(budgets), budgets, fallback)
    return np.where(reached, values, budgets), reached


def plot_relearn_times(frame: pd.DataFrame, path: str | Path, *, forget: str | None = None) -> Path:
    """:func:`relearn_figure`, saved to ``path``; returns ``path``."""
    return save_figure(relearn_figure(frame, forget=forget), Path(path))


def information_tradeoff_figure(frame: pd.DataFrame, *, forget: str | None = None):
    """Remaining information about D_f vs. error, per method and lambda (the paper's Fig. 2).

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per (method, lambda): columns ``method``, ``lam``, ``information_nats`` (the
        Proposition 2 bound, nats), ``error_forget`` and ``error_test`` (fractions in [0, 1],
        plotted in percent). Rows with a non-positive or NaN information bound cannot be drawn
        on the log axis and are dropped.
    forget : str, optional
        Which data D_f is, for the caption.

    Each method has its colour and its own marker; each point is labelled with its λ, beside it
    where none overlaps another label or a marker (:func:`place_labels`). A method at 100 % error on D_f
    at every λ is named under the figure, with the reason where :data:`ALWAYS_FORGETS` knows it.
    """
    _check_columns(frame, ("method", "lam", "information_nats", "error_forget", "error_test"))
    data = frame.copy()
    data["information_nats"] = pd.to_numeric(data["information_nats"], errors="coerce")
    data = data[np.isfinite(data["information_nats"]) & (data["information_nats"] > 0)]

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharex=True)
    panels = (("error_forget", "error on D_f (%)"), ("error_test", "error on D_test (%)"))
    labels = {ax: [] for ax in axes}
    markers = dict(zip(data["method"].drop_duplicates(), itertools.cycle(TRADEOFF_MARKERS)))
    for ax, (column, label) in zip(axes, panels):
        for method, rows in data.groupby("method", sort=False):
            labels[ax] += _tradeoff_line(ax, str(method), rows, column, markers[method])
        if data.empty:
            ax.text(
                0.5,
                0.5,
                "no positive, finite information bound to plot",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        else:
            ax.set_xscale("log")
            ax.margins(x=0.1, y=0.15)  # room for the lambda labels
        ax.set_xlabel("information left about D_f, upper bound (nats)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    legend_outside(axes[1])
    fig.suptitle(
        "Forgetting trade-off (Golatkar et al. 2020, Fig. 2): more noise (larger λ) leaves\n"
        "less information about D_f, at the price of more error; points labelled with λ",
        fontsize=10,
    )
    caption(fig, "\n".join([d_f_caption(forget), *_always_forgets_notes(data)]))
    for _ in range(2):  # the labels' moves change the layout a little: measure again
        fig.tight_layout()
        for ax in axes:
            place_labels(ax, labels[ax], avoid=marker_boxes(ax))
    return fig


def _always_forgets_notes(data: pd.DataFrame) -> list[str]:
    """A caption line per method whose error on D_f is 100 % at every λ drawn (a flat line at the
    top of the D_f panel), with its reason where :data:`ALWAYS_FORGETS` has one."""
    notes = []
    for method, rows in data.groupby("method", sort=False):
        errors = pd.to_numeric(rows["error_forget"], errors="coerce")
        if len(errors) and (errors >= ALWAYS_FORGETS_ERROR).all():
            reason = ALWAYS_FORGETS.get(str(method), "")
            notes.append(f"{display_name(str(method))}: 100 % error on D_f at every λ{reason}")
    return notes


def _tradeoff_line(ax, method: str, rows: pd.DataFrame, column: str, marker: str) -> list:
    """One method's line of λ points in its colour and marker; returns its λ labels."""
    rows = rows.sort_values("information_nats")
    errors = pd.to_numeric(rows[column], errors="coerce") * 100.0
    colour = method_colour(method)
    ax.plot(
        rows["information_nats"], errors, marker=marker, color=colour, label=display_name(method)
    )
    text = tuple(0.7 * c for c in to_rgb(colour))  # darker: a light line colour reads as text too
    return [
        ax.annotate(
            f"{lam:.0e}".replace("e-0", "e-") if is_real(lam) else str(lam),
            (x, y),
            textcoords="offset points",
            xytext=(0, 5),
            ha="center",
            fontsize=7,
            color=text,
            zorder=5,
            bbox=LABEL_BOX,
        )
        for x, y, lam in zip(rows["information_nats"], errors, rows["lam"])
        if np.isfinite(y)
    ]


def plot_information_tradeoff(
    frame: pd.DataFrame, path: str | Path, *, forget: str | None = None
) -> Path:
    """:func:`information_tradeoff_figure`, saved to ``path``; returns ``path``."""
    return save_figure(information_tradeoff_figure(frame, forget=forget), Path(path))
