"""The Flower strategy that aggregates a run's rounds (``strategy``): Flower's own classes, wrapped
by :class:`strategies.retaining.Retaining` for retention.

* ``fedavg``        — FedAvg (McMahan et al. 2017): the sample-weighted mean;
* ``fedprox``       — FedProx (Li et al. 2020): FedAvg's mean; clients add (mu/2)||w - w^t||^2
  (``proximal-mu``, sent in every training message);
* ``fedmedian``     — the coordinate-wise median (Yin et al. 2018);
* ``fedtrimmedavg`` — the coordinate-wise mean after trimming ``trimmed-beta`` of each tail
  (Yin et al. 2018);
* ``krum``          — Krum (Blanchard et al. 2017): the reply closest to its K - f - 2 nearest,
  f = ``krum-malicious``.

Which of these a method's math assumes is declared by its registry entry
(:attr:`fedunlearn.registry.MethodSpec.aggregations`); the config refuses the rest before training.
"""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg, FedMedian, FedProx, FedTrimmedAvg, Krum, Strategy

from fedunlearn.config.choices import AGGREGATIONS
from fedunlearn.errors import ConfigError
from strategies.retaining import participant_minimums
from strategies.train_replies import aggregate_train_metrics

_CLASSES = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedmedian": FedMedian,
    "fedtrimmedavg": FedTrimmedAvg,
    "krum": Krum,
}
assert tuple(_CLASSES) == AGGREGATIONS, "strategies.aggregation and config choices disagree"


def aggregation_options(config) -> dict:
    """The run config's settings of its ``strategy`` (FedProx's mu, the trimmed fraction, Krum's f)."""
    return {
        "fedprox": {"proximal_mu": config.proximal_mu},
        "fedtrimmedavg": {"beta": config.trimmed_beta},
        "krum": {"num_malicious_nodes": config.krum_malicious},
    }.get(config.strategy, {})


def aggregation_strategy(
    config,
    *,
    fraction_evaluate: float = 0.0,
    min_evaluate_nodes: int = 1,
) -> Strategy:
    """The Flower strategy ``config.strategy`` names; it trains every node it is shown each round,
    with minimums of 1: which nodes a round may train, and how long it waits for them, is decided
    by the :class:`strategies.retaining.Retaining` around it (its ``participants``, ``sampler``
    and ``available``), not by Flower's ``min_available_nodes`` wait, which has no time limit and
    would hang a federation that lost a SuperNode (:mod:`server.federation.availability`)."""
    if config.strategy not in _CLASSES:
        raise ConfigError("strategy", config.strategy, f"one of {', '.join(AGGREGATIONS)}")
    kwargs = participant_minimums(
        {"fraction_train": 1.0, "fraction_evaluate": fraction_evaluate}, 1
    )
    return _CLASSES[config.strategy](
        **kwargs,
        min_evaluate_nodes=min_evaluate_nodes,
        train_metrics_aggr_fn=aggregate_train_metrics,
        **aggregation_options(config),
    )
