"""Reopen a finished run to unlearn more clients from it (``unlearn-only = true``).

The training settings (dataset, partitioning, K, seeds, rounds, local epochs, Δt ...) are those
the run was trained with, read from its ``config.json``; the request brings only the unlearning
settings (which clients, which methods, r, calibration options) and the device.
"""

from __future__ import annotations

from collections.abc import Callable

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.errors import ConfigError
from fedunlearn.preflight import request_config
from fedunlearn.store.durable_io import json_loads
from fedunlearn.store.run_check import refuse_unsound_run
from fedunlearn.store.run_directory import RunDirectory
from fedunlearn.store.update_store import UpdateStore
from server.federation.reply_screening import ReplyScreen
from server.training.rounds import TrainingOutcome, discover
from server.unlearning import journal as request_journal
from server.unlearning.adoption import finish_pending


def load_trained_run(
    grid, request: ExperimentConfig, *, log: Callable[[str], None] = print
) -> TrainingOutcome:
    """The outcome of the trained run ``output-dir/run-name``, ready for another unlearning request."""
    if not request.run_name:
        raise ConfigError(
            "run-name", "", "the name of the trained run to unlearn from (unlearn-only = true)"
        )
    path = request.run_directory()
    if (path / "config.json").is_file():
        # an interrupted history rewrite, before anything is read (it restores model_final)
        finish_pending(RunDirectory.open(path), log=log)
    for needed in (
        "config.json",
        "model_initial.safetensors",
        "model_final.safetensors",
        "metrics.csv",
    ):
        if not (path / needed).is_file():
            raise ConfigError(
                "run-name",
                request.run_name,
                f"a finished run under {request.output_path}; {path / needed} is missing",
            )
    refuse_unsound_run(path, "run-name", request.run_name)  # no method acts on a foreign record
    trained = ExperimentConfig.from_run_config(json_loads((path / "config.json").read_text()))
    config = request_config(trained, request)
    data = load_federated_data(config)
    members = discover(grid, config, data, log=log, partial=True)  # offline nodes: named later
    _check_whole_federation(config, members)
    run = RunDirectory.open(path)
    request_journal.reopen(run, config.unlearn_targets, keep_original=config.keep_original, log=log)
    store = UpdateStore(run.store_path) if (run.store_path / "store.json").is_file() else None
    log(f"reopened run {path} ({len(store.rounds()) if store else 0} retained round(s))")
    return TrainingOutcome(
        config,
        run,
        data,
        members,
        store,
        run.load_model("model_initial"),
        run.load_model("model_final"),
        ReplyScreen(
            members,
            max_refusals=config.max_refusals,
            log=log,
            run=run,
            max_update_ratio=config.max_update_ratio,
        ),
    )


def _check_whole_federation(config: ExperimentConfig, members) -> None:
    """A request that went on without some SuperNodes (``members.unconnected``) may unlearn (each
    method goes on without them or is refused, :mod:`server.unlearning.request`), but the phases
    that need every client's answer may not: their sums would silently leave those clients out.
    Refused before anything is written."""
    if not members.unconnected:
        return
    offline = ", ".join(str(p) for p in sorted(members.unconnected))
    for on, key in (
        (config.certified_head, "certified-head"),
        (config.scrub, "scrub"),
        (config.mia, "mia"),
    ):
        if on:
            raise ConfigError(
                key,
                True,
                f"false while client(s) {offline} are offline: it needs every client's "
                "answer; restart their SuperNodes, or run the unlearning alone",
            )
