"""Checks that need the dataset or the disk, made before a federation is launched or a file written.

:meth:`fedunlearn.config.ExperimentConfig.validate` checks each key alone and against the others.
Some values are wrong only for a given dataset or run directory: more clients than training samples,
a ``train-samples`` beyond the training set, a Dirichlet or shard split that leaves a client without
data, a model whose layers cannot take the samples, a scrubbing cohort the clients do not hold,
more certified removals than samples, a run directory that already holds a run, or an
``unlearn-only`` request for a run that never finished or for a client it already forgot.
:func:`preflight` checks all of them and raises :class:`~fedunlearn.errors.ConfigError` naming the
key, the value and what is allowed.

Everything here is read-only: the dataset is loaded (never downloaded) and partitioned in memory,
and the run directory's files are only read. ``fedunlearn-run`` calls :func:`preflight` before it
starts ``flwr run`` (``--dry-run`` too); the ServerApp calls it before it creates the run directory.
Flower-free.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.config import ADOPT_FEDERATION_SIZE, ExperimentConfig, model_problem
from fedunlearn.data.datasets import load_dataset
from fedunlearn.data.federated_data import (
    DATA_KEYS,
    FederatedData,
    load_federated_data,
    training_pool,
)
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.errors import ConfigError, DatasetNotFoundError, did_you_mean
from fedunlearn.store.durable_io import json_loads
from fedunlearn.training.models import resolve_model_name

#: The files a run directory holds once training finished, all of which ``unlearn-only`` reads.
FINISHED_RUN_FILES = (
    "config.json",
    "model_initial.safetensors",
    "model_final.safetensors",
    "metrics.csv",
    "summary.json",
)
#: The request's fields an ``unlearn-only`` run takes over the trained run's configuration; the
#: list ``server.training.loading`` applies.
REQUEST_FIELDS = (
    "unlearn_clients",
    "unlearn_methods",
    "calibration_ratio",
    "calibration_layerwise",
    "calibration_order",
    "device",
    "node_wait_seconds",
    "reply_timeout",
    "unlearn_adopt",
    "adopt_tolerance",
    "flag_gap",
    "keep_original",
    "max_refusals",
    "min_reply_fraction",
    "max_update_ratio",
    "log_tensorboard",  # where the request's comparison is logged too (fedunlearn.tracking)
    "log_mlflow",
) + tuple(  # the later phases a request runs (certified head, scrubbing, audit), as it asks
    f.name
    for f in dataclasses.fields(ExperimentConfig)
    if f.name.startswith(("certified_", "scrub", "mia"))
)


def preflight(config: ExperimentConfig) -> FederatedData | None:
    """Check the run directory, then the data, for ``config``; raise :class:`ConfigError` on the
    first problem. Returns the partitioned data, or ``None`` when it cannot be checked without
    downloading it (``download = true`` and the files are not there yet). An ``unlearn-only``
    request's data are checked with the trained run's settings, which the server uses.

    While ``num-clients`` is to be adopted from the federation (0), only what holds for any K is
    checked here (:func:`check_dataset`; ``None`` is returned): the checks in
    :data:`CHECKS_NEEDING_K` need the partitions, and the ServerApp runs :func:`preflight` again
    once it adopted the federation's size, before it writes anything."""
    config = check_run_directory(config)
    if config.num_clients == ADOPT_FEDERATION_SIZE:
        check_dataset(config)
        return None
    return check_data(config)


#: What only the federation's size K decides: with ``num-clients`` = 0 these wait until the
#: ServerApp adopted the federation's size (and run then, before anything is written).
CHECKS_NEEDING_K = (
    "every client gets data",
    "unlearn-clients and certified-remove-clients are partition ids below K",
    "each client holds its part of the scrub-forget cohort",
    "certified-removals fits the samples of the clients kept",
)


