"""History that forgets: after an unlearning request, nothing the server keeps determines the
forgotten clients' updates (the design's "History after unlearning").

Every retained global model from round 2 on, with the remaining clients' updates, determines a
forgotten client's updates exactly: U_k^t = (N/N_k)(M^{t+1} − M^t) − Σ_{j≠k} (N_j/N_k) U_j^t. Deleting
its blobs is therefore not forgetting. So each method the request may adopt (``unlearn-adopt``; with
``auto`` FedEraser and FedRetrain) writes its own trajectory into a staging store
(``store.request-<n>-<method>``) while it runs (FedEraser: M̃^{t_j} and each applied update Ũ_k;
FedRetrain: its own global models and client updates at the same Δt). Once the models are measured
the request adopts one that is not flagged (:mod:`fedunlearn.unlearning.verdicts`) and discards the
other staging stores; once the request is over (its comparisons, certified head, scrubbing and audit
included) :func:`adopt` makes that trajectory the run's history:

* ``store/`` becomes the staging store; ``model_final`` becomes the adopted method's model;
* every other model file in the run directory (the pre-request model, FedAccum's, the scrubbed and
  certified models, earlier requests' models: all computed from a history that held the targets) is
  deleted, with the pre-request store — or, with ``keep-original = true``, moved to
  ``original-<request>/``, which then determines the targets' updates: a research setting;
* ``history_log.jsonl`` records what was adopted, kept and deleted.

The swap is journalled (``history_rewrite.json``, written first): a crash anywhere in it is rolled
forward by :func:`finish_pending` the next time the run is opened, so the run never ends with the
old history and the new model, or without a store.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING, retention_policies
from fedunlearn.store.durable_io import (
    fsync_directory,
    json_loads,
    private_directory,
)
from fedunlearn.store.history import forget_clients
from fedunlearn.store.run_directory import (
    HISTORY_JOURNAL,
    HISTORY_LOG,
    UNLEARNING_LOG,
    RunDirectory,
)
from fedunlearn.store.update_store import UpdateStore
from server.progress import Log
from strategies.retaining import RECORD_KEY, STATE_KEY

JOURNAL = HISTORY_JOURNAL  # named once, in fedunlearn.store.run_directory


def staging_path(run: RunDirectory, request: int, method: str) -> Path:
    """Where request ``request``'s candidate ``method`` writes its trajectory."""
    return run.path / f"store.request-{request}-{method}"


def open_staging(run: RunDirectory, request: int, like: UpdateStore, method: str) -> UpdateStore:
    """An empty staging store for ``method`` in request ``request`` (a crashed attempt's leftover
    is removed), with ``like``'s dtype and metadata."""
    path = staging_path(run, request, method)
    if path.exists():
        _remove_tree(path)
    staging = UpdateStore(path, dtype=like.dtype)
    # The trajectory is kept at the adopted method's own rounds: the training run's retention
    # record and policy states describe a history that is being replaced.
    metadata = {k: v for k, v in like.metadata.items() if k not in (RECORD_KEY, STATE_KEY)}
    staging.set_metadata(**{**metadata, "history": f"{method} trajectory of request {request}"})
    return staging


def discard_stagings(run: RunDirectory, request: int, *, keep: str | None = None) -> None:
    """Remove request ``request``'s staging stores but ``keep``'s (the candidates not adopted, or
    a crashed attempt's leftovers)."""
    kept = staging_path(run, request, keep).name if keep is not None else None
    for path in sorted(run.path.glob(f"store.request-{request}-*")):
        if path.name != kept:
            _remove_tree(path)


def adopted_requests(run: RunDirectory) -> list[dict]:
    """The requests whose trajectory became the run's history, in order."""
    return run.read_log(HISTORY_LOG)


def is_adopted(run: RunDirectory, targets: list[int]) -> bool:
    """Whether a request forgetting exactly ``targets`` finished and its history was adopted."""
    return any(sorted(e["targets"]) == sorted(targets) for e in adopted_requests(run))


def pending_request(run: RunDirectory) -> dict | None:
    """The last unlearning request, when it finished but its history was not adopted yet."""
    requests = run.read_log(UNLEARNING_LOG)
    adopted = {entry["request"] for entry in adopted_requests(run)}
    if not requests:
        return None
    last = requests[-1]
    number = last.get("request", len(requests))
    return None if number in adopted else {**last, "request": number}


