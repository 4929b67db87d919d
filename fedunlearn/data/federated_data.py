"""The federation's view of a dataset: the training set split over K clients, the test set kept by
the server. Every party computes the same split from the same run configuration.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.backdoor import Trigger, make_trigger, plant_backdoor, triggered_test_set
from fedunlearn.data.datasets import DatasetSplits, TensorSplit, load_dataset
from fedunlearn.data.partitioning import partition_indices
from fedunlearn.data.poisoning import AttackPlan, check_attack_name, flip_labels
from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed

#: Run-config keys that decide which samples a client holds and which model it builds, and whether
#: it attacks (a malicious client's poisoned samples and replies). A run's clients must use the
#: values the run was trained with, also when a later request (``unlearn-only``, ``resume``) brings a
#: shorter run config: the server sends them with every message.
DATA_KEYS = (
    "dataset",
    "code-path",
    "data-root",
    "label-column",
    "test-fraction",
    "model",
    "num-clients",
    "train-samples",
    "partitioning",
    "alpha",
    "shards-per-client",
    "seed",
    "attack-clients",
    "attack",
    "attack-scale",
    "attack-target-class",
    "attack-fraction",
)
#: Prefix of those keys in a message's config record.
RUN_SETTING_PREFIX = "run."
#: ``partitioning = "flower-<kind>"``: Flower Datasets' partitioner ``kind`` over the same labels,
#: so a split can equal the one other Flower baselines use for the same seed.
FLOWER_PREFIX = "flower-"


def run_settings(config: ExperimentConfig) -> dict[str, Any]:
    """The trained run's :data:`DATA_KEYS` with their values, prefixed for a message's config."""
    values = config.to_run_config()
    return {RUN_SETTING_PREFIX + key: values[key] for key in DATA_KEYS}


def settings_in(record: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`DATA_KEYS` a message's config record carries (un-prefixed); unknown
    ``run.*`` keys are refused, since a client must not take other settings from a message."""
    found = {
        k[len(RUN_SETTING_PREFIX) :]: v
        for k, v in record.items()
        if k.startswith(RUN_SETTING_PREFIX)
    }
    unknown = sorted(set(found) - set(DATA_KEYS))
    if unknown:
        raise ConfigError(
            "message config",
            RUN_SETTING_PREFIX + unknown[0],
            f"run settings among {', '.join(DATA_KEYS)}",
        )
    return found


@dataclass(frozen=True, eq=False)  # identity: the cache of planted data is keyed by it
class FederatedData:
    """A dataset with its training set partitioned over ``num_clients`` clients.

    Attributes
    ----------
    splits : DatasetSplits
        The whole dataset; ``splits.test`` is the server's test set.
    partitions : tuple of np.ndarray
        Indices into ``splits.train`` of each client (partition id = position).
    backdoor : BackdoorPlan or None
        The trigger planted in a client's samples (``judge-backdoor``), else None.
    attack : AttackPlan or None
        The malicious clients and their attack (``attack-clients``), else None.
    """

    splits: DatasetSplits
    partitions: tuple[np.ndarray, ...]
    backdoor: BackdoorPlan | None = None
    attack: AttackPlan | None = None

    @property
    def num_clients(self) -> int:
        return len(self.partitions)

    def client_split(self, partition_id: int) -> TensorSplit:
        """Client ``partition_id``'s training data."""
        if not 0 <= partition_id < self.num_clients:
            raise ConfigError(
                "partition-id",
                partition_id,
                f"an integer in [0, {self.num_clients - 1}] (num-clients={self.num_clients})",
            )
        index = torch.as_tensor(self.partitions[partition_id], dtype=torch.long)
        return TensorSplit(self.splits.train.x[index], self.splits.train.y[index])


