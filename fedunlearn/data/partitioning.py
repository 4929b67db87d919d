"""Split a training set's sample indices among federated clients.

Three schemes, named as the run config names them:

- ``iid``: a uniform random split into near-equal parts.
- ``dirichlet``: per class, proportions drawn from Dir(alpha) over the partitions; small ``alpha``
  gives each client few dominant classes, large ``alpha`` approaches ``iid``.
- ``shards``: McMahan et al.'s pathological non-IID split: indices sorted by label, cut into equal
  contiguous shards, and each client dealt ``shards_per_partition`` shards at random.

Every scheme is deterministic given ``seed`` and returns sorted, pairwise disjoint int64 index arrays
whose union is every sample.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fedunlearn.errors import ConfigError

#: Our partitionings; the run's ``partitioning`` also takes Flower Datasets' (``flower-*``,
#: :mod:`fedunlearn.data.flower_partitioners`), which :mod:`fedunlearn.data.federated_data` calls.
PARTITIONINGS = ("iid", "dirichlet", "shards")


def partition_indices(
    labels,
    num_partitions: int,
    method: str = "iid",
    *,
    alpha: float = 0.5,
    shards_per_partition: int = 2,
    min_partition_size: int = 1,
    seed: int = 0,
    max_attempts: int = 100,
) -> list[np.ndarray]:
    """Split the indices ``0..len(labels)-1`` into ``num_partitions`` disjoint parts.

    Parameters
    ----------
    labels : array-like of int or torch.Tensor
        1-D class label of every training sample.
    num_partitions : int
        Number of parts (clients), at least 1 and at most the number of samples.
    method : str, default "iid"
        One of :data:`PARTITIONINGS`.
    alpha : float, default 0.5
        Concentration of the Dirichlet prior (``dirichlet`` only); must be finite and positive.
    shards_per_partition : int, default 2
        Shards dealt to each part (``shards`` only).
    min_partition_size : int, default 1
        Smallest part ``dirichlet`` accepts; it redraws until every part is at least this large.
    seed : int, default 0
        Seeds ``numpy.random.default_rng``; the same inputs and seed give the same parts.
    max_attempts : int, default 100
        Draws ``dirichlet`` makes before giving up on ``min_partition_size``.

    Returns
    -------
    list of numpy.ndarray
        ``num_partitions`` sorted int64 index arrays, pairwise disjoint, together covering every index.

    Raises
    ------
    ConfigError
        A parameter is out of range (named as the run config spells it), or ``dirichlet`` could not
        give every part ``min_partition_size`` samples within ``max_attempts`` draws.
    """
    labels = _as_label_array(labels)
    num_samples = labels.shape[0]
    if method not in PARTITIONINGS:
        raise ConfigError("partitioning", method, "one of " + ", ".join(PARTITIONINGS))
    if not _is_integer(num_partitions) or num_partitions < 1:
        raise ConfigError("num-clients", num_partitions, "a whole number of at least 1")
    if num_partitions > num_samples:
        raise ConfigError(
            "num-clients",
            num_partitions,
            f"at most the {num_samples} training samples, so that every client gets data",
        )
    rng = np.random.default_rng(seed)
    if method == "iid":
        parts = np.array_split(rng.permutation(num_samples), num_partitions)
    elif method == "dirichlet":
        parts = _dirichlet(labels, num_partitions, alpha, min_partition_size, max_attempts, rng)
    else:
        parts = _shards(labels, num_partitions, shards_per_partition, rng)
    return [np.sort(part).astype(np.int64) for part in parts]


def label_distribution(labels, partitions, num_classes: int) -> np.ndarray:
    """Count each class in each partition.

    Parameters
    ----------
    labels : array-like of int or torch.Tensor
        1-D class label of every sample, in ``range(num_classes)``.
    partitions : sequence of array-like of int
        Index arrays, e.g. from :func:`partition_indices`.
    num_classes : int
        Number of classes, the width of the result.

    Returns
    -------
    numpy.ndarray
        int64 counts of shape ``(len(partitions), num_classes)``; row ``i`` counts partition ``i``.
    """
    labels = _as_label_array(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            "num-classes",
            num_classes,
            f"more than the largest label: labels range over {labels.min()}..{labels.max()}",
        )
    counts = np.zeros((len(partitions), num_classes), dtype=np.int64)
    for row, part in enumerate(partitions):
        counts[row] = np.bincount(labels[np.asarray(part, dtype=np.int64)], minlength=num_classes)
    return counts


def _is_integer(value) -> bool:
    """True for ints and numpy integers, but not for bools, which are ints only by accident."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _as_label_array(labels) -> np.ndarray:
    """Return labels as a 1-D int64 numpy array, whether given as a tensor, array or list."""
    if hasattr(
        labels, "detach"
    ):  # a torch tensor; checked by duck type so torch stays optional here
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ConfigError(
            "labels", f"array of shape {array.shape}", "a 1-D array with one label per sample"
        )
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ConfigError("labels", f"array of dtype {array.dtype}", "integer class labels")
    return array.astype(np.int64, copy=False)


