"""Figures read at a glance: whole-number ticks where rounds or counts are counted, a value on every
bar (a bar of height zero included, which stays visible), legends outside the data, and titles that
name every client forgotten so far. Checked on the Figure objects (Agg), never on PNG bytes."""

from __future__ import annotations

import zlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedunlearn.plots import (  # noqa: E402
    FALLBACK_COLOURS,
    METHOD_COLOURS,
    forgetting_title,
    labelled_bars,
    method_colour,
    neuron_angles_figure,
    training_curves_figure,
    unlearning_figure,
)
from fedunlearn.registry import AUDITED, SCRUBBING, UNLEARNING  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def integer_only(axis) -> bool:
    """The axis puts ticks on whole numbers only (MaxNLocator(integer=True), and the ticks it
    draws are whole)."""
    locator = axis.get_major_locator()
    ticks = [t for t in axis.get_majorticklocs() if np.isfinite(t)]
    return (
        isinstance(locator, MaxNLocator)
        and locator._integer
        and all(float(t).is_integer() for t in ticks)
    )


def legend_outside_axes(ax) -> bool:
    legend = ax.get_legend()
    assert legend is not None, f"{ax.get_title()!r} has no legend"
    ax.figure.canvas.draw()
    box = legend.get_window_extent()
    axes_box = ax.get_window_extent()
    return box.x0 >= axes_box.x1 or box.y0 >= axes_box.y1 or box.x1 <= axes_box.x0


def bar_labels(ax) -> list[str]:
    return [text.get_text() for text in ax.texts]


METRICS = pd.DataFrame(
    {
        "round": [0, 1, 2, 3],
        "test_accuracy": [0.1, 0.6, 0.8, 0.85],
        "test_loss": [2.3, 1.2, 0.6, 0.5],
        "train_loss": [np.nan, 1.5, 0.9, 0.6],
        "retained": [False, True, False, True],
    }
)

# FedAccum forgot everything the target had (0 on its data): the bar must not vanish.
TABLE = pd.DataFrame(
    {
        "method": ["fedavg", "federaser", "fedaccum", "fedretrain"],
        "test_accuracy": [0.97, 0.92, 0.75, 0.97],
        "target_accuracy": [0.98, 0.89, 0.0, 0.96],
        "seconds": [np.nan, 2.1, 0.0, 4.1],
    }
)


def test_round_axes_have_whole_number_ticks_and_legends_outside():
    fig = training_curves_figure(METRICS)
    for ax in fig.axes:
        assert ax.get_xlabel() == "round"
        assert integer_only(ax.xaxis), ax.xaxis.get_majorticklocs()
        assert legend_outside_axes(ax)


def test_a_count_axis_has_whole_number_ticks():
    fig = neuron_angles_figure({"federaser": [1.0, 2.5, 3.0], "fedaccum": [4.0, 9.0]})
    (ax,) = fig.axes
    assert "neurons" in ax.get_ylabel()
    assert integer_only(ax.yaxis)
    assert legend_outside_axes(ax)


def test_every_bar_has_its_value_and_a_zero_bar_stays_visible():
    fig = unlearning_figure(TABLE, title="digits")
    accuracy, seconds = fig.axes
    bars = [patch for container in accuracy.containers for patch in container]
    assert len(bars) == 2 * len(TABLE)
    labels = bar_labels(accuracy)
    assert len(labels) == len(bars)
    for value in [*TABLE["test_accuracy"], *TABLE["target_accuracy"]]:
        assert f"{value:.2f}" in labels
    zero = [bar for bar in bars if bar.get_height() == 0]
    assert len(zero) == 1 and zero[0].get_linewidth() > 0
    assert zero[0].get_edgecolor()[3] > 0  # an opaque outline: a line on the axis, not nothing
    assert legend_outside_axes(accuracy)
    # The timed methods only (FedAvg has no unlearning time), the zero time labelled too.
    assert len(bar_labels(seconds)) == TABLE["seconds"].notna().sum()
    assert "0" in bar_labels(seconds)


def test_labelled_bars_draws_nan_as_a_labelled_zero():
    fig, ax = plt.subplots()
    bars = labelled_bars(ax, [0, 1], [np.nan, 2.0])
    assert [bar.get_height() for bar in bars] == [0.0, 2.0]
    assert bar_labels(ax) == ["0", "2"]


def test_a_later_request_is_titled_with_every_target_so_far():
    first = forgetting_title("digits", 10, [0])
    assert first == "digits, K=10, forget [0]"
    later = forgetting_title("digits", 10, [3], earlier=[0, 5])
    assert "forget [3]" in later and "[0, 3, 5]" in later
    fig = unlearning_figure(TABLE, title=later)
    assert "[0, 3, 5]" in fig._suptitle.get_text()


# ------------------------------------------------------------ colours and names (issue 26)
def test_every_method_name_has_one_fixed_colour_and_unknown_names_a_stable_one():
    registered = [spec.name for registry in (UNLEARNING, SCRUBBING, AUDITED) for spec in registry]
    assert set(registered) <= set(METHOD_COLOURS)
    # Distinct colours but for the two retrained references (black in every figure).
    colours = [c for name, c in METHOD_COLOURS.items() if name != "retrain"]
    assert len(set(colours)) == len(colours)
    assert method_colour("fedavg") == method_colour("original")
    assert "tab:red" not in METHOD_COLOURS.values()  # red marks FLAGGED rows
    unknown = method_colour("my-new-method")
    assert unknown == method_colour("my-new-method")
    assert unknown == FALLBACK_COLOURS[zlib.crc32(b"my-new-method") % len(FALLBACK_COLOURS)]
