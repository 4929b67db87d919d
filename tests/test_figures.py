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
from matplotlib.colors import to_rgb, to_rgba  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedunlearn.membership.metrics import roc_points  # noqa: E402
from fedunlearn.plots import (  # noqa: E402
    FALLBACK_COLOURS,
    METHOD_COLOURS,
    certified_removal_figure,
    forgetting_title,
    labelled_bars,
    marker_boxes,
    method_colour,
    method_colours,
    neuron_angles_figure,
    roc_figure,
    tradeoff_figure,
    training_curves_figure,
    unlearning_figure,
)
from fedunlearn.plots.certified import ACCURACY_MIN_SPAN_POINTS, accuracy_limits  # noqa: E402
from fedunlearn.plots.unlearning import MAX_ANGLE_BINS, angle_bins  # noqa: E402
from fedunlearn.registry import AUDITED, SCRUBBING, UNLEARNING  # noqa: E402
from fedunlearn.scrubbing.readout_figures import (  # noqa: E402
    entropy_figure,
    information_tradeoff_figure,
    relearn_figure,
)


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
        "retained_mb": [0.0, 7.7, 7.7, 0.0],
        "client_epochs": [0, 45, 0, 1800],
    }
)


def test_round_axes_have_whole_number_ticks_and_legends_outside():
    fig = training_curves_figure(METRICS)
    accuracy, loss = fig.axes  # later rounds spread over a third of the range: no zoom
    for ax in fig.axes:
        assert ax.get_xlabel() == "round"
        assert integer_only(ax.xaxis), ax.xaxis.get_majorticklocs()
    assert legend_outside_axes(loss)
    assert accuracy.get_legend() is None  # the caption says what the rings are
    assert any("retained" in t.get_text() for t in fig.texts if t.get_gid() == "caption")
    assert loss.get_yscale() == "linear"  # 2.3 to 0.5: less than a decade


# A real digits run (sensitivity sweep, IID, seed 0): chance at round 0, 0.90 after round 1, then
# 0.97 to 0.98; the clients' train loss falls from 0.25 to 5e-4.
JUMP = pd.DataFrame(
    {
        "round": range(8),
        "test_accuracy": [0.131, 0.900, 0.969, 0.967, 0.973, 0.973, 0.978, 0.978],
        "test_loss": [2.31, 0.329, 0.136, 0.120, 0.107, 0.096, 0.093, 0.073],
        "train_loss": [np.nan, 0.253, 0.036, 0.0037, 0.0091, 0.0078, 0.0020, 0.0005],
        "retained": [False, True, False, True, False, True, False, True],
    }
)


def test_rounds_after_a_first_jump_get_a_zoomed_panel_and_losses_a_log_axis():
    """On one linear axis from 0.13 to 0.98, rounds 2 to 7 (within 1.1 points) are a flat line:
    a second panel shows the rounds after the first on their own axis, and the losses, falling by
    decades, are on a log axis."""
    fig = training_curves_figure(JUMP)
    full, zoom, loss = fig.axes
    assert full.get_ylim()[0] < 0.2  # the whole story, chance included
    lines = [line for line in zoom.get_lines() if len(line.get_xdata()) > 1]
    assert list(lines[0].get_xdata()) == list(range(1, 8))  # round 0 left out
    low, high = zoom.get_ylim()
    later = JUMP["test_accuracy"].iloc[1:]
    assert (later.max() - later.min()) / (high - low) > 0.8  # the later rounds fill the panel
    assert "zoom" in zoom.get_title()
    assert loss.get_yscale() == "log"
    for ax in fig.axes:
        assert integer_only(ax.xaxis)
    assert legend_outside_axes(loss)


def test_a_count_axis_has_whole_number_ticks():
    fig = neuron_angles_figure({"federaser": [1.0, 2.5, 3.0], "fedaccum": [4.0, 9.0]})
    (ax,) = fig.axes
    assert "neurons" in ax.get_ylabel()
    assert integer_only(ax.yaxis)
    assert legend_outside_axes(ax)