def _dirichlet(
    labels: np.ndarray,
    num_partitions: int,
    alpha: float,
    min_partition_size: int,
    max_attempts: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Per-class Dirichlet split, redrawn until every part holds ``min_partition_size`` samples."""
    is_number = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool)
    if not is_number or not math.isfinite(alpha) or alpha <= 0:
        raise ConfigError(
            "alpha",
            alpha,
            "a finite number greater than 0 (e.g. 0.1 for strong skew, 100 for near-iid)",
        )
    if not _is_integer(min_partition_size) or min_partition_size < 0:
        raise ConfigError("min-partition-size", min_partition_size, "a whole number of at least 0")
    if min_partition_size * num_partitions > labels.shape[0]:
        raise ConfigError(
            "min-partition-size",
            min_partition_size,
            f"at most {labels.shape[0] // num_partitions}: {num_partitions} partitions of "
            f"{min_partition_size} need more than the {labels.shape[0]} samples",
        )
    if not _is_integer(max_attempts) or max_attempts < 1:
        raise ConfigError("max-attempts", max_attempts, "a whole number of at least 1")
    class_indices = [np.flatnonzero(labels == label) for label in np.unique(labels)]
    smallest = 0
    for _ in range(max_attempts):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        for indices in class_indices:
            shuffled = rng.permutation(indices)
            proportions = rng.dirichlet(np.full(num_partitions, float(alpha)))
            # Cut points from the cumulative proportions; the last cut is implicit, so rounding never
            # drops a sample.
            cuts = (np.cumsum(proportions)[:-1] * shuffled.size).astype(np.int64)
            for part, chunk in zip(parts, np.split(shuffled, cuts)):
                part.append(chunk)
        merged = [np.concatenate(part) for part in parts]
        smallest = min(part.size for part in merged)
        if smallest >= min_partition_size:
            return merged
    raise ConfigError(
        "alpha",
        alpha,
        f"could not give each of {num_partitions} partitions at least {min_partition_size} samples in "
        f"{max_attempts} draws (smallest partition in the last draw: {smallest}); use a larger alpha, "
        "fewer clients, or a smaller min-partition-size",
    )


def _shards(
    labels: np.ndarray, num_partitions: int, shards_per_partition: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Sort by label, cut into equal contiguous shards, deal ``shards_per_partition`` to each part."""
    num_shards = (
        shards_per_partition * num_partitions if _is_integer(shards_per_partition) else None
    )
    if num_shards is None or shards_per_partition < 1:
        raise ConfigError("shards-per-client", shards_per_partition, "a whole number of at least 1")
    if num_shards > labels.shape[0]:
        raise ConfigError(
            "shards-per-client",
            shards_per_partition,
            f"at most {labels.shape[0] // num_partitions}: {num_partitions} clients times "
            f"{shards_per_partition} shards exceeds the {labels.shape[0]} samples",
        )
    # Shuffle before the stable sort so which samples of a class share a shard depends on the seed.
    shuffled = rng.permutation(labels.shape[0])
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    # array_split gives the first (N mod num_shards) shards one extra sample, so every sample is dealt.
    shards = np.array_split(by_label, num_shards)
    order = rng.permutation(num_shards)
    return [
        np.concatenate([shards[shard] for shard in order[start : start + shards_per_partition]])
        for start in range(0, num_shards, shards_per_partition)
    ]
