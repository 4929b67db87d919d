"""A run's output directory: configuration, per-round metrics, models, tables, figures and the store.

Every file is written atomically (temporary file, fsync, rename), so a reader never sees half a file;
logs are append-only JSON lines that survive a crash mid-append (:mod:`fedunlearn.store.durable_io`). An
existing run directory is never overwritten. The directory is 0700 and every file in it 0600, whatever
the umask: models, updates and logs reveal the clients' data.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.durable_io import (
    PRIVATE_DIRECTORY_MODE,
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    private_directory,
    read_jsonl,
)

__all__ = [
    "CERTIFIED_LEDGER",
    "CHECKPOINT",
    "HISTORY_JOURNAL",
    "HISTORY_LOG",
    "RECOVERY_LOG",
    "REFUSALS_LOG",
    "REQUEST_JOURNAL",
    "STOP_REQUEST",
    "SCRUBBING_LOG",
    "UNLEARNING_LOG",
    "RunDirectory",
    "log_time",
    "request_stop",
]

CHECKPOINT = "checkpoint"
#: Written by ``fedunlearn-run`` on Ctrl-C; training stops after the round it finds it in (a
#: stopped Flower run's ServerApp may go on for several rounds before it notices).
STOP_REQUEST = "stop-requested"

# The run's append-only logs (:meth:`RunDirectory.append_log` stamps each record's ``time``).
#: Each finished unlearning request (the forgotten partition ids under ``targets``), written by
#: :mod:`server.unlearning.request`; :mod:`fedunlearn.preflight` reads it too.
UNLEARNING_LOG = "unlearning_log.jsonl"
#: Each adopted model's history rewrite (:mod:`server.unlearning.adoption`).
HISTORY_LOG = "history_log.jsonl"
#: Each scrubbing phase (:mod:`server.scrubbing.phase`).
SCRUBBING_LOG = "scrubbing.jsonl"
#: Each resume of the run (:mod:`server.training.resume`).
RECOVERY_LOG = "recovery_log.jsonl"
#: Each refused reply and dropped client (:mod:`server.federation.reply_screening`).
REFUSALS_LOG = "refused_replies.jsonl"
#: The certified-removal ledger: one certificate per line, written by
#: :func:`fedunlearn.certified.certificate.append_certificate` (and SIFU's), not by ``append_log``.
CERTIFIED_LEDGER = "certified_removal.jsonl"
#: The history rewrite's journal (:mod:`server.unlearning.adoption`): while it exists, or the history log has
#: fewer entries than the unlearning log, an adoption is pending.
HISTORY_JOURNAL = "history_rewrite.json"
#: An unlearning request's journal (:mod:`server.unlearning.journal`), from its first file to adoption.
REQUEST_JOURNAL = "request.json"


def log_time() -> str:
    """Now, as :meth:`RunDirectory.append_log` stamps it: local time with its UTC offset
    (ISO 8601, e.g. ``2025-01-31T14:05:09+0100``)."""
    # time.time(), not strftime's own clock: time(2) is coarse and can lag time.time() by a tick
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time()))


def request_stop(path: Path) -> bool:
    """Ask the run in ``path`` to stop after its current round; False when there is no run."""
    if not Path(path).is_dir():
        return False
    (Path(path) / STOP_REQUEST).touch(mode=0o600)
    return True


#: The safetensors metadata key of a saved model's digest (:func:`tensors_digest`).
MODEL_DIGEST = "fedunlearn.sha256"


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 of each tensor's name, dtype, shape and raw bytes, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class RunDirectory:
    """Files of one training run under ``path``.

    Layout: ``config.json``, ``metrics.csv`` (one row per round), ``model_initial.safetensors``,
    ``checkpoint.safetensors`` (the global model after the last completed round, while training),
    ``model_final.safetensors``, ``summary.json``, figures (``*.png``), tables (``*.csv`` + ``*.md``)
    and ``store/`` (the retained updates, see :class:`fedunlearn.store.update_store.UpdateStore`).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._metrics: list[dict[str, Any]] = []

    @classmethod
    def create(cls, path: Path, config: Mapping[str, Any]) -> RunDirectory:
        """Create a new run directory and write ``config.json``; refuse one that already holds files."""
        path = Path(path)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ConfigError(
                "run-name",
                path.name,
                f"a new run directory, but {path} already exists and is not empty; choose another "
                "run-name or output-dir (or set resume=true to continue an interrupted run)",
            )
        private_directory(path)
        os.chmod(path, PRIVATE_DIRECTORY_MODE)  # also when it existed, empty
        run = cls(path)
        run.write_json("config.json", dict(config))
        return run

    @classmethod
    def open(cls, path: Path) -> RunDirectory:
        """An existing run directory, its per-round metrics read back from ``metrics.csv``."""
        run = cls(path)
        metrics = run.path / "metrics.csv"
        if metrics.is_file():
            run._metrics = pd.read_csv(metrics).to_dict("records")
        return run

    @property
    def store_path(self) -> Path:
        return self.path / "store"

    def write_json(self, name: str, obj: Any) -> Path:
        return atomic_write_json(self.path / name, obj)

    def save_model(self, name: str, state: Mapping[str, torch.Tensor]) -> Path:
        """Save a state dict as ``<name>.safetensors``, its tensors' digest in the metadata."""
        target = self.path / f"{name}.safetensors"
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        atomic_write_bytes(target, save(tensors, metadata={MODEL_DIGEST: tensors_digest(tensors)}))
        return target

    def load_model(self, name: str) -> dict[str, torch.Tensor]:
        """The state dict of ``<name>.safetensors``; a file whose tensors no longer match the
        digest recorded when it was written is a :class:`StoreCorruptionError`, and so is a file
        without a digest in a run whose other model files have one (it was removed). A run written
        before digests, none of whose files has one, is read as it is."""
        target = self.path / f"{name}.safetensors"
        recorded = _model_digest(target)
        state = load_file(str(target))
        if recorded is None and any(
            _model_digest(other) is not None
            for other in self.path.glob("*.safetensors")
            if other != target
        ):
            raise StoreCorruptionError(
                f"{target} carries no sha256 while the run's other model files do: its digest "
                "was removed; restore it from a backup"
            )
        if recorded is not None and recorded != tensors_digest(state):
            raise StoreCorruptionError(
                f"{target} was edited or damaged: its tensors do not match the sha256 recorded "
                "when it was written; restore it from a backup"
            )
        return state

    def save_checkpoint(self, round_number: int, state: Mapping[str, torch.Tensor]) -> Path:
        """Record ``state`` as the global model after round ``round_number``, in one atomic file
        (the round is in the file's metadata, so model and round can never disagree)."""
        target = self.path / f"{CHECKPOINT}.safetensors"
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        metadata = {"round": str(int(round_number)), MODEL_DIGEST: tensors_digest(tensors)}
        atomic_write_bytes(target, save(tensors, metadata=metadata))
        return target

    def load_checkpoint(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(round, global model) of the last checkpoint, or ``None`` when there is none."""
        target = self.path / f"{CHECKPOINT}.safetensors"
        if not target.is_file():
            return None
        with safe_open(str(target), framework="pt") as handle:
            round_number = int((handle.metadata() or {}).get("round", -1))
        if round_number < 0:
            raise ConfigError(
                "resume", True, f"a run whose {target} records its round; it does not (remove it)"
            )
        return round_number, self.load_model(CHECKPOINT)

    def take_stop_request(self) -> bool:
        """Whether a stop was requested (:func:`request_stop`); the request is consumed."""
        request = self.path / STOP_REQUEST
        if not request.exists():
            return False
        request.unlink(missing_ok=True)
        return True

    def remove_checkpoint(self) -> None:
        """Drop the checkpoint once training wrote its final model and summary."""
        (self.path / f"{CHECKPOINT}.safetensors").unlink(missing_ok=True)

    def truncate_metrics(self, last_round: int) -> int:
        """Keep the metrics rows of rounds <= ``last_round``; return how many were dropped."""
        kept = [row for row in self._metrics if int(row["round"]) <= last_round]
        dropped = len(self._metrics) - len(kept)
        self._metrics = kept
        if dropped:
            self.write_table("metrics", pd.DataFrame(self._metrics), markdown=False)
        return dropped

    def append_metrics(self, row: Mapping[str, Any]) -> Path:
        """Add one round's metrics and rewrite ``metrics.csv`` (small; rewritten whole, atomically)."""
        self._metrics.append(dict(row))
        return self.write_table("metrics", pd.DataFrame(self._metrics), markdown=False)

    @property
    def metrics(self) -> pd.DataFrame:
        return pd.DataFrame(self._metrics)

    def append_log(self, name: str, record: Mapping[str, Any]) -> Path:
        """Append ``record`` as one JSON line to ``name`` (an append-only log, 0600), stamped with
        its ``time`` (:func:`log_time`), and make it durable; a torn last line left by a crash is
        cut off first (:func:`fedunlearn.store.durable_io.append_jsonl`)."""
        if "time" in record:
            raise ValueError(f"a record for {name} holds its own time: append_log stamps it")
        return append_jsonl(self.path / name, {"time": log_time(), **record})

    def read_log(self, name: str) -> list[dict[str, Any]]:
        """The records of log ``name`` ([] if absent); a torn last line is skipped with a warning,
        a damaged earlier line raises :class:`fedunlearn.store.durable_io.LogCorruptionError`."""
        return read_jsonl(self.path / name)

    def write_table(
        self, name: str, table: pd.DataFrame, *, markdown: bool = True, floatfmt: str = ".4f"
    ) -> Path:
        """Write ``<name>.csv`` and, unless ``markdown`` is false, ``<name>.md`` (numbers formatted
        with ``floatfmt``)."""
        target = self.path / f"{name}.csv"
        atomic_write_bytes(target, table.to_csv(index=False).encode())
        if markdown:
            atomic_write_bytes(
                self.path / f"{name}.md",
                (table.to_markdown(index=False, floatfmt=floatfmt) + "\n").encode(),
            )
        return target


def _model_digest(path: Path) -> str | None:
    """The tensors' sha256 a model file's metadata records (None: written before digests)."""
    with safe_open(str(path), framework="pt") as handle:
        return (handle.metadata() or {}).get(MODEL_DIGEST)
