"""Flower Datasets' partitioners over a local label array give, partition by partition, the index
sets that flwr_datasets itself gives a Flower baseline for the same data and seeds."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from fedunlearn.data.flower_partitioners import flower_partition
from fedunlearn.errors import ConfigError

partitioner_module = pytest.importorskip("flwr_datasets.partitioner")
flwr_datasets = pytest.importorskip("flwr_datasets")
datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """digits' training labels (scikit-learn's bundled set, the project's embedded dataset)."""
    from fedunlearn.data.datasets import load_dataset

    return load_dataset("digits", seed=0).train.y.numpy()


@pytest.fixture(scope="module")
def label_file(labels, tmp_path_factory):
    """The labels as a local Parquet file, with each row's index, for FederatedDataset to load."""
    path = tmp_path_factory.mktemp("flower") / "train.parquet"
    pd.DataFrame({"label": labels, "index": np.arange(len(labels))}).to_parquet(path)
    return path


def _as_a_baseline_does(label_file, partitioner, num_partitions) -> list[np.ndarray]:
    """FederatedDataset over the local file, its defaults (shuffle=True, seed=42) kept."""
    federated = flwr_datasets.FederatedDataset(
        dataset="parquet",
        data_files={"train": str(label_file)},
        partitioners={"train": partitioner},
        cache_dir=str(label_file.parent / "cache"),
    )
    return [np.sort(federated.load_partition(i)["index"]) for i in range(num_partitions)]


def _same(ours, theirs) -> bool:
    return len(ours) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_partitions", [5, 10])
@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_dirichlet_partitions_equal_a_flower_baselines(
    labels, label_file, seed, num_partitions, alpha
):
    partitioner = partitioner_module.DirichletPartitioner(
        num_partitions=num_partitions, partition_by="label", alpha=alpha, seed=seed
    )
    theirs = _as_a_baseline_does(label_file, partitioner, num_partitions)
    ours = flower_partition(labels, num_partitions, "dirichlet", alpha=alpha, seed=seed)
    assert _same(ours, theirs)
    everything = np.concatenate(ours)
    assert np.array_equal(np.sort(everything), np.arange(len(labels)))  # disjoint, and cover all
    assert min(len(part) for part in ours) >= 10  # Flower's min_partition_size


@pytest.mark.filterwarnings("ignore:The specified min_partition_size")
def test_a_split_flower_gives_up_on_is_a_config_error_naming_alpha():
    """Three classes of ten, three partitions of at least ten: Dir(0.01) almost never allows it."""
    with pytest.raises(ConfigError, match=r"invalid alpha=0\.01: .*at least 10 samples"):
        flower_partition(np.repeat([0, 1, 2], 10), 3, "dirichlet", alpha=0.01, seed=0)


def test_another_seed_gives_another_split(labels):
    first = flower_partition(labels, 5, "dirichlet", alpha=0.5, seed=0)
    second = flower_partition(labels, 5, "dirichlet", alpha=0.5, seed=1)
    assert not _same(first, second)


def test_a_partitioner_given_the_dataset_directly_is_matched_without_the_shuffle(labels):
    dataset = datasets.Dataset.from_dict({"label": labels, "index": np.arange(len(labels))})
    partitioner = partitioner_module.DirichletPartitioner(10, "label", alpha=0.5, seed=7)
    partitioner.dataset = dataset
    theirs = [np.sort(partitioner.load_partition(i)["index"]) for i in range(10)]
    ours = flower_partition(labels, 10, "dirichlet", alpha=0.5, seed=7, shuffle_seed=None)
    assert _same(ours, theirs)
    assert not _same(ours, flower_partition(labels, 10, "dirichlet", alpha=0.5, seed=7))


def test_iid_and_shards_partitions_equal_a_flower_baselines(labels, label_file):
    iid = partitioner_module.IidPartitioner(num_partitions=7)
    assert _same(flower_partition(labels, 7, "iid"), _as_a_baseline_does(label_file, iid, 7))
    shards = partitioner_module.ShardPartitioner(7, "label", num_shards_per_partition=3, seed=4)
    ours = flower_partition(labels, 7, "shards", seed=4, shards_per_partition=3)
    assert _same(ours, _as_a_baseline_does(label_file, shards, 7))
    # Shards of floor(N / 21) samples: Flower drops the N mod 21 that fill no shard.
    kept = np.concatenate(ours)
    assert len(np.unique(kept)) == len(kept) == len(labels) - len(labels) % 21


@pytest.mark.parametrize(
    "kind, changes, key",
    [
        ("pathological", {}, "partitioning"),
        ("dirichlet", {"alpha": 0.0}, "alpha"),
        ("dirichlet", {"min_partition_size": 1000}, "min-partition-size"),
        ("shards", {"shards_per_partition": 0}, "shards-per-client"),
        ("iid", {"num_partitions": 0}, "num-clients"),
    ],
)
def test_a_parameter_out_of_range_is_refused_by_its_config_key(labels, kind, changes, key):
    arguments = {"num_partitions": 5, **changes}
    with pytest.raises(ConfigError, match=f"invalid {key}="):
        flower_partition(labels, arguments.pop("num_partitions"), kind, **arguments)


def test_without_flwr_datasets_the_error_names_the_extra(labels, monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr_datasets", None)
    with pytest.raises(ConfigError, match=r"pip install 'fedunlearn\[flower-datasets\]'"):
        flower_partition(labels, 5, "iid")


def test_a_runs_flower_dirichlet_partitions_are_the_baselines(labels, label_file):
    """``partitioning = "flower-dirichlet"`` in a run config: each client holds exactly the
    samples FederatedDataset gives that partition id for the same seed and alpha."""
    from fedunlearn.config import ExperimentConfig
    from fedunlearn.data.federated_data import load_federated_data

    config = ExperimentConfig.from_run_config(
        {"num-clients": 5, "partitioning": "flower-dirichlet", "alpha": 0.3, "seed": 0}
    )
    partitioner = partitioner_module.DirichletPartitioner(
        num_partitions=5, partition_by="label", alpha=0.3, seed=0
    )
    theirs = _as_a_baseline_does(label_file, partitioner, 5)
    assert _same([np.sort(part) for part in load_federated_data(config).partitions], theirs)