@dataclass(frozen=True, eq=False)
class BackdoorPlan:
    """A trigger planted in one client's samples (backdoor verification of client removal, as
    SIFU, FedRecover and VeriFi verify it): ``planted`` indexes ``splits.train``."""

    trigger: Trigger
    target_class: int
    client: int
    planted: torch.Tensor

    def triggered_test(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The test samples of the other classes, with the trigger stamped on."""
        return triggered_test_set(x, y, trigger=self.trigger, target_class=self.target_class)


def load_federated_data(config: ExperimentConfig) -> FederatedData:
    """Load and partition the dataset named by ``config`` (cached per process).

    With ``train-samples = N`` only a seeded subset of N training samples is partitioned; the
    partitions still index ``splits.train``. With ``judge-backdoor`` the target client's samples
    carry the trigger (:func:`planted_data`); with ``attack-clients`` the malicious clients' samples
    are poisoned (:func:`poisoned_data`). Every party computes the same.
    """
    data = _load_partitioned(config)
    if config.judge_backdoor:
        data = _planted_cached(
            data,
            config.unlearn_targets[0],
            config.judge_backdoor_fraction,
            config.judge_backdoor_class,
            derive_seed(config.seed, "backdoor"),
        )
    if config.attack_targets:
        data = _poisoned_cached(
            data,
            config.attack,
            tuple(config.attack_targets),
            config.attack_fraction,
            config.attack_target_class,
            config.attack_scale,
            derive_seed(config.seed, "attack"),
        )
    return data


def _load_partitioned(config: ExperimentConfig) -> FederatedData:
    return _load_cached(
        config.dataset,
        str(config.data_root_path) if config.data_root else "",
        config.download,
        config.label_column,
        config.test_fraction,
        config.num_clients,
        config.train_samples,
        config.partitioning,
        config.alpha,
        config.shards_per_client,
        config.seed,
    )


@functools.lru_cache(maxsize=4)
def _load_cached(
    dataset: str,
    data_root: str,
    download: bool,
    label_column: str,
    test_fraction: float,
    num_clients: int,
    train_samples: int,
    partitioning: str,
    alpha: float,
    shards_per_client: int,
    seed: int,
) -> FederatedData:
    splits = load_dataset(
        dataset,
        data_root or None,
        download=download,
        seed=seed,
        label_column=label_column,
        test_fraction=test_fraction,
    )
    pool = training_pool(len(splits.train), train_samples, seed)
    labels = splits.train.y[torch.as_tensor(pool, dtype=torch.long)]
    if partitioning.startswith(FLOWER_PREFIX):  # Flower Datasets' own partitioner
        from fedunlearn.data.flower_partitioners import flower_partition

        kind = partitioning.removeprefix(FLOWER_PREFIX)
        options = {"alpha": alpha, "seed": seed, "shards_per_partition": shards_per_client}
        parts = flower_partition(labels.numpy(), num_clients, kind, **options)
    else:
        parts = partition_indices(
            labels,
            num_clients,
            partitioning,
            alpha=alpha,
            shards_per_partition=shards_per_client,
            seed=seed,
        )
    return FederatedData(splits=splits, partitions=tuple(pool[part] for part in parts))


@functools.lru_cache(maxsize=4)
def _planted_cached(data, client, fraction, target_class, seed) -> FederatedData:
    return planted_data(data, client, fraction=fraction, target_class=target_class, seed=seed)


def planted_data(
    data: FederatedData, client: int, *, fraction: float, target_class: int, seed: int
) -> FederatedData:
    """``data`` with ``round(fraction · n)`` of ``client``'s n samples (drawn among those of other
    classes, seeded) stamped with the trigger and relabelled ``target_class``; the other clients'
    samples and the test set unchanged (:func:`fedunlearn.data.backdoor.plant_backdoor`)."""
    splits = data.splits
    trigger = make_trigger(splits.train.x[torch.as_tensor(np.concatenate(data.partitions))])
    index = torch.as_tensor(data.partitions[client], dtype=torch.long)
    x, y, planted = plant_backdoor(
        splits.train.x[index],
        splits.train.y[index],
        trigger=trigger,
        fraction=fraction,
        target_class=target_class,
        num_classes=splits.num_classes,
        seed=seed,
    )
    train_x, train_y = splits.train.x.clone(), splits.train.y.clone()
    train_x[index], train_y[index] = x, y
    train = TensorSplit(train_x, train_y)
    planted_splits = dataclasses.replace(splits, train=train)
    plan = BackdoorPlan(trigger, target_class, client, index[planted])
    return FederatedData(planted_splits, data.partitions, plan)


@functools.lru_cache(maxsize=4)
def _poisoned_cached(data, attack, clients, fraction, target_class, scale, seed) -> FederatedData:
    return poisoned_data(
        data,
        attack,
        clients,
        fraction=fraction,
        target_class=target_class,
        scale=scale,
        seed=seed,
    )


def poisoned_data(
    data: FederatedData,
    attack: str,
    clients: tuple[int, ...],
    *,
    fraction: float,
    target_class: int,
    scale: float,
    seed: int,
) -> FederatedData:
    """``data`` with the malicious ``clients`` attacking as ``attack`` says
    (:mod:`fedunlearn.data.poisoning`): ``backdoor`` triggers ``round(fraction · n_k)`` of client
    k's samples (drawn from ``derive_seed(seed, k)``), ``label-flip`` flips every label,
    ``scaled-update`` leaves the samples as they are (the clients boost their replies). The honest
    clients' samples and the test set are unchanged."""
    check_attack_name(attack)
    splits, classes = data.splits, data.splits.num_classes
    if attack not in ("backdoor", "label-flip"):
        plan = AttackPlan(attack, tuple(clients), classes, scale=scale)
        return dataclasses.replace(data, attack=plan)
    trigger = None
    if attack == "backdoor":
        trigger = make_trigger(splits.train.x[torch.as_tensor(np.concatenate(data.partitions))])
    train_x = splits.train.x.clone() if trigger is not None else splits.train.x
    train_y = splits.train.y.clone()
    poisoned = []
    for client in clients:
        index = torch.as_tensor(data.partitions[client], dtype=torch.long)
        client_seed = derive_seed(seed, client)
        if trigger is not None:
            x, y, changed = plant_backdoor(
                train_x[index],
                train_y[index],
                trigger=trigger,
                fraction=fraction,
                target_class=target_class,
                num_classes=classes,
                seed=client_seed,
                keys=("attack-fraction", "attack-target-class"),
            )
            train_x[index] = x
        else:
            y, changed = flip_labels(
                train_y[index], num_classes=classes, fraction=1.0, seed=client_seed
            )
        train_y[index] = y
        poisoned.append(index[changed])
    plan = AttackPlan(
        attack,
        tuple(clients),
        classes,
        target_class=target_class if trigger is not None else -1,
        trigger=trigger,
        poisoned=torch.cat(poisoned).sort().values,
    )
    train = TensorSplit(train_x, train_y)
    return dataclasses.replace(data, splits=dataclasses.replace(splits, train=train), attack=plan)