# ---------------------------------------------------------------------- the run directory
def check_run_directory(config: ExperimentConfig) -> ExperimentConfig:
    """A new run needs a free ``output-dir/run-name``; ``resume`` a directory that holds a run or
    nothing; ``unlearn-only`` a finished run that has not forgotten the targets yet. Returns the
    configuration the server runs with (``unlearn-only``: the trained one with the request's keys)."""
    path = config.run_directory()
    _check_writable(config, path)
    if config.unlearn_only:
        return check_finished_run(config, path)
    if config.resume:
        if _holds_files(config, path) and not (path / "config.json").is_file():
            raise ConfigError(
                "run-name",
                config.run_name,
                f"a run to resume, but {path} holds files and no config.json; choose another "
                "run-name or output-dir",
            )
        if (path / "config.json").is_file():
            _read_json_object(config, path / "config.json")
    elif _holds_files(config, path):
        raise ConfigError(
            "run-name",
            config.run_name or path.name,
            f"a new run directory, but {path} already exists and is not empty; choose another "
            "run-name or output-dir (or set resume=true to continue an interrupted run)",
        )
    return config


def _never_created(config: ExperimentConfig, path: Path) -> ConfigError:
    """The error for a request on a run directory that does not exist: the run was never created
    (its launch failed before training, or it ran under another output-dir or run-name), with the
    closest run name of the output-dir's."""
    parent = config.output_path
    names = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    return ConfigError(
        "run-name",
        config.run_name,
        f"a finished run under {parent}; there is no {path}: that run was never created (its "
        "launch failed before training began, or it ran under another output-dir or run-name)"
        + did_you_mean(config.run_name, names),
    )


def check_finished_run(config: ExperimentConfig, path: Path) -> ExperimentConfig:
    """``unlearn-only``: ``path`` holds a run whose training finished and which has not forgotten
    any target yet. Returns the configuration the server will unlearn with (the trained one with
    this request's keys)."""
    # Imported here (and in the run directory's other checks): the run directory's module imports
    # pandas and PyTorch, which a new run's checks need not wait for.
    from fedunlearn.store.run_directory import HISTORY_JOURNAL, UNLEARNING_LOG

    if not path.exists():
        raise _never_created(config, path)
    swapping = (path / HISTORY_JOURNAL).is_file()  # the server rolls the swap forward first
    for name in FINISHED_RUN_FILES:
        if not (path / name).is_file() and not (swapping and name == "model_final.safetensors"):
            hint = (
                " (its training did not finish: continue it with resume=true)"
                if (path / "config.json").is_file()
                else ""
            )
            raise ConfigError(
                "run-name",
                config.run_name,
                f"a finished run under {config.output_path}; {path / name} is missing{hint}",
            )
    from fedunlearn.store.run_check import refuse_unsound_run

    refuse_unsound_run(path, "run-name", config.run_name)
    trained = trained_config(config, path)
    effective = request_config(trained, config)
    forgotten = forgotten_clients(config, path)
    again = sorted(set(config.unlearn_targets) & forgotten)
    if again and sorted(config.unlearn_targets) == _unfinished_or_resumed(config, path):
        return effective  # the same request again: the server finishes it (or has nothing to do)
    if again:
        raise ConfigError(
            "unlearn-clients",
            config.unlearn_clients,
            f"clients {path} has not forgotten yet; {again} already were (see "
            f"{path / UNLEARNING_LOG})",
        )
    if len(forgotten | set(config.unlearn_targets)) >= trained.num_clients:
        raise ConfigError(
            "unlearn-clients",
            config.unlearn_clients,
            f"clients that leave someone in the federation: {sorted(forgotten)} were forgotten "
            f"before, and {trained.num_clients} clients took part",
        )
    check_history(effective, path)
    return effective


def request_config(trained: ExperimentConfig, request: ExperimentConfig) -> ExperimentConfig:
    """The configuration an ``unlearn-only`` request runs with: the trained run's, with the
    request's :data:`REQUEST_FIELDS` and the run it names (``run-name``, ``output-dir``: an
    auto-named run's ``config.json`` stores ``run-name = ""``, and the request may reach the run
    by another path)."""
    return trained.replace(
        **{field: getattr(request, field) for field in REQUEST_FIELDS},
        run_name=request.run_name,
        output_dir=request.output_dir,
        unlearn_only=True,
    )


