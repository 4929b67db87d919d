"""Tests of fedunlearn.data.partitioning: coverage, determinism, skew and every validation error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedunlearn.data.partitioning import PARTITIONINGS, label_distribution, partition_indices
from fedunlearn.errors import ConfigError

NUM_CLASSES = 10


@pytest.fixture
def balanced_labels() -> np.ndarray:
    """2,000 labels, 200 per class, in shuffled order."""
    return np.random.default_rng(123).permutation(np.repeat(np.arange(NUM_CLASSES), 200))


@pytest.fixture
def uneven_labels() -> np.ndarray:
    """1,003 labels with class sizes from 28 to 172, so shards do not line up with classes."""
    sizes = [28, 50, 61, 90, 100, 110, 120, 130, 142, 172]
    return np.random.default_rng(7).permutation(np.repeat(np.arange(NUM_CLASSES), sizes))


def _mean_label_entropy(labels: np.ndarray, partitions: list[np.ndarray]) -> float:
    """Mean over partitions of the Shannon entropy (nats) of the partition's label histogram."""
    counts = label_distribution(labels, partitions, NUM_CLASSES).astype(float)
    probabilities = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probabilities > 0, probabilities * np.log(probabilities), 0.0)
    return float(-terms.sum(axis=1).mean())


@pytest.mark.parametrize("method", PARTITIONINGS)
def test_partitions_are_sorted_disjoint_and_cover_every_index(method, uneven_labels):
    partitions = partition_indices(uneven_labels, 7, method, shards_per_partition=3, seed=1)

    assert len(partitions) == 7
    for part in partitions:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no duplicates within a part
    everything = np.concatenate(partitions)
    assert everything.size == uneven_labels.size  # no index in two parts
    assert np.array_equal(np.sort(everything), np.arange(uneven_labels.size))


@pytest.mark.parametrize("method", PARTITIONINGS)
def test_same_seed_gives_same_partitions_and_other_seed_differs(method, balanced_labels):
    first = partition_indices(balanced_labels, 5, method, seed=3)
    again = partition_indices(balanced_labels, 5, method, seed=3)
    other = partition_indices(balanced_labels, 5, method, seed=4)

    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_torch_tensor_and_numpy_labels_give_the_same_partitions(balanced_labels):
    from_numpy = partition_indices(balanced_labels, 4, "dirichlet", seed=2)
    from_tensor = partition_indices(torch.from_numpy(balanced_labels), 4, "dirichlet", seed=2)

    assert all(np.array_equal(a, b) for a, b in zip(from_numpy, from_tensor))


@pytest.mark.parametrize("num_samples, num_partitions", [(2000, 10), (1003, 7), (10, 10), (11, 3)])
def test_iid_sizes_differ_by_at_most_one(num_samples, num_partitions):
    labels = np.arange(num_samples) % NUM_CLASSES
    sizes = [part.size for part in partition_indices(labels, num_partitions, "iid", seed=5)]

    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == num_samples


def test_iid_is_shuffled_rather_than_contiguous(balanced_labels):
    first = partition_indices(balanced_labels, 4, "iid", seed=0)[0]

    assert not np.array_equal(first, np.arange(first.size))


def test_dirichlet_small_alpha_skews_labels_more_than_large_alpha_and_iid(balanced_labels):
    skewed = _mean_label_entropy(
        balanced_labels, partition_indices(balanced_labels, 10, "dirichlet", alpha=0.1, seed=0)
    )
    near_iid = _mean_label_entropy(
        balanced_labels, partition_indices(balanced_labels, 10, "dirichlet", alpha=100.0, seed=0)
    )
    iid = _mean_label_entropy(
        balanced_labels, partition_indices(balanced_labels, 10, "iid", seed=0)
    )

    assert iid > 0.95 * np.log(NUM_CLASSES)  # iid parts hold nearly every class evenly
    assert near_iid > 0.9 * iid
    assert skewed < 0.7 * iid
    assert skewed < 0.7 * near_iid


def test_dirichlet_redraws_until_min_partition_size_is_met(balanced_labels):
    unconstrained = partition_indices(
        balanced_labels, 10, "dirichlet", alpha=0.3, min_partition_size=0, seed=0
    )
    constrained = partition_indices(
        balanced_labels, 10, "dirichlet", alpha=0.3, min_partition_size=60, seed=0
    )

    assert min(part.size for part in unconstrained) < 60  # so the first draw had to be rejected
    assert min(part.size for part in constrained) >= 60


def test_dirichlet_gives_up_with_alpha_error_when_min_size_is_unreachable():
    # With a tiny alpha each class lands almost whole in one partition, so at most two of the 50
    # partitions can be non-empty.
    labels = np.repeat([0, 1], 50)

    with pytest.raises(ConfigError) as caught:
        partition_indices(
            labels, 50, "dirichlet", alpha=1e-4, min_partition_size=2, max_attempts=5, seed=0
        )
    assert caught.value.parameter == "alpha"
    assert "min" in str(caught.value) and "larger alpha" in str(caught.value)


def test_shards_aligned_with_classes_give_each_partition_at_most_two_labels(balanced_labels):
    # 10 partitions x 2 shards = 20 shards of 100 samples: each shard is half of one class.
    partitions = partition_indices(balanced_labels, 10, "shards", shards_per_partition=2, seed=0)
    counts = label_distribution(balanced_labels, partitions, NUM_CLASSES)

    assert np.all((counts > 0).sum(axis=1) <= 2)
    assert np.all(counts.sum(axis=1) == 200)