def test_every_bar_has_its_value_and_a_zero_bar_stays_visible():
    fig = unlearning_figure(TABLE, title="digits")
    test, target, seconds = fig.axes
    for ax, column in ((test, "test_accuracy"), (target, "target_accuracy")):
        bars = [patch for container in ax.containers for patch in container]
        assert len(bars) == len(TABLE) - 1  # every method but FedRetrain, the zero line
        assert len(bar_labels(ax)) == len(bars)
        reference = float(TABLE.loc[TABLE["method"] == "fedretrain", column].iloc[0])
        for value in TABLE.loc[TABLE["method"] != "fedretrain", column]:
            assert f"{100 * (value - reference):+.1f}" in bar_labels(ax)
    # The original model is exactly as accurate as FedRetrain on the test data: a gap of 0.
    zero = [
        patch for container in test.containers for patch in container if patch.get_height() == 0
    ]
    assert len(zero) == 1 and zero[0].get_linewidth() > 0
    assert zero[0].get_edgecolor()[3] > 0  # an opaque outline: a line on the axis, not nothing
    (zero_line,) = [line for line in test.get_lines() if list(line.get_ydata()) == [0, 0]]
    assert zero[0].get_zorder() > zero_line.get_zorder()  # drawn over FedRetrain's zero line
    # The timed methods only (the original model has no unlearning time), the zero time labelled.
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


# ------------------------------------------------------------------------ colours and names
ANGLES = {
    m: list(np.linspace(2, 30, 10) + i) for i, m in enumerate(["fedavg", "federaser", "fedaccum"])
}
RNG = np.random.default_rng(0)
N = 150  # members and non-members of the ROC curves
CURVES = {
    name: roc_points(RNG.normal(shift, 1, N), RNG.normal(0, 1, N))
    for name, shift in [("fedavg", 1.0), ("federaser", 0.3), ("fedaccum", 0.2), ("fedretrain", 0.0)]
}
RELEARN = pd.DataFrame(
    {
        "method": ["original", "retrain", "federaser", "newton", "fisher"],
        "relearn_epochs": [0.0, 0.5, 0.0, np.nan, 0.05],
        "relearn_budget_epochs": [1.0] * 5,
    }
)


def every_text(fig) -> list[str]:
    """Every string the figure shows: titles, labels, tick labels, legends, texts."""
    fig.canvas.draw()
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    return [t for t in texts if t]


def test_every_method_name_has_one_fixed_colour_and_unknown_names_a_stable_one():
    """The colours are the registry entries' own: a built-in entry declares one, a method
    registered without one gets a stable colour from its name, never an error."""
    specs = [spec for registry in (UNLEARNING, SCRUBBING, AUDITED) for spec in registry]
    for spec in specs:
        fallback = FALLBACK_COLOURS[zlib.crc32(spec.name.encode()) % len(FALLBACK_COLOURS)]
        assert method_colour(spec.name) == (spec.colour or fallback)
    assert {spec.name for spec in specs if spec.colour} <= set(method_colours())
    assert METHOD_COLOURS["crab"] == UNLEARNING["crab"].colour  # the built-ins declare theirs
    # Distinct colours but for the two retrained references (black in every figure).
    colours = [c for name, c in METHOD_COLOURS.items() if name != "retrain"]
    assert len(set(colours)) == len(colours)
    assert method_colour("fedavg") == method_colour("original")
    assert "tab:red" not in METHOD_COLOURS.values()  # red marks FLAGGED rows
    unknown = method_colour("my-new-method")
    assert unknown == method_colour("my-new-method")
    assert unknown == FALLBACK_COLOURS[zlib.crc32(b"my-new-method") % len(FALLBACK_COLOURS)]
    with SCRUBBING.registered("my-new-method", lambda context, name: None):
        assert method_colour("my-new-method") == unknown
    with SCRUBBING.registered("my-new-method", lambda context, name: None, colour="#123456"):
        assert method_colour("my-new-method") == "#123456"