def validation_samples(data: FederatedData, count: int, seed: int) -> tuple[TensorSplit, str]:
    """Up to ``count`` samples the server holds for validation, drawn without replacement with
    ``seed``, and where they come from: training samples no client holds (a run on a subset,
    ``train-samples``), so that no sample the comparison is measured on decides anything; else,
    when every training sample is some client's, test samples (said in the second value)."""
    if count < 1:
        raise ConfigError("pga-validation-samples", count, "an integer >= 1")
    held = np.concatenate(data.partitions) if data.partitions else np.empty(0, dtype=np.int64)
    spare = np.setdiff1d(np.arange(len(data.splits.train)), held)
    source, pool = "training samples no client holds", data.splits.train
    if len(spare) == 0:
        source, pool, spare = "test samples", data.splits.test, np.arange(len(data.splits.test))
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(spare, size=min(count, len(spare)), replace=False))
    index = torch.as_tensor(chosen, dtype=torch.long)
    return TensorSplit(pool.x[index], pool.y[index]), source


def training_pool(num_train: int, train_samples: int, seed: int) -> np.ndarray:
    """The sorted indices of the training samples the federation shares out (``train-samples``).

    ``0`` keeps all ``num_train``; ``N`` draws N of them without replacement from ``seed`` (a small
    federation overfits its clients' data: the regime where membership inference has a signal).
    """
    if train_samples < 0 or train_samples > num_train:
        raise ConfigError(
            "train-samples",
            train_samples,
            f"0 (all) or an integer in [1, {num_train}] (the training set's size)",
        )
    if train_samples == 0:
        return np.arange(num_train)
    rng = np.random.default_rng(derive_seed(seed, "train-samples"))
    return np.sort(rng.choice(num_train, size=train_samples, replace=False))
