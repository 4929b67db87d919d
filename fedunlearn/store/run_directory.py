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
    atomic_write_bytes,
    atomic_write_json,
    private_directory,
)
from fedunlearn.store.json_lines import append_jsonl, read_jsonl
from fedunlearn.store.sealing import IDENTITY, Sealer, create_identity, sealer_of

__all__ = [
    "IDENTITY",
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


#: The safetensors metadata key of a saved model's seal: :func:`tensors_digest` sealed with the run
#: and the file's role (:meth:`RunDirectory.save_model`).
MODEL_DIGEST = "fedunlearn.sha256"
#: The safetensors metadata key of the role a model file was written in (its name, e.g.
#: ``model_final``), shown when a file is found in another role's place.
MODEL_ROLE = "fedunlearn.role"


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

    Layout: ``identity.json`` (the run's random id and integrity mode:
    :mod:`fedunlearn.store.sealing`), ``config.json``, ``metrics.csv`` (one row per round),
    ``model_initial.safetensors``,
    ``checkpoint.safetensors`` (the global model after the last completed round, while training),
    ``model_final.safetensors``, ``summary.json``, figures (``*.png``), tables (``*.csv`` + ``*.md``)
    and ``store/`` (the retained updates, see :class:`fedunlearn.store.update_store.UpdateStore`).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._metrics: list[dict[str, Any]] = []
        self._sealer: Sealer | None = None

    @property
    def sealer(self) -> Sealer:
        """The run's sealer (its identity's; a run written before identities: the run ``None``)."""
        if self._sealer is None:
            self._sealer = sealer_of(self.path)
        return self._sealer

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
        run._sealer = create_identity(path)
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
        """Save a state dict as ``<name>.safetensors``, sealed with the run and its role ``name``
        (:func:`tensors_digest` sealed: a file copied into another role's place is refused)."""
        return self._save(name, state, {})

    def load_model(self, name: str) -> dict[str, torch.Tensor]:
        """The state dict of ``<name>.safetensors``, refused (:class:`StoreCorruptionError`) when
        its tensors no longer match its seal, when it was sealed for another role or run (a file
        copied into this place), or when it carries no seal in a run whose other model files do.
        A run written before seals, none of whose files has one, is read as it is."""
        return self._load(name, {})

    def save_checkpoint(self, round_number: int, state: Mapping[str, torch.Tensor]) -> Path:
        """Record ``state`` as the global model after round ``round_number``, in one atomic file
        (the round is in the file's metadata and its seal, so model and round can never disagree)."""
        return self._save(CHECKPOINT, state, {"round": str(int(round_number))})

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
        return round_number, self._load(CHECKPOINT, {"round": str(round_number)})

    def _save(self, name: str, state: Mapping[str, torch.Tensor], extra: dict[str, str]) -> Path:
        target = self.path / f"{name}.safetensors"
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        seal = self.sealer.seal({"role": name, **extra}, tensors_digest(tensors))
        metadata = {**extra, MODEL_ROLE: name, MODEL_DIGEST: seal}
        atomic_write_bytes(target, save(tensors, metadata=metadata))
        return target

    def _load(self, name: str, extra: dict[str, str]) -> dict[str, torch.Tensor]:
        target = self.path / f"{name}.safetensors"
        metadata = _model_metadata(target)
        recorded = metadata.get(MODEL_DIGEST)
        state = load_file(str(target))
        if recorded is None and (
            self.sealer.run_id is not None
            or any(_model_metadata(f).get(MODEL_DIGEST) for f in self._models() if f != target)
        ):
            raise StoreCorruptionError(
                f"{target} carries no seal ({MODEL_DIGEST}) while the run's model files do: "
                "its digest was removed; restore the file from a backup"
            )
        if recorded is not None:
            self._check_seal(target, name, extra, metadata, state)
        return state

    def _check_seal(self, target: Path, name, extra, metadata, state) -> None:
        digest = tensors_digest(state)
        if self.sealer.matches({"role": name, **extra}, digest, metadata[MODEL_DIGEST]):
            return
        legacy = self.sealer.run_id is None and metadata[MODEL_DIGEST] == digest
        if legacy:  # written before seals: the tensors' own digest
            return
        role = metadata.get(MODEL_ROLE)
        if role not in (None, name) and self.sealer.matches(
            {"role": role, **extra}, digest, metadata[MODEL_DIGEST]
        ):
            raise StoreCorruptionError(
                f"{target} is this run's {role}.safetensors, copied into the place of {name}; "
                "restore the file from a backup"
            )
        raise StoreCorruptionError(
            f"{target} was edited or damaged (or copied from another run or role): its tensors "
            f"do not match the seal recorded when it was written as {name}; restore it from a "
            "backup"
        )

    def _models(self) -> list[Path]:
        return sorted(self.path.glob("*.safetensors"))

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
        return append_jsonl(self.path / name, {"time": log_time(), **record}, sealer=self.sealer)

    def read_log(self, name: str) -> list[dict[str, Any]]:
        """The records of log ``name`` ([] if absent); a torn last line is skipped with a warning,
        a damaged earlier line raises :class:`fedunlearn.store.durable_io.LogCorruptionError`."""
        return read_jsonl(self.path / name, sealer=self.sealer)

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


def _model_metadata(path: Path) -> dict[str, str]:
    """A model file's safetensors metadata ({} when it has none)."""
    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})