def test_the_same_method_has_the_same_colour_in_every_figure():
    """FedEraser's bars, points and lines have one colour across the unlearning, trade-off,
    angle, ROC and relearn figures (and the original model one too)."""
    expected = to_rgba(METHOD_COLOURS["federaser"])
    unlearning = unlearning_figure(TABLE).axes[0]
    bars = dict(zip(["fedavg", "federaser", "fedaccum"], unlearning.patches))
    assert tuple(bars["federaser"].get_facecolor()) == expected
    assert tuple(bars["fedavg"].get_facecolor()) == to_rgba(METHOD_COLOURS["original"])
    trade = tradeoff_figure(TABLE).axes[0]
    points = dict(zip(["federaser", "fedaccum", "fedretrain"], trade.collections))
    assert tuple(points["federaser"].get_facecolors()[0]) == expected
    angles = neuron_angles_figure(ANGLES).axes[0]
    by_label = {c.get_label(): c.patches[0] for c in angles.containers}
    assert tuple(by_label["federaser"].get_facecolor()) == expected
    assert tuple(by_label["original"].get_facecolor()) == to_rgba(METHOD_COLOURS["original"])
    roc = roc_figure(CURVES).axes[0]
    lines = {line.get_label().split(" (")[0]: line for line in roc.get_lines()}
    assert to_rgba(lines["federaser"].get_color()) == expected
    assert to_rgba(lines["original"].get_color()) == to_rgba(METHOD_COLOURS["original"])
    relearn = relearn_figure(RELEARN).axes[0]
    relearn_bars = dict(zip(RELEARN["method"], relearn.patches))
    assert tuple(relearn_bars["federaser"].get_facecolor()) == expected


def test_no_figure_says_fedavg_but_original():
    figures = [
        unlearning_figure(TABLE),
        tradeoff_figure(TABLE),
        neuron_angles_figure(ANGLES),
        roc_figure(CURVES),
    ]
    for fig in figures:
        texts = every_text(fig)
        assert not [t for t in texts if "fedavg" in t.lower()], texts
    for fig in figures[:1] + figures[2:]:  # the trade-off leaves the original model out
        assert any("original" in t for t in every_text(fig))


# ------------------------------------------------------------------ unlearning.png, tradeoff.png
def test_unlearning_bars_are_gaps_to_fedretrain_so_small_differences_show():
    """A 0.5-point gap is a bar at least a tenth of its panel's height (on raw 0-1 bars it would
    be half a percent); the axis says "points vs FedRetrain"."""
    table = TABLE.assign(
        test_accuracy=[0.970, 0.965, 0.950, 0.970], target_accuracy=[0.98, 0.955, 0.94, 0.96]
    )
    fig = unlearning_figure(table)
    test = fig.axes[0]
    assert "points vs FedRetrain" in test.get_ylabel()
    bars = dict(zip(["fedavg", "federaser", "fedaccum"], test.patches))
    assert bars["federaser"].get_height() == pytest.approx(-0.5)
    low, high = test.get_ylim()
    assert abs(bars["federaser"].get_height()) / (high - low) > 0.1
    assert any("FedRetrain" in t.get_text() for t in fig.texts)  # the caption reads the bars


def test_tradeoff_speaks_of_test_accuracy_points_vs_fedretrain_and_of_unlearning():
    fig = tradeoff_figure(TABLE)
    (ax,) = fig.axes
    texts = every_text(fig)
    assert any("test-accuracy points vs FedRetrain" in t for t in texts)
    assert "unlearn" in ax.get_ylabel() and "recovery" not in ax.get_ylabel().split("(")[0]
    labels = [t.get_text() for t in ax.texts]
    assert "federaser: -5.0 pts" in labels and any(t.startswith("fedretrain") for t in labels)
    # Every label inside the axes (a point at the right edge is labelled on its left), none
    # over another, and no negative storage on the x axis.
    box = ax.get_window_extent()
    extents = [t.get_window_extent() for t in ax.texts]
    assert all(box.x0 <= e.x0 and e.x1 <= box.x1 for e in extents), labels
    assert not any(a.overlaps(b) for i, a in enumerate(extents) for b in extents[i + 1 :])
    assert ax.get_xlim()[0] >= -0.05 * TABLE["retained_mb"].max()