def test_shards_are_contiguous_label_runs_even_when_they_straddle_classes(uneven_labels):
    # 1,003 samples in 40 shards of 25 or 26: shards never exceed the smallest class (28), so each
    # shard spans at most 2 adjacent labels and each partition at most 2 labels per shard.
    shards_per_partition = 4
    partitions = partition_indices(
        uneven_labels, 10, "shards", shards_per_partition=shards_per_partition, seed=9
    )
    counts = label_distribution(uneven_labels, partitions, NUM_CLASSES)

    assert np.all((counts > 0).sum(axis=1) <= 2 * shards_per_partition)
    sizes = counts.sum(axis=1)
    assert sizes.sum() == uneven_labels.size
    assert sizes.max() - sizes.min() <= shards_per_partition  # shards differ by at most one sample


def test_shards_are_far_more_skewed_than_iid(balanced_labels):
    shards = partition_indices(balanced_labels, 10, "shards", seed=0)
    iid = partition_indices(balanced_labels, 10, "iid", seed=0)

    assert _mean_label_entropy(balanced_labels, shards) < 0.4 * _mean_label_entropy(
        balanced_labels, iid
    )


def test_label_distribution_counts_each_class_per_partition():
    labels = np.array([0, 0, 1, 2, 2, 2])
    counts = label_distribution(labels, [np.array([0, 2]), np.array([1, 3, 4, 5])], num_classes=4)

    assert counts.tolist() == [[1, 1, 0, 0], [1, 0, 3, 0]]


def test_label_distribution_rejects_labels_beyond_num_classes():
    with pytest.raises(ConfigError, match="num-classes"):
        label_distribution(np.array([0, 5]), [np.array([0, 1])], num_classes=3)


@pytest.mark.parametrize(
    "arguments, parameter, message_part",
    [
        (
            {"num_partitions": 2, "method": "random"},
            "partitioning",
            "one of iid, dirichlet, shards",
        ),
        ({"num_partitions": 0}, "num-clients", "at least 1"),
        ({"num_partitions": -3}, "num-clients", "at least 1"),
        ({"num_partitions": 2.5}, "num-clients", "whole number"),
        ({"num_partitions": 101}, "num-clients", "at most the 100 training samples"),
        ({"num_partitions": 2, "method": "dirichlet", "alpha": 0.0}, "alpha", "greater than 0"),
        ({"num_partitions": 2, "method": "dirichlet", "alpha": -1.0}, "alpha", "greater than 0"),
        ({"num_partitions": 2, "method": "dirichlet", "alpha": float("nan")}, "alpha", "finite"),
        ({"num_partitions": 2, "method": "dirichlet", "alpha": float("inf")}, "alpha", "finite"),
        (
            {"num_partitions": 10, "method": "dirichlet", "min_partition_size": 11},
            "min-partition-size",
            "at most 10",
        ),
        (
            {"num_partitions": 2, "method": "shards", "shards_per_partition": 0},
            "shards-per-client",
            "at least 1",
        ),
        (
            {"num_partitions": 10, "method": "shards", "shards_per_partition": 11},
            "shards-per-client",
            "exceeds the 100 samples",
        ),
    ],
)
def test_invalid_arguments_raise_config_error_naming_the_parameter(
    arguments, parameter, message_part
):
    labels = np.arange(100) % NUM_CLASSES

    with pytest.raises(ConfigError) as caught:
        partition_indices(labels, **arguments)
    assert caught.value.parameter == parameter
    assert str(caught.value).startswith(f"invalid {parameter}=")
    assert message_part in str(caught.value)


def test_labels_that_are_not_a_1d_integer_array_are_rejected():
    with pytest.raises(ConfigError, match="1-D"):
        partition_indices(np.zeros((4, 2), dtype=np.int64), 2)
    with pytest.raises(ConfigError, match="integer"):
        partition_indices(np.array([0.5, 1.5, 2.5]), 2)


def test_train_samples_partitions_a_seeded_subset_of_the_training_set():
    from fedunlearn.config import ExperimentConfig
    from fedunlearn.data.federated_data import load_federated_data, training_pool

    config = ExperimentConfig.from_run_config({"num-clients": 4, "train-samples": 300})
    data = load_federated_data(config)
    joined = np.concatenate(data.partitions)
    assert len(joined) == 300 and len(np.unique(joined)) == 300
    assert joined.max() < len(data.splits.train)
    assert [len(p) for p in data.partitions] == [75] * 4
    # Every party computes the same subset; another seed draws another one.
    np.testing.assert_array_equal(training_pool(1000, 300, 0), training_pool(1000, 300, 0))
    assert not np.array_equal(training_pool(1000, 300, 0), training_pool(1000, 300, 1))
    np.testing.assert_array_equal(training_pool(50, 0, 3), np.arange(50))
    split = data.client_split(2)
    index = torch.as_tensor(data.partitions[2], dtype=torch.long)
    assert torch.equal(split.y, data.splits.train.y[index])


def test_train_samples_above_the_training_set_names_its_size():
    from fedunlearn.data.federated_data import training_pool

    with pytest.raises(ConfigError, match=r"train-samples.*1001.*\[1, 1000\]"):
        training_pool(1000, 1001, 0)
