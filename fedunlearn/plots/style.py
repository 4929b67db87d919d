"""The house rules every figure of :mod:`fedunlearn.plots` follows, kept here once as small
helpers, and the method colours and names.

Saving (:func:`save_figure`: laid out, rendered to memory, written atomically); one colour per
method in every figure (:func:`method_colour`) and the name shown for it (:func:`display_name`);
rounds and counts get integer ticks (:func:`integer_ticks`), bars carry their values and a bar of
height zero stays visible as an outline with its "0" (:func:`labelled_bars`), legends sit outside
the axes (:func:`legend_outside`), a figure about a forgetting request names every target forgotten
so far (:func:`forgetting_title`), flagged rows are marked in red (:func:`mark_flagged_ticks`),
and point labels sit beside their point, over no other label or marker (:func:`place_labels`,
:func:`spread_labels`), and off a reference line (:func:`lift_off_line`).
"""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

from fedunlearn.registry import AUDITED, SCRUBBING, UNLEARNING
from fedunlearn.store.durable_io import atomic_write_bytes


def save_figure(fig, path: Path) -> Path:
    """Lay out, save (120 dpi, the format of ``path``'s suffix, PNG without one) and close ``fig``.

    Rendered to memory first, then written atomically with mode 0600 like every file of a run. The
    saved area is the figure's tight bounding box, so a legend outside the axes is never cut off.
    """
    path = Path(path)
    buffer = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(
            buffer,
            dpi=120,
            format=path.suffix.lstrip(".").lower() or "png",
            bbox_inches="tight",
        )
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


# -------------------------------------------------------------------- method colours, names
#: Colours of names that are no registry entry: the retrained references of the scrubbing phase and
#: of the judge. Every registered method, scrubbing method and audited model has its colour on its
#: entry (``MethodSpec.colour``, :mod:`fedunlearn.registry`): FedRetrain and ``retrain`` black, the
#: original grey; tab:red is kept for FLAGGED marks.
OTHER_COLOURS: dict[str, str] = {"retrain": "#000000", "retrain-independent": "#b8b8b8"}


def method_colours() -> dict[str, str]:
    """Name -> colour of every name a figure may draw with a fixed colour: the registries'
    entries that declare one (read now: a method registered later is included), then
    :data:`OTHER_COLOURS`."""
    entries = (spec for registry in (UNLEARNING, SCRUBBING, AUDITED) for spec in registry)
    return {spec.name: spec.colour for spec in entries if spec.colour} | OTHER_COLOURS


#: The fixed colours at import (:func:`method_colours` reads the registries again).
METHOD_COLOURS: dict[str, str] = method_colours()

#: Names shown instead of a method's internal name: the run's trained model is "original".
DISPLAY_NAMES: dict[str, str] = {"fedavg": "original"}

#: Colours for names without a fixed one (a method registered without ``colour``), picked by a
#: stable hash.
FALLBACK_COLOURS = (
    "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
    "#636363", "#969696", "#bd9e39", "#ad494a", "#a55194", "#6baed6", "#fd8d3c", "#74c476",
)  # fmt: skip


def display_name(method: str) -> str:
    """The name a figure shows for ``method``: ``fedavg`` (the trained model) reads "original"."""
    return DISPLAY_NAMES.get(str(method), str(method))


def method_colour(method: str) -> str:
    """The fixed colour of ``method`` (``fedavg`` and "original" share one): its registry entry's
    (:func:`method_colours`). A name without one (a method registered without ``colour``) gets
    one of :data:`FALLBACK_COLOURS` chosen by a CRC-32 of the name: the same in every figure and
    every process."""
    name = display_name(method)
    colours = method_colours()
    if name in colours:
        return colours[name]
    return FALLBACK_COLOURS[zlib.crc32(name.encode()) % len(FALLBACK_COLOURS)]


def caption(fig, text: str, *, y: float = -0.01) -> None:
    """``text`` (a line, or lines joined by newlines) under the figure's axes (kept by
    :func:`save_figure`'s tight box)."""
    fig.text(0.5, y, text, ha="center", va="top", fontsize=8, gid="caption")


def spread_labels(
    ax, texts, *, avoid=(), margin: float = 2.0, step: float = 2.0, rounds: int = 300
) -> None:
    """Nudge annotations of ``ax`` (placed with ``textcoords="offset points"``) apart vertically,
    ``step`` points at a time, until no two bounding boxes, each grown by ``margin`` points, overlap
    (the margin absorbs the rounding of a save at another dpi): the labels of nearby points stay
    readable. ``avoid``: boxes in display pixels that stay where they are (the markers of the
    points, :func:`marker_boxes`); a label over one moves away from it. Draws the figure's canvas
    to measure them."""
    texts = [t for t in texts if t.get_text()]
    if not texts:
        return
    renderer = ax.figure.canvas.get_renderer()
    pixels = ax.figure.dpi / 72.0
    avoid = list(avoid)
    for _ in range(rounds):
        boxes = [t.get_window_extent(renderer).padded(margin * pixels) for t in texts]
        moves = _label_moves(boxes, avoid)
        if all(move is None for move in moves):
            return
        for text, move in zip(texts, moves):
            if move is not None:  # pushed both ways as much: up
                x, y = text.xyann
                text.xyann = (x, y + (-step if move < 0 else step))


#: Where :func:`place_labels` tries a label, in order: (offset in points, ha, va). Above and below
#: first (the lines of a trade-off run sideways), each clear of a 6-point marker with the margin.
LABEL_PLACES = (
    ((0, 6), "center", "bottom"),
    ((0, -6), "center", "top"),
    ((7, 0), "left", "center"),
    ((-7, 0), "right", "center"),
)


