"""Crash recovery: continue an interrupted training run from its last completed round (``resume``).

After every training round t the run directory receives, in this order: the store's retained round
t (committed at aggregation), the metrics row of t, and ``checkpoint.safetensors`` (the global model
after t, with t in its metadata). A crash can strike between any two of these writes, so resuming
from the checkpoint's round c:

* drops the metrics rows after c (written before the crash reached the checkpoint);
* deletes the store's rounds after c (committed before the crash reached the checkpoint): they are
  trained and retained again, so no retained round is lost and none is kept twice;
* verifies every stored blob against its checksum and reports the damaged ones; every later read
  refuses them (:class:`fedunlearn.errors.StoreCorruptionError`), so they are never used.

Clients seed their training from (seed, round, partition) and the server sums updates in partition
order, so the resumed rounds are those an uninterrupted run trains: on the same machine the final
model is the same bit for bit. The exception is DP-FedAvg, whose noise Flower draws unseeded.
Each resume appends what it did to ``recovery_log.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import DATA_KEYS
from fedunlearn.errors import ConfigError
from fedunlearn.store.durable_io import json_loads
from fedunlearn.store.run_directory import RECOVERY_LOG, RunDirectory
from fedunlearn.store.update_store import UpdateStore

#: Run-config keys that decide what training computes: a resumed run must keep them all (the data
#: settings but where the data lie, and the training's).
TRAINING_KEYS = (
    *(key for key in DATA_KEYS if key != "data-root"),
    "rounds",
    "local-epochs",
    "lr",
    "momentum",
    "weight-decay",
    "batch-size",
    "retain",
    "retain-interval",
    "retain-mode",
    "store-dtype",
    "dp-noise-multiplier",
    "dp-clipping-norm",
    "dp-delta",
)


def check_resumable(config: ExperimentConfig, path: Path) -> None:
    """Refuse to resume ``path`` with training settings other than those it was started with."""
    saved = json_loads((path / "config.json").read_text(encoding="utf-8"))
    requested = config.to_run_config()
    for key in TRAINING_KEYS:
        if key in saved and saved[key] != requested[key]:
            raise ConfigError(
                key,
                requested[key],
                f"{saved[key]!r}, the value {path} was started with (resume continues that run; "
                "choose another run-name to train with other settings)",
            )


def training_finished(path: Path) -> bool:
    """Whether the run at ``path`` finished training (its final model and summary are written)."""
    return (path / "model_final.safetensors").is_file() and (path / "summary.json").is_file()


def check_finished_run(
    run: RunDirectory, store: UpdateStore | None, *, log: Callable[[str], None] = print
) -> list[str]:
    """Resuming a run whose training finished: verify its store, record and report the damage."""
    problems = store.verify() if store is not None else []
    run.append_log(
        RECOVERY_LOG,
        {
            "training_finished": True,
            "store_problems": problems,
        },
    )
    log(f"training of {run.path} already finished; reopened it")
    for problem in problems:
        log(f"store damaged, never used: {problem}")
    return problems


def resume_point(
    run: RunDirectory,
    store: UpdateStore | None,
    initial_state: dict[str, torch.Tensor],
    *,
    log: Callable[[str], None] = print,
) -> tuple[int, dict[str, torch.Tensor]]:
    """Bring ``run`` (and its ``store``) back to its last completed round; return that round and
    the global model after it (``initial_state`` for round 0)."""
    checkpoint = run.load_checkpoint()
    last, state = checkpoint if checkpoint is not None else (0, initial_state)
    dropped = run.truncate_metrics(last)
    discarded = store.delete_rounds_after(last) if store is not None else []
    problems = store.verify() if store is not None else []
    run.append_log(
        RECOVERY_LOG,
        {
            "resumed_after_round": last,
            "dropped_metric_rows": dropped,
            "discarded_store_rounds": discarded,
            "store_problems": problems,
        },
    )
    log(
        f"resuming {run.path} after round {last}"
        + (f"; dropped {dropped} metrics row(s) past it" if dropped else "")
        + (f"; discarded store round(s) {discarded}, retained again" if discarded else "")
    )
    for problem in problems:
        log(f"store damaged, never used: {problem}")
    return last, state
