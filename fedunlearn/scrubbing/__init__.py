"""Scrubbing (Golatkar et al. 2020): Newton/Fisher scrubbers, forgetting baselines, readouts;
class-discriminative pruning (Wang et al. 2022).

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.lazy import homes_of, lazy_getattr

#: Where each public name lives. The package imports nothing until a name is asked for (PEP 562):
#: validating a run config reads its methods' declarations, not the scrubbers' figures (matplotlib).
_HOMES = {
    "baselines": (
        "chance_clamped_cross_entropy",
        "final_linear",
        "hide_class",
        "negative_gradient_epochs",
        "random_label_epochs",
        "random_labels",
    ),
    "pruning": (
        "PruningLayer",
        "class_channel_sums",
        "discriminative_channels",
        "global_mean_activations",
        "prune_channels",
        "pruned_count",
        "pruning_layer",
        "select_channels",
        "tf_idf",
    ),
    "readout_figures": (
        "ENTROPY_FLOOR",
        "entropy_figure",
        "information_tradeoff_figure",
        "plot_entropy_histograms",
        "plot_information_tradeoff",
        "plot_relearn_times",
        "relearn_figure",
    ),
    "readouts": (
        "RelearnResult",
        "error_rate",
        "output_entropy",
        "relearn_time",
    ),
    "scrubbers": (
        "EIGEN_FLOOR",
        "NewtonScrubber",
        "Scrubbed",
        "diagonal_fisher",
        "finite_time_scrub",
        "fisher_gaussian",
        "fisher_sample",
        "kl_over_lambda",
        "psd_power",
        "reference_fisher_gaussian",
        "reference_fisher_variance",
    ),
}
_HOME = homes_of(_HOMES)

__all__ = [
    "chance_clamped_cross_entropy",
    "negative_gradient_epochs",
    "random_labels",
    "random_label_epochs",
    "final_linear",
    "hide_class",
    "ENTROPY_FLOOR",
    "error_rate",
    "output_entropy",
    "RelearnResult",
    "relearn_time",
    "entropy_figure",
    "relearn_figure",
    "information_tradeoff_figure",
    "plot_entropy_histograms",
    "plot_relearn_times",
    "plot_information_tradeoff",
    "EIGEN_FLOOR",
    "psd_power",
    "Scrubbed",
    "diagonal_fisher",
    "finite_time_scrub",
    "kl_over_lambda",
    "NewtonScrubber",
    "reference_fisher_variance",
    "fisher_gaussian",
    "reference_fisher_gaussian",
    "fisher_sample",
    "PruningLayer",
    "pruning_layer",
    "class_channel_sums",
    "global_mean_activations",
    "tf_idf",
    "pruned_count",
    "discriminative_channels",
    "select_channels",
    "prune_channels",
]

__getattr__ = lazy_getattr(__name__, _HOMES)