# ------------------------------------------------------------------------- membership_roc.png
def test_roc_curves_are_distinct_with_their_auc_and_the_axis_stops_at_one_over_n():
    curves = {**CURVES, "retrain": CURVES["fedretrain"]}  # fedretrain and retrain: both black
    fig = roc_figure(curves)
    (ax,) = fig.axes
    lines = ax.get_lines()
    styles = [(to_rgba(line.get_color()), str(line.get_linestyle())) for line in lines]
    assert len(set(styles)) == len(styles) == len(curves) + 1  # + chance
    labels = [line.get_label() for line in lines]
    assert all("AUC" in label for label in labels)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all("AUC" in text for text in legend) and len(legend) == len(labels)
    assert ax.get_xscale() == "log"
    assert ax.get_xlim()[0] >= 1 / N - 1e-12
    assert ax.get_xlim()[0] == pytest.approx(1 / N)
    assert ax.get_ylim()[0] >= 1 / N - 1e-12
    # The AUC in the legend is the area under the drawn curve.
    fpr, tpr = CURVES["federaser"]
    assert f"AUC {np.trapezoid(tpr, fpr):.3f}" in labels[1]
    # Told the sample sizes, the axes follow them.
    small = roc_figure(CURVES, negatives=40, positives=20).axes[0]
    assert small.get_xlim()[0] == pytest.approx(1 / 40) and small.get_ylim()[0] == pytest.approx(
        1 / 20
    )


# ---------------------------------------------------------------------- certified_removal.png
CERTIFIED = pd.DataFrame(
    {
        "requests": [0, 10, 20, 30, 40, 50],
        "test_accuracy": [0.95, 0.95, 0.94, 0.94, 0.94, 0.93],
        "beta": [0.0, 1e-4, 3e-4, 2e-5, 2e-4, 5e-4],
        "retrains": [0, 0, 0, 1, 1, 1],
    }
)


def test_certified_figure_marks_retrains_shows_the_budget_and_names_the_run():
    budget = 0.02  # far above every beta: the y range still reaches it
    fig = certified_removal_figure(
        CERTIFIED, budget, "certified removal: run digits-a", retrained=[27]
    )
    accuracy, bound = fig.axes[:2]
    assert "digits-a" in fig._suptitle.get_text()
    budget_lines = [line for line in bound.get_lines() if np.allclose(line.get_ydata(), budget)]
    assert len(budget_lines) == 1
    low, high = bound.get_ylim()
    assert low < budget < high and high / budget > 1.2  # not on the frame
    for ax in (accuracy, bound):
        marks = [line for line in ax.get_lines() if np.allclose(line.get_xdata(), 27)]
        assert len(marks) == 1 and "retrain" in marks[0].get_label()
    # Without the list, the retrains are read off the table's cumulative count.
    fig = certified_removal_figure(CERTIFIED, budget)
    assert [line for line in fig.axes[0].get_lines() if np.allclose(line.get_xdata(), 30)]


def test_a_dip_of_a_point_is_drawn_as_a_point_not_as_a_cliff():
    """The certified head of a real digits run moved between 91.8 and 93.1 %: the accuracy axis
    spans at least 5 points (the dip is a quarter of it, not all of it) and the title says how many
    points apart the values are; values near 100 % keep the axis under 100."""
    table = CERTIFIED.assign(test_accuracy=[0.929, 0.931, 0.931, 0.918, 0.920, 0.929])
    accuracy = certified_removal_figure(table, 0.2).axes[0]
    low, high = accuracy.get_ylim()
    assert high - low >= ACCURACY_MIN_SPAN_POINTS
    assert low <= 91.8 and 93.1 <= high
    (line,) = [line for line in accuracy.get_lines() if len(line.get_xdata()) == len(table)]
    assert np.allclose(line.get_ydata(), 100 * table["test_accuracy"])  # percent, as the label
    assert "%" in accuracy.get_ylabel()
    assert "1.3 points apart" in accuracy.get_title()
    assert accuracy_limits([99.0, 99.8]) == (95.0, 100.0)
    assert accuracy_limits([0.0, 0.4]) == (0.0, 5.0)
    assert accuracy_limits([20.0, 80.0]) == pytest.approx((14.0, 86.0))  # wider: the data's