def place_labels(ax, texts, *, avoid=(), margin: float = 2.0) -> None:
    """Put each annotation of ``ax`` (``textcoords="offset points"``) above its point, or else
    below, right or left of it: the first place where it overlaps neither a label placed before it
    nor a box of ``avoid`` (:func:`marker_boxes`), each grown by ``margin`` points, and stays inside
    the axes; then :func:`spread_labels` settles what no place could. A label stays next to its own
    point wherever there is room."""
    texts = [t for t in texts if t.get_text()]
    if not texts:
        return
    renderer = ax.figure.canvas.get_renderer()
    pad = margin * ax.figure.dpi / 72.0
    frame = ax.get_window_extent(renderer)
    placed = list(avoid)
    for text in texts:
        for place in (*LABEL_PLACES, LABEL_PLACES[0]):  # no place free: above, for spread_labels
            (text.xyann, ha, va) = place
            text.set(ha=ha, va=va)
            box = text.get_window_extent(renderer).padded(pad)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0
            if inside and box.y1 <= frame.y1 and not any(box.overlaps(b) for b in placed):
                break
        placed.append(text.get_window_extent(renderer).padded(pad))
    spread_labels(ax, texts, avoid=avoid, margin=margin)


def _label_moves(boxes, avoid) -> list[int | None]:
    """Per label box, the net push (+1 up, -1 down per overlap) away from the boxes it overlaps,
    the upper of two labels going up; ``None`` for a label that overlaps nothing."""
    moves: list[int | None] = [None] * len(boxes)

    def push(k: int, up: bool) -> None:
        moves[k] = (moves[k] or 0) + (1 if up else -1)

    for i, box in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            if box.overlaps(boxes[j]):
                push(i, box.y0 >= boxes[j].y0)
                push(j, box.y0 < boxes[j].y0)
        for obstacle in avoid:
            if box.overlaps(obstacle):
                push(i, box.y0 + box.y1 >= obstacle.y0 + obstacle.y1)
    return moves


def lift_off_line(ax, texts, y: float, *, margin: float = 3.0) -> None:
    """Move each annotation of ``ax`` (``textcoords="offset points"``) that the horizontal line at
    data ``y`` would cross, or pass within ``margin`` points under, up until its bottom clears the
    line by ``margin`` points: a value is never written on the reference line."""
    renderer = ax.figure.canvas.get_renderer()
    pixels = ax.figure.dpi / 72.0
    line = ax.transData.transform((0.0, y))[1]
    for text in texts:
        box = text.get_window_extent(renderer)
        if box.y0 - margin * pixels <= line <= box.y1 + margin * pixels:
            x, offset = text.xyann
            text.xyann = (x, offset + (line - box.y0) / pixels + margin)


def marker_boxes(ax, *, size: float | None = None) -> list:
    """The display-pixel box of every marker of ``ax``'s lines (``size``: the marker's width in
    points; each line's own when not given), for :func:`spread_labels`' ``avoid``."""
    boxes = []
    for line in ax.get_lines():
        if line.get_marker() in (None, "", "None", " "):
            continue
        half = (size or line.get_markersize()) * ax.figure.dpi / 72.0 / 2
        points = ax.transData.transform(line.get_xydata())
        boxes += [
            Bbox.from_extents(x - half, y - half, x + half, y + half)
            for x, y in points
            if math.isfinite(x) and math.isfinite(y)
        ]
    return boxes


# ------------------------------------------------------------------------- shared helpers
def integer_ticks(ax, *axes: str) -> None:
    """Ticks only at whole numbers on ``axes`` (``"x"``, ``"y"``): rounds, requests and counts have
    no half values."""
    for name in axes or ("x",):
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True))


def labelled_bars(ax, positions, heights, width=0.8, *, fmt: str = "{:.3g}", **style):
    """Vertical bars with their values written above them. A bar of height zero (or NaN, drawn
    as zero) would vanish: every bar gets an outline in its colour, so a zero bar shows as a line
    on the axis, labelled "0"."""
    heights = [0.0 if h != h else float(h) for h in heights]  # NaN != NaN
    bars = ax.bar(positions, heights, width, **style)
    for bar in bars:
        bar.set_edgecolor(bar.get_facecolor())
        bar.set_linewidth(1.5)
    ax.bar_label(bars, labels=[fmt.format(h) for h in heights], padding=2, fontsize=8)
    return bars


def legend_outside(ax, **options):
    """The axes' legend to the right of the axes, where it cannot cover the data."""
    if not ax.get_legend_handles_labels()[0] and "handles" not in options:
        return None
    options = {"fontsize": 8, **options}
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **options)


def forgetting_title(
    dataset: str, num_clients: int, targets: Sequence[int], earlier: Sequence[int] = ()
) -> str:
    """The title of a forgetting request's figures: the new targets and, after earlier requests,
    every client forgotten so far (the model also lacks those)."""
    title = f"{dataset}, K={num_clients}, forget {sorted(targets)}"
    if earlier:
        title += f" (forgotten so far: {sorted(set(targets) | set(earlier))})"
    return title


def flagged(table: pd.DataFrame) -> set[str]:
    """The methods whose row is flagged (a non-empty ``flag`` column entry): not a result."""
    if "flag" not in table:
        return set()
    return {m for m, f in zip(table["method"], table["flag"]) if isinstance(f, str) and f}


def mark_flagged_ticks(ax, table: pd.DataFrame) -> None:
    """Method tick labels of flagged rows in red with "FLAGGED" under the name."""
    marked = {display_name(m) for m in flagged(table)}
    labels = ax.get_xticklabels()
    for label in labels:
        if label.get_text() in marked:
            label.set_text(f"{label.get_text()}\nFLAGGED")
            label.set_color("tab:red")
            label.set_fontweight("bold")
    ax.set_xticks(ax.get_xticks(), labels)