def check_history(config: ExperimentConfig, path: Path) -> None:
    """The run's retained history holds what each of the request's methods needs (after an
    earlier request it is the adopted method's trajectory: FedEraser's keeps its Δt schedule
    only). Read-only; skipped while an earlier request's adoption is still pending (the server
    finishes it, then checks the same)."""
    from fedunlearn.store.history import check_retained
    from fedunlearn.store.run_directory import HISTORY_JOURNAL
    from fedunlearn.store.update_store import UpdateStore

    if (path / HISTORY_JOURNAL).exists() or _adoption_pending(path):
        return
    store_path = path / "store"
    store = (
        UpdateStore(store_path, readonly=True) if (store_path / "store.json").is_file() else None
    )
    if store is None and not config.retain:
        return  # ExperimentConfig.validate says what retain = false allows
    check_retained(store, config.methods)


def _unfinished_or_resumed(config: ExperimentConfig, path: Path) -> list[int] | None:
    """The targets of the run's last request when running it again finishes it: its history was
    not adopted yet, or its journal is still there (server.unlearning.journal), or ``resume`` asks to
    finish it (a finished one has nothing left to do)."""
    from fedunlearn.store.run_directory import REQUEST_JOURNAL, UNLEARNING_LOG

    log = path / UNLEARNING_LOG
    unfinished = _adoption_pending(path) or (path / REQUEST_JOURNAL).is_file()
    if not (unfinished or config.resume) or not log.is_file():
        return None
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(int(t) for t in json_loads(lines[-1])["targets"]) if lines else None


def _adoption_pending(path: Path) -> bool:
    """Whether the last finished request's history was not adopted yet."""
    from fedunlearn.store.run_directory import HISTORY_LOG, UNLEARNING_LOG

    requests = path / UNLEARNING_LOG
    if not requests.is_file():
        return False
    count = sum(1 for line in requests.read_text(encoding="utf-8").splitlines() if line.strip())
    adopted = path / HISTORY_LOG
    done = adopted.read_text(encoding="utf-8").splitlines() if adopted.is_file() else []
    return count > sum(1 for line in done if line.strip())


def forgotten_clients(config: ExperimentConfig, path: Path) -> set[int]:
    """The partition ids ``path``'s unlearning log records as forgotten (read-only)."""
    from fedunlearn.store.run_directory import UNLEARNING_LOG

    log = path / UNLEARNING_LOG
    if not log.exists():
        return set()
    allowed = f"a run whose {log} holds one JSON object per line with a list of client ids"
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError("run-name", config.run_name, f"{allowed} ({error})") from None
    forgotten: set[int] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            targets = json_loads(line)["targets"]
            forgotten.update(int(t) for t in targets if not isinstance(t, bool))
        except (ValueError, TypeError, KeyError):
            raise ConfigError(
                "run-name", config.run_name, f"{allowed}: line {number} is not"
            ) from None
    return forgotten


def trained_config(config: ExperimentConfig, path: Path) -> ExperimentConfig:
    """The configuration ``path`` was trained with (its ``config.json``), or a ConfigError on
    run-name when it is unreadable or no longer valid."""
    saved = _read_json_object(config, path / "config.json")
    try:
        return ExperimentConfig.from_run_config(saved, strict=False)
    except ConfigError as error:
        raise ConfigError(
            "run-name", config.run_name, f"a run whose config.json is still valid ({error})"
        ) from None