# ------------------------------------------------------------------------ scrubbing_*.png
def test_scrubbing_tradeoff_labels_do_not_overlap_and_d_f_is_defined():
    rows = [
        {"method": m, "lam": lam, "information_nats": info, "error_forget": ef, "error_test": et}
        for m, shift in (("newton", 0.0), ("fisher", 0.004), ("fisher-sqrt", 0.008))
        for lam, info, ef, et in (
            (1e-8, 5e3, 0.20 + shift, 0.05 + shift),
            (1e-7, 4e3, 0.21 + shift, 0.05 + shift),  # close to its neighbour on a log axis
            (1e-6, 3e3, 0.22 + shift, 0.06 + shift),
            (1e-5, 1e2, 0.60 + shift, 0.30 + shift),
        )
    ]
    fig = information_tradeoff_figure(pd.DataFrame(rows), forget="class:3, 137 samples")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert len(boxes) == 12
        overlapping = [
            (ax.texts[i].get_text(), ax.texts[j].get_text())
            for i in range(len(boxes))
            for j in range(i + 1, len(boxes))
            if boxes[i].overlaps(boxes[j])
        ]
        assert overlapping == []
    assert any("D_f: the data to forget (class:3, 137 samples)" in t.get_text() for t in fig.texts)


# scrubbing_tradeoff.csv of a real run (simulations/scrub_digits.toml, 5 rounds, class 3 forgotten):
# method, lambda exponent, information (nats), error on D_f, error on D_test.
SCRUB_TRADEOFF = pd.DataFrame(
    [
        {"method": m, "lam": 10.0**e, "information_nats": i, "error_forget": f, "error_test": t}
        for m, e, i, f, t in [
            ("newton", -8, 5127.6, 0.2555, 0.0467),
            ("newton", -7, 1641.6, 0.2336, 0.0511),
            ("newton", -6, 539.3, 0.2409, 0.0600),
            ("newton", -5, 190.7, 0.2336, 0.0756),
            ("newton", -4, 80.48, 0.4234, 0.2378),
            ("fisher", -9, 4377.1, 0.1533, 0.0956),
            ("fisher", -8, 1508.8, 0.0730, 0.0956),
            ("fisher", -7, 601.8, 0.1387, 0.1400),
            ("fisher", -6, 314.9, 0.5109, 0.3533),
            ("fisher", -5, 224.2, 0.7956, 0.8200),
            ("fisher-sqrt", -13, 101664.6, 0.0949, 0.0844),
            ("fisher-sqrt", -12, 32803.0, 0.1314, 0.0867),
            ("fisher-sqrt", -11, 11027.0, 0.1752, 0.0867),
            ("fisher-sqrt", -10, 4140.8, 0.0511, 0.1178),
            ("fisher-sqrt", -9, 1963.2, 0.6861, 0.2822),
            ("fisher-reference", -14, 26500.0, 1.0, 0.1756),
            ("fisher-reference", -13, 8452.0, 1.0, 0.1822),
            ("fisher-reference", -12, 2744.7, 1.0, 0.1867),
            ("fisher-reference", -11, 939.9, 1.0, 0.2044),
            ("fisher-reference", -10, 369.2, 1.0, 0.3644),
        ]
    ]
)


def test_scrubbing_tradeoff_of_a_real_run_reads_at_a_glance():
    """Saved as save_figure saves it (120 dpi), no λ label overlaps another label or a marker; the
    three Fisher variants differ in colour (at least 0.35 apart in RGB, on 0..1 axes) and in
    marker; fisher-reference's flat line at 100 % on D_f is explained under the figure."""
    fig = information_tradeoff_figure(SCRUB_TRADEOFF, forget="class:3, 137 samples")
    fig.set_dpi(120)
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:2]:
        labels = [t for t in ax.texts if t.get_text()]
        assert len(labels) == len(SCRUB_TRADEOFF)
        boxes = [t.get_window_extent(renderer) for t in labels]
        overlapping = [
            (labels[i].get_text(), labels[j].get_text())
            for i in range(len(boxes))
            for j in range(i + 1, len(boxes))
            if boxes[i].overlaps(boxes[j])
        ]
        assert overlapping == [], ax.get_ylabel()
        on_markers = [
            t.get_text()
            for t, b in zip(labels, boxes)
            if any(b.overlaps(m) for m in marker_boxes(ax))
        ]
        assert on_markers == [], ax.get_ylabel()
    fisher = ["fisher", "fisher-sqrt", "fisher-reference"]
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    for i, a in enumerate(fisher):
        for b in fisher[i + 1 :]:
            distance = np.linalg.norm(
                np.subtract(to_rgb(method_colour(a)), to_rgb(method_colour(b)))
            )
            assert distance >= 0.35, (a, b, distance)
            assert lines[a].get_marker() != lines[b].get_marker()
    (note,) = [t.get_text() for t in fig.texts if t.get_gid() == "caption"]
    assert "fisher-reference: 100 % error on D_f at every λ" in note
    assert "never predicted" in note and "newton:" not in note  # only the flat line is named