def adopt(run: RunDirectory, *, keep_original: bool, log: Log = print) -> None:
    """Make the last finished request's trajectory the run's history (see the module docstring).
    Does nothing when every request is adopted already."""
    request = pending_request(run)
    if request is None:
        return
    number, suffix = request["request"], request.get("suffix", "")
    method = request["adopted"]
    if not (run.path / f"model_{method}{suffix}.safetensors").is_file():
        raise ConfigError(
            "unlearn-adopt", method, f"a method whose model request {number} saved; it is missing"
        )
    # The adoptable methods' models never saw a forgotten client's data or updates: they stay.
    kept = ["model_initial.safetensors"] + [
        f"model_{m}{suffix}.safetensors"
        for m in UNLEARNING.names(adoptable=True)
        if m in request["methods"]
    ]
    journal = {
        "request": number,
        "targets": request["targets"],
        "adopted": method,
        "model": f"model_{method}{suffix}.safetensors",
        "staging": _staging_of(run, request).name,
        "keep_original": bool(keep_original),
        "kept": kept,
    }
    run.write_json(JOURNAL, journal)
    finish_pending(run, log=log)


def _staging_of(run: RunDirectory, request: dict) -> Path:
    """The adopted method's staging store of a finished request (a request logged before
    staging stores were per method kept ``store.request-<n>``)."""
    path = staging_path(run, request["request"], request["adopted"])
    legacy = run.path / f"store.request-{request['request']}"
    return legacy if not path.exists() and legacy.exists() else path


def finish_pending(run: RunDirectory, *, log: Log = print) -> bool:
    """Roll an interrupted :func:`adopt` forward (each step is idempotent); True when there was
    one. Called whenever a run directory is reopened, before its store is opened."""
    path = run.path / JOURNAL
    if not path.is_file():
        return False
    journal = json_loads(path.read_text(encoding="utf-8"))
    number = journal["request"]
    archive = run.path / (
        f"original-{number}" if journal["keep_original"] else f".discarded-{number}"
    )
    private_directory(archive)
    staging = run.path / journal["staging"]
    if staging.exists() and run.store_path.exists():
        os.replace(run.store_path, archive / "store")
    moved = []
    for file in sorted(run.path.glob("*.safetensors")):
        if file.name not in journal["kept"]:
            os.replace(file, archive / file.name)
            moved.append(file.name)
    fsync_directory(run.path)
    if staging.exists():
        os.replace(staging, run.store_path)
    _forget_in_old_history(run, archive, journal)
    # re-sealed in model_final's role: a copy of the bytes would carry the method's role
    run.save_model("model_final", run.load_model(Path(journal["model"]).stem))
    if not journal["keep_original"]:
        _remove_tree(archive)
    if number not in {entry["request"] for entry in adopted_requests(run)}:
        run.append_log(
            HISTORY_LOG,
            {
                "request": number,
                "targets": journal["targets"],
                "adopted": journal["adopted"],
                "kept_original": journal["keep_original"],
                "original": archive.name if journal["keep_original"] else None,
                "moved": moved,
            },
        )
    path.unlink()
    fsync_directory(run.path)
    _report(journal, archive, moved, log)
    return True


def _forget_in_old_history(run: RunDirectory, archive: Path, journal: dict) -> None:
    """Delete the targets' retained updates wherever a history is kept after the swap: in
    ``original-<n>/store`` (``keep-original``), and in ``store/`` (the trajectory holds none of
    them, but a request without a staging store kept the old one there). Idempotent."""
    paths = [run.store_path] + ([archive / "store"] if journal["keep_original"] else [])
    for path in paths:
        if (path / "store.json").is_file():
            with UpdateStore(path) as store:
                forget_clients(store, journal["targets"], retention_policies())


def _report(journal: dict, archive: Path, moved: list[str], log: Log) -> None:
    what = f"request {journal['request']}: the retained history is now {journal['adopted']}'s"
    if journal["keep_original"]:
        log(
            f"{what}; keep-original = true: the previous history and {len(moved)} model file(s) "
            f"are in {archive}, and they determine the forgotten clients' updates"
        )
    else:
        log(
            f"{what}; the previous history and {len(moved)} model file(s) computed from it were "
            "deleted: no file left determines the forgotten clients' updates"
        )


def _remove_tree(path: Path) -> None:
    """Unlink every file under ``path``, then the folders (files first: a crash leaves a tree that
    the next attempt finishes removing)."""
    if not path.exists():
        return
    for root, _directories, files in os.walk(path):
        for name in files:
            Path(root, name).unlink()
    shutil.rmtree(path)
    fsync_directory(path.parent)