def complete_unlearn_request(values: dict[str, Any], config: ExperimentConfig) -> dict[str, Any]:
    """An ``unlearn-only`` request's run config with the trained run's data settings
    (:data:`fedunlearn.data.federated_data.DATA_KEYS`) filled in where the request leaves them out, so
    that the short recipe (run-name, unlearn-only, unlearn-clients) sizes the federation and builds
    the partitions the run was trained with. A key the request sets to another value than the
    trained run's is refused: the run is unlearned with the settings it was trained with."""
    path = config.run_directory()
    if not config.unlearn_only or not (path / "config.json").is_file():
        return values  # check_finished_run says what is missing
    trained = trained_config(config, path)
    completed = dict(values)
    for key in DATA_KEYS:
        field = key.replace("-", "_")
        theirs = getattr(trained, field)
        unset = key == "num-clients" and config.num_clients == ADOPT_FEDERATION_SIZE
        if key not in values or unset:
            completed[key] = theirs
            continue
        mine = getattr(config, field)
        if key == "model":
            same = resolve_model_name(mine, config.dataset) == resolve_model_name(
                theirs, trained.dataset
            )
        elif key == "data-root":
            same = config.data_root_path.resolve() == trained.data_root_path.resolve()
        else:
            same = mine == theirs
        if not same:
            raise ConfigError(
                key,
                mine,
                f"{theirs!r}, the value {path} was trained with (unlearn-only unlearns that run "
                "with its own settings: leave the key out)",
            )
    return completed