def test_relearn_zero_bars_and_the_retrain_line_are_visible_and_nothing_is_clipped():
    fig = relearn_figure(RELEARN, forget="class:3")
    (ax,) = fig.axes
    low, high = ax.get_ylim()
    bars = dict(zip(RELEARN["method"], ax.patches))
    for zero in ("original", "federaser"):
        bar = bars[zero]
        assert bar.get_height() == 0 and bar.get_linewidth() > 0 and bar.get_edgecolor()[3] > 0
        assert low < 0  # the bar of height 0 lies above the x axis, not on it
    (retrain,) = [line for line in ax.get_lines() if "retrain" in line.get_label()]
    y = retrain.get_ydata()[0]
    assert 0 < y < high and y > low
    # A retrain that relearned at once: its line at 0 still above the axis.
    at_once = relearn_figure(RELEARN.assign(relearn_epochs=[0.0, 0.0, 0.0, np.nan, 0.05])).axes[0]
    (line,) = [line for line in at_once.get_lines() if "retrain" in line.get_label()]
    assert at_once.get_ylim()[0] < line.get_ydata()[0] == 0
    # Every value label (the "not reached" one too) lies inside the axes.
    fig.canvas.draw()
    box = ax.get_window_extent()
    for text in ax.texts:
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text.get_text()
        assert box.y0 <= extent.y0 and extent.y1 <= box.y1, text.get_text()
    assert "0" in [t.get_text() for t in ax.texts]
    assert any(t.get_text().startswith("D_f: ") for t in fig.texts)


def test_no_relearn_value_is_written_on_the_retrain_line():
    """A bar just under retrain's (0.47 vs 0.5 epochs) has its value where the dashed line runs,
    as retrain's own value sits on it: both are lifted clear of the line, at the dpi of the save."""
    frame = RELEARN.assign(relearn_epochs=[0.0, 0.5, 0.47, np.nan, 0.05])
    fig = relearn_figure(frame)
    (ax,) = fig.axes
    fig.set_dpi(120)
    fig.tight_layout()
    fig.canvas.draw()
    (line,) = [line for line in ax.get_lines() if "retrain" in line.get_label()]
    y = ax.transData.transform((0.0, line.get_ydata()[0]))[1]
    clearance = 2.0 * fig.dpi / 72.0  # two points
    crossed = [
        t.get_text()
        for t in ax.texts
        if t.get_window_extent().y0 - clearance < y < t.get_window_extent().y1 + clearance
    ]
    assert crossed == []
    box = ax.get_window_extent()
    assert all(box.y0 <= t.get_window_extent().y1 <= box.y1 for t in ax.texts)  # still inside


