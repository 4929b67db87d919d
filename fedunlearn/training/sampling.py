"""Client sampling per round (``fraction-train``, ``min-train-clients``), Flower-free.

Flower's FedAvg samples ``max(int(n · fraction_train), min_train_nodes)`` of the ``n`` connected
nodes each round (``flwr.serverapp.strategy.FedAvg.configure_train``) with Python's unseeded
``random``, over node ids that change from run to run. Ours keeps Flower's size rule but draws over
the clients' *partition ids* with a generator seeded by the run's seed, the phase and the round, so
a rerun with the same seed trains the same clients in every round, whatever node ids the SuperNodes
got (:func:`round_seed`). Every phase that trains (training, FedRetrain's retraining) samples its
own stream; a phase samples from the clients it may ask (FedRetrain: the remaining ones).
"""

from __future__ import annotations

import numbers
from collections.abc import Collection

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed


def round_seed(seed: int, phase: str, server_round: int) -> int:
    """The seed of ``phase``'s draw in ``server_round`` (``phase``: ``"train"``, ``"fedretrain"``)."""
    return derive_seed(seed, "sample", phase, server_round)


def sample_size(available: int, fraction: float, minimum: int) -> int:
    """How many of ``available`` clients a round trains: Flower's FedAvg rule,
    ``max(int(available · fraction), minimum)``, and never more than are available."""
    if not (isinstance(available, numbers.Integral) and available >= 0):
        raise ConfigError("available", available, "a whole number >= 0")
    if not (isinstance(fraction, numbers.Real) and 0 < fraction <= 1):
        raise ConfigError("fraction-train", fraction, "a number in (0, 1]")
    if not (isinstance(minimum, numbers.Integral) and minimum >= 1):
        raise ConfigError("min-train-clients", minimum, "a whole number >= 1")
    return min(int(available), max(int(available * fraction), int(minimum)))


def sample_partitions(
    partitions: Collection[int], fraction: float, minimum: int, seed: int
) -> list[int]:
    """The partitions a round trains, sorted: :func:`sample_size` of them, drawn uniformly without
    replacement by a generator seeded with ``seed`` over the sorted ``partitions`` (the draw
    depends on the set, not on the order it is given in). All of them when ``fraction`` is 1."""
    pool = sorted({int(p) for p in partitions})
    size = sample_size(len(pool), fraction, minimum)
    if size == len(pool):
        return pool
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(int(seed)))
    return sorted(pool[int(i)] for i in order[:size])