def _check_writable(config: ExperimentConfig, path: Path) -> None:
    """The deepest existing folder on the way to ``path`` must be a folder this user can write."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    key, value = ("output-dir", config.output_dir)
    if existing == path and config.run_name:
        key, value = ("run-name", config.run_name)
    if not existing.is_dir():
        raise ConfigError(key, value, f"a folder; {existing} exists and is not one")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(key, value, f"a folder you can write; {existing} is not writable")


def _holds_files(config: ExperimentConfig, path: Path) -> bool:
    if not path.exists():
        return False
    try:
        return any(path.iterdir())
    except OSError as error:
        raise ConfigError("run-name", config.run_name, f"a readable folder ({error})") from None


def _read_json_object(config: ExperimentConfig, path: Path) -> dict[str, Any]:
    try:
        saved = json_loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(
            "run-name", config.run_name, f"a run whose {path} is readable JSON ({error})"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError("run-name", config.run_name, f"a run whose {path} is a JSON object")
    return saved


# ---------------------------------------------------------------------- the data
def check_data(config: ExperimentConfig) -> FederatedData | None:
    """Load and partition the dataset as every party will (read-only, never downloading) and check
    that each client gets data, the model fits it, the scrubbing cohort exists and the certified
    head has the samples its removal requests ask for."""
    data = _load_without_download(config)
    if data is None:
        return None
    _check_model_fits(config, tuple(data.splits.input_shape), data.splits.num_classes)
    _check_classes(config, data.splits.num_classes)
    check_partitions(config, data)
    if config.scrub:
        cohort_masks(config, data)
    if config.certified_head:
        check_certified_removals(config, data)
    return data


def check_dataset(config: ExperimentConfig) -> None:
    """The checks that hold for any federation size (``num-clients`` = 0): ``train-samples``
    within the training set, a model that fits the samples, a ``scrub-forget`` class label that
    exists and asks for no more samples than there are, ``certified-removals`` below the number
    of training samples."""
    splits = _load_without_download(config, partitioned=False)
    if splits is None:
        return
    pool = len(training_pool(len(splits.train), config.train_samples, config.seed))
    _check_model_fits(config, tuple(splits.input_shape), splits.num_classes)
    _check_classes(config, splits.num_classes)
    if config.scrub:
        forget = ForgetSet.parse(config.scrub_forget, num_clients=0, num_classes=splits.num_classes)
        if forget.count is not None and forget.count > pool:
            raise ConfigError(
                "scrub-forget", config.scrub_forget, f"at most {pool} samples (the training set's)"
            )
    if config.certified_head and config.certified_removals > pool - 1:
        raise ConfigError(
            "certified-removals",
            config.certified_removals,
            f"a whole number in [0, {pool - 1}]: at most the training set's {pool} samples "
            "less one (fewer once the clients in certified-remove-clients are set aside)",
        )


def _check_classes(config: ExperimentConfig, classes: int) -> None:
    """The class keys name classes of the loaded data (a dataset that states its classes was
    checked before loading; a file's or a user's loader's only now)."""
    for key, value, used in (
        ("judge-backdoor-class", config.judge_backdoor_class, config.judge_backdoor),
        ("attack-target-class", config.attack_target_class, config.attack == "backdoor"),
    ):
        if used and value >= classes:
            raise ConfigError(key, value, f"a class of {config.dataset} in [0, {classes - 1}]")


def _check_model_fits(config: ExperimentConfig, input_shape: tuple[int, ...], classes: int) -> None:
    name = resolve_model_name(config.model, config.dataset, input_shape)
    problem = model_problem(name, input_shape, classes)
    if problem:
        raise ConfigError(
            "model",
            config.model,
            f"a model that fits {config.dataset} samples of shape {input_shape} ({problem})",
        )


def _load_without_download(config: ExperimentConfig, *, partitioned: bool = True) -> Any:
    """The partitioned data (``partitioned``), or the dataset's splits; ``None`` while the files
    are to be downloaded by the run itself."""
    try:
        if not partitioned:
            root = config.data_root_path if config.data_root else None
            return load_dataset(
                config.dataset,
                root,
                seed=config.seed,
                label_column=config.label_column,
                test_fraction=config.test_fraction,
            )
        return load_federated_data(dataclasses.replace(config, download=False))
    except DatasetNotFoundError as error:
        if config.download:
            return None  # fetched by the run itself; nothing more can be checked without it
        raise ConfigError(
            "data-root", config.data_root, f"a folder holding the {config.dataset} files ({error})"
        ) from None
    except ConfigError as error:
        if error.parameter == "data-root" and config.download:
            return None
        raise


def check_partitions(config: ExperimentConfig, data: FederatedData) -> None:
    """Every one of the ``num-clients`` clients holds at least one training sample."""
    sizes = [len(part) for part in data.partitions]
    empty = [client for client, size in enumerate(sizes) if size == 0]
    if len(sizes) != config.num_clients or empty:
        raise ConfigError(
            "num-clients",
            config.num_clients,
            f"a federation in which every client gets data; with {config.partitioning} "
            f"partitioning client(s) {empty[:10]} get none (fewer clients, or another split)",
        )


def cohort_masks(config: ExperimentConfig, data: FederatedData) -> dict[int, np.ndarray]:
    """Every client's D_f mask for ``scrub-forget`` (:meth:`ForgetSet.mask`); a cohort that has no
    sample, that asks a client for more samples than it holds, or that leaves nothing to retain
    is a :class:`ConfigError`."""
    forget = ForgetSet.parse(
        config.scrub_forget, num_clients=config.num_clients, num_classes=data.splits.num_classes
    )
    masks = {
        p: forget.mask(data.client_split(p).y.numpy(), p, config.seed)
        for p in range(config.num_clients)
    }
    if not any(mask.any() for mask in masks.values()):
        raise ConfigError("scrub-forget", config.scrub_forget, "a cohort with at least one sample")
    if all(mask.all() for mask in masks.values()):
        raise ConfigError(
            "scrub-forget",
            config.scrub_forget,
            "a cohort that leaves data to retain: it holds every training sample",
        )
    return masks


def check_certified_removals(config: ExperimentConfig, data: FederatedData) -> None:
    """The single-sample requests are drawn without replacement from the samples of the clients
    not in ``certified-remove-clients``, and at least one sample must remain."""
    whole = set(config.certified_client_targets)
    pool = sum(len(part) for p, part in enumerate(data.partitions) if p not in whole)
    if config.certified_removals > pool - 1:
        raise ConfigError(
            "certified-removals",
            config.certified_removals,
            f"a whole number in [0, {pool - 1}]: the requests are drawn from the {pool} samples "
            "of the clients not in certified-remove-clients, and one must remain",
        )