def test_entropy_is_one_readable_panel_on_a_log_axis():
    rng = np.random.default_rng(1)
    methods = ["original", "retrain", "newton", "newton-finite", "fisher", "finetune", "hiding"]
    methods += ["fisher-sqrt", "negative-gradient", "random-labels", "class-pruning"]
    entropies = {
        m: {
            "D_r": rng.exponential(0.3, 200),
            "D_f": rng.exponential(0.9, 40),
            "D_test": rng.exponential(0.4, 90),
        }
        for m in methods
    }
    entropies["newton-finite"] = {k: v * 1e-3 for k, v in entropies["newton-finite"].items()}
    entropies["hiding"] = {k: np.zeros_like(v) for k, v in entropies["hiding"].items()}
    fig = entropy_figure(entropies, num_classes=10, forget="class:3, 40 samples")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 1
    (ax,) = visible
    assert ax.get_yscale() == "log"
    # A near-certain model's box (entropies around 1e-6) is above the axis' floor, not on it.
    assert ax.get_ylim()[0] < np.percentile(entropies["newton-finite"]["D_r"], 5)
    # A saturated model (entropies of 0) neither stretches the axis nor hides: its boxes sit on the
    # floor, labelled once.
    assert ax.get_ylim()[0] >= 1e-7
    (label,) = ax.texts
    assert label.get_text().startswith("median\n≤ ") and label.xy[0] == methods.index("hiding")
    assert [t.get_text() for t in ax.get_xticklabels()] == methods
    assert any(t.get_text().startswith("D_f: the data to forget") for t in fig.texts)


# ---------------------------------------------------------------------- last_layer_angles.png
def test_angles_with_ten_neurons_have_opaque_bars_that_do_not_overlap_and_a_caption():
    fig = neuron_angles_figure(ANGLES, title="digits")
    (ax,) = fig.axes
    fig.canvas.draw()
    bars = [p for p in ax.patches if p.get_height() > 0]
    assert bars and all(p.get_alpha() in (None, 1.0) for p in bars)
    assert all(p.get_facecolor()[3] == 1.0 for p in bars)
    boxes = [p.get_window_extent() for p in bars]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            inter_width = min(boxes[i].x1, boxes[j].x1) - max(boxes[i].x0, boxes[j].x0)
            assert inter_width <= 0.5, (i, j)  # side by side, at most touching
    (caption,) = [t for t in fig.texts if t.get_gid() == "caption"]
    text = " ".join(caption.get_text().split())  # wrapped to the figure's width
    assert text.startswith("Angle between each of the 10 output neurons' weights")
    # Why the original (grey) sits near 0: it shares FedRetrain's start and schedule.
    assert "same initial model" in text and "only lacks the targets' data" in text
    without = neuron_angles_figure({m: v for m, v in ANGLES.items() if m != "fedavg"})
    assert "initial model" not in without.texts[0].get_text()


def test_angle_bars_sit_on_their_bins_ticks():
    """Round bins whose ticks name their range; each bin's bars are a group centred on the bin's
    tick (a bar alone in its bin sits on it), and every neuron is counted once, the largest angle
    included."""
    angles = {
        "fedavg": [2.5] * 8 + [4.4] * 2,
        "federaser": [3.0, 5.0, 5.5, 7.0, 7.1, 7.2, 6.9, 6.5, 9.0, 5.2],
        "sifu": [14.7, 14.9, 15.0, 16.8, 16.9, 18.8, 18.9, 19.0, 20.95, 21.0],
    }
    (ax,) = neuron_angles_figure(angles).axes
    ticks = list(ax.get_xticks())
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:3] == ["0–2", "2–4", "4–6"] and labels[-1] == "20–22"
    assert ticks == pytest.approx([1.0 + 2 * k for k in range(len(ticks))])
    by_bin: dict[float, list] = {}
    for container in ax.containers:
        for patch in container:
            centre = patch.get_x() + patch.get_width() / 2
            tick = min(ticks, key=lambda t: abs(t - centre))
            assert abs(centre - tick) < 1.0  # inside its bin
            by_bin.setdefault(tick, []).append(centre)
    for tick, centres in by_bin.items():
        assert np.mean(centres) == pytest.approx(tick), tick
    assert by_bin[21.0] == pytest.approx([21.0])  # sifu alone in 20-22: on the tick
    counts = {c.get_label(): sum(p.get_height() for p in c) for c in ax.containers}
    assert counts == {"original": 10, "federaser": 10, "sifu": 10}
    assert list(angle_bins(0.0)) == [0.0, 0.5]
    assert list(angle_bins(20.0))[-2:] == [20.0, 22.0]  # 20 falls in the bin above its edge
    assert len(angle_bins(179.0)) - 1 <= MAX_ANGLE_BINS
