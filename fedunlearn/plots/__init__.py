"""Figures a person would rather look at than read (matplotlib, headless).

Every figure follows the same house rules, kept once as small helpers in :mod:`.style`: rounds and
counts get integer ticks (:func:`integer_ticks`), bars carry their values and a bar of height zero
stays visible as an outline with its "0" (:func:`labelled_bars`), legends sit outside the axes
(:func:`legend_outside`), and a figure about a forgetting request names every target forgotten so
far (:func:`forgetting_title`). Each ``plot_*`` function draws with its ``*_figure`` twin, which
returns the :class:`~matplotlib.figure.Figure` unsaved (for a notebook, or a test that inspects it).

The figures by family: :mod:`.training` (training curves), :mod:`.unlearning` (client removal: the
comparison with FedRetrain, neuron angles, the storage-vs-training trade-off), :mod:`.membership`
(membership-inference ROC curves) and :mod:`.certified` (the certified head's removal requests).
Each module is importable by its own path; this package re-exports their public names, and
``plt`` (pyplot with the headless Agg backend, selected here before any module imports pyplot).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402, F401  (re-exported: pyplot on the Agg backend)

from fedunlearn.plots.certified import (  # noqa: E402
    certified_removal_figure,
    plot_certified_removal,
    retrain_requests,
)
from fedunlearn.plots.membership import (  # noqa: E402
    LINESTYLES,
    plot_roc_curves,
    roc_figure,
    roc_resolution,
)
from fedunlearn.plots.style import (  # noqa: E402
    DISPLAY_NAMES,
    FALLBACK_COLOURS,
    METHOD_COLOURS,
    OTHER_COLOURS,
    caption,
    display_name,
    flagged,
    forgetting_title,
    integer_ticks,
    labelled_bars,
    legend_outside,
    lift_off_line,
    mark_flagged_ticks,
    marker_boxes,
    method_colour,
    method_colours,
    place_labels,
    save_figure,
    spread_labels,
)
from fedunlearn.plots.training import plot_training_curves, training_curves_figure  # noqa: E402
from fedunlearn.plots.unlearning import (  # noqa: E402
    client_accuracy_figure,
    neuron_angles_figure,
    plot_client_accuracy,
    plot_neuron_angles,
    plot_tradeoff,
    plot_unlearning_comparison,
    tradeoff_figure,
    unlearning_figure,
)

__all__ = [
    "save_figure",
    "METHOD_COLOURS",
    "DISPLAY_NAMES",
    "FALLBACK_COLOURS",
    "display_name",
    "method_colour",
    "method_colours",
    "OTHER_COLOURS",
    "caption",
    "spread_labels",
    "marker_boxes",
    "place_labels",
    "lift_off_line",
    "integer_ticks",
    "labelled_bars",
    "legend_outside",
    "forgetting_title",
    "flagged",
    "mark_flagged_ticks",
    "training_curves_figure",
    "plot_training_curves",
    "unlearning_figure",
    "plot_unlearning_comparison",
    "neuron_angles_figure",
    "plot_neuron_angles",
    "tradeoff_figure",
    "plot_tradeoff",
    "client_accuracy_figure",
    "plot_client_accuracy",
    "LINESTYLES",
    "roc_resolution",
    "roc_figure",
    "plot_roc_curves",
    "certified_removal_figure",
    "retrain_requests",
    "plot_certified_removal",
]
