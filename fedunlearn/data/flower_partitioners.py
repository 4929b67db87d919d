"""Flower Datasets' partitioners over a local label array: the splits other Flower baselines use.

A Flower baseline partitions with ``flwr_datasets``: ``FederatedDataset(dataset=..., partitioners=
{"train": partitioner})`` shuffles the training split (``shuffle=True, seed=42`` by default), hands it
to the partitioner (``partitioner.dataset = split``) and reads ``partitioner.load_partition(i)``.
:func:`flower_partition` does the same over ``labels`` (a ``datasets.Dataset`` of a ``label`` column
and an ``index`` column, so that each partition's rows give back their indices into ``labels``):

- ``iid``: ``IidPartitioner(K)``, contiguous equal blocks of the shuffled set (all its randomness
  is the shuffle; with ``shuffle_seed=None`` the blocks are ``labels``' own order);
- ``dirichlet``: ``DirichletPartitioner(K, "label", alpha, min_partition_size, self_balancing=False,
  shuffle=True, seed)``, Flower's defaults: per class, proportions from Dir(alpha); the whole draw is
  redone (up to 10 times) until every partition holds ``min_partition_size`` samples (default 10);
- ``shards``: ``ShardPartitioner(K, "label", num_shards_per_partition, seed)``: the set sorted by
  label, cut into ``K * shards_per_partition`` shards of ``floor(N / (K * shards_per_partition))``
  samples, dealt at random.

Partitions are pairwise disjoint. ``iid`` and ``dirichlet`` cover every sample; ``shards`` drops
the ``N mod (K * shards_per_partition)`` samples that do not fill a shard (the last ones of the
largest label), as Flower's ``keep_incomplete_shard=False`` default does. Indices are returned sorted,
as :func:`~fedunlearn.data.partitioning.partition_indices` returns them.

``flwr-datasets`` is an optional dependency (``pip install 'fedunlearn[flower-datasets]'``); this
module imports it only when called, so the core stays importable without it (and without Flower:
``flwr_datasets`` does not import ``flwr``).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fedunlearn.data.partitioning import _as_label_array, _is_integer
from fedunlearn.errors import ConfigError

FLOWER_PARTITIONERS = ("iid", "dirichlet", "shards")
#: FederatedDataset's default shuffle seed, which Flower baselines leave as it is.
FEDERATED_DATASET_SEED = 42
#: DirichletPartitioner's default smallest partition.
FLOWER_MIN_PARTITION_SIZE = 10
INSTALL = "needs Flower Datasets: pip install 'fedunlearn[flower-datasets]'"


def flower_partition(
    labels,
    num_partitions: int,
    kind: str,
    *,
    alpha: float = 0.5,
    seed: int = 0,
    shards_per_partition: int = 2,
    min_partition_size: int = FLOWER_MIN_PARTITION_SIZE,
    shuffle_seed: int | None = FEDERATED_DATASET_SEED,
) -> list[np.ndarray]:
    """Partition ``labels``' indices with Flower Datasets' partitioner ``kind``.

    Parameters
    ----------
    labels : array-like of int or torch.Tensor
        1-D class label of every training sample.
    num_partitions : int
        K, the number of partitions (clients), at most the number of samples.
    kind : str
        One of :data:`FLOWER_PARTITIONERS`: ``IidPartitioner``, ``DirichletPartitioner``,
        ``ShardPartitioner``.
    alpha : float, default 0.5
        Dirichlet concentration (``dirichlet``).
    seed : int, default 0
        The partitioner's seed (``dirichlet``, ``shards``; ``IidPartitioner`` has none).
    shards_per_partition : int, default 2
        ``num_shards_per_partition`` (``shards``).
    min_partition_size : int, default 10
        ``DirichletPartitioner``'s ``min_partition_size`` (its default).
    shuffle_seed : int or None, default 42
        ``FederatedDataset``'s shuffle seed (its default, which baselines keep); ``None``: no shuffle,
        as when a partitioner is given a dataset directly.

    Returns
    -------
    list of numpy.ndarray
        K sorted int64 index arrays into ``labels``, pairwise disjoint (see the module docstring for
        what ``shards`` leaves out).

    Raises
    ------
    ConfigError
        ``flwr-datasets`` is not installed, ``kind`` is unknown, or a parameter is out of range or
        cannot be met (named as the run config spells it).
    """
    labels = _as_label_array(labels)
    _check(labels, num_partitions, kind, alpha, shards_per_partition, min_partition_size)
    datasets, partitioner = (
        _flower_datasets(),
        _partitioner(kind, num_partitions, alpha, seed, shards_per_partition, min_partition_size),
    )
    dataset = datasets.Dataset.from_dict({"label": labels, "index": np.arange(labels.shape[0])})
    partitioner.dataset = dataset if shuffle_seed is None else dataset.shuffle(seed=shuffle_seed)
    try:
        return [_indices(partitioner.load_partition(i)) for i in range(num_partitions)]
    except ValueError as error:  # Dirichlet's 10 redraws exhausted
        raise ConfigError(
            "alpha",
            alpha,
            f"a concentration with which Flower's DirichletPartitioner gives each of "
            f"{num_partitions} partitions at least {min_partition_size} samples ({error}); use a "
            "larger alpha or fewer clients",
        ) from error


def _indices(partition) -> np.ndarray:
    """A partition's ``index`` column, sorted; read as one NumPy batch (row by row is 10x slower)."""
    return np.sort(partition.with_format("numpy")[:]["index"].astype(np.int64, copy=False))


def _check(labels, num_partitions, kind, alpha, shards_per_partition, min_partition_size) -> None:
    """The parameters' ranges, checked before Flower sees them (its errors name no config key)."""
    if kind not in FLOWER_PARTITIONERS:
        raise ConfigError("partitioning", kind, "one of " + ", ".join(FLOWER_PARTITIONERS))
    count = labels.shape[0]
    if not _is_integer(num_partitions) or not 1 <= num_partitions <= count:
        raise ConfigError(
            "num-clients", num_partitions, f"a whole number from 1 to the {count} samples"
        )
    if kind == "dirichlet":
        is_number = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool)
        if not is_number or not math.isfinite(alpha) or alpha <= 0:
            raise ConfigError("alpha", alpha, "a finite number greater than 0")
        if (
            not _is_integer(min_partition_size)
            or not 0 <= min_partition_size * num_partitions <= count
        ):
            raise ConfigError(
                "min-partition-size",
                min_partition_size,
                f"a whole number from 0 to {count // num_partitions} ({count} samples, {num_partitions} partitions)",
            )
    if kind == "shards":
        if (
            not _is_integer(shards_per_partition)
            or not 1 <= shards_per_partition * num_partitions <= count
        ):
            raise ConfigError(
                "shards-per-client",
                shards_per_partition,
                f"a whole number from 1 to {count // num_partitions} ({count} samples, {num_partitions} clients)",
            )


def _flower_datasets():
    """The ``datasets`` module, once ``flwr_datasets`` is known to be installed."""
    try:
        import datasets
        import flwr_datasets  # noqa: F401
    except ImportError as error:
        raise ConfigError("partitioning", "flower-*", INSTALL) from error
    return datasets


def _partitioner(kind, num_partitions, alpha, seed, shards_per_partition, min_partition_size):
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    if kind == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if kind == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=float(alpha),
            min_partition_size=min_partition_size,
            seed=seed,
        )
    return ShardPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        num_shards_per_partition=shards_per_partition,
        seed=seed,
    )
