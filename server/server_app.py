"""Flower ServerApp: the main job. Reads the run config, trains with retention, prints where results are.

Run it with ``flwr run . --stream`` (see README.md): without ``num-clients`` it adopts the size of the
federation it runs on; ``fedunlearn-run`` sizes the federation and resolves paths for you.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Mapping
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import FedUnlearnError
from fedunlearn.preflight import preflight
from fedunlearn.store.run_directory import UNLEARNING_LOG
from server.federation.members import adopt_federation_size
from server.federation.missing import MissingClients
from server.federation.threads import use_server_threads
from server.training.loading import load_trained_run
from server.training.original import train_federated
from server.training.rounds import dp_epsilon_of
from server.unlearning import journal as request_journal
from server.unlearning.adoption import adopt, is_adopted
from server.unlearning.request import run_unlearning, unlearning_done
from server.unlearning.stacked import run_stacked_comparison


def _log(line: str) -> None:
    print(f"[fedunlearn] {line}", flush=True)


#: Flower's in-memory LinkState: loaded in a process that runs Flower's simulation runtime.
IN_MEMORY_LINKSTATE = "flwr.server.superlink.linkstate.in_memory_linkstate"


def index_simulation_messages() -> bool:
    """:func:`server.federation.message_index.use_message_index` where Flower's simulation
    runtime runs in this process (its in-memory LinkState is loaded: ``flwr-simulation`` imports
    it before the ServerApp starts); elsewhere (a deployed ServerApp, the local engine) there is
    no such state to index, and the patch's import (0.7 s of Flower's link state) is skipped.
    True when this call installed the index."""
    if IN_MEMORY_LINKSTATE not in sys.modules:
        return False
    from server.federation.message_index import use_message_index

    return use_message_index()


def create_server_app(run_config_overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp; ``run_config_overrides`` replace run-config values (tests, embedded runs)."""
    overrides = dict(run_config_overrides or {})
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        """:func:`serve` the run config, one ``[fedunlearn] error:`` line for a refusal."""
        use_server_threads()  # the client workers hold the cores (server.federation.threads)
        index_simulation_messages()  # a message handed out in time independent of K
        try:
            serve(grid, {**context.run_config, **overrides})
        except FedUnlearnError as error:
            _log(f"error: {error}")
            raise
        except OSError as error:
            failure = disk_failure(error, context_run_directory(context, overrides))
            if failure is None:
                raise
            _log(f"error: {failure}")
            raise failure from error

    return app


def serve(grid: Grid, run_config: Mapping[str, Any], *, log=_log) -> None:
    """Validate the run config, train (FedAvg with retention), unlearn and compare; then, with
    ``certified-head``, train a certified head and stream removal requests to it; with ``scrub``,
    scrub a cohort with every scrubbing method and baseline; with ``mia``, audit; last, adopt the
    request's history. A request interrupted anywhere is finished by serving it again
    (:mod:`server.unlearning.journal`)."""
    config = ExperimentConfig.from_run_config(run_config)
    preflight(config)  # the data and the run directory, before anything is written
    # num-clients = 0: K becomes the federation's size, once, before anything is written;
    # every later step (training, unlearning, audits, the judge) sees that K.
    adopted = adopt_federation_size(grid, config, log=log)
    if adopted is not config:
        config = adopted
        preflight(config)  # the partitions, now that K is known
    if config.judge_models:
        from server.audit.judge import run_judge  # sklearn, scipy, matplotlib: only a judge run's

        run_judge(grid, config, log=log)
        return
    if config.stack_models:
        run_stacked_comparison(grid, config, log=log)
        return
    if config.unlearn_only:
        outcome = load_trained_run(grid, config, log=log)
    else:
        outcome = train_federated(grid, config, log=log)
    config = outcome.config  # unlearn-only: the trained run's, with the request's keys
    targets = config.unlearn_targets
    if targets and is_adopted(outcome.run, targets):
        log(f"unlearning of {targets} finished and adopted in this run: nothing to do")
        return
    missing = MissingClients(outcome.members, outcome.screen)  # phases count who answered
    if unlearning_done(outcome.run, targets):  # decided: its later phases run again
        log(f"unlearning of {targets} already finished in this run; kept")
        missing.key = f"request {len(outcome.run.read_log(UNLEARNING_LOG))}"
    elif targets:
        run_unlearning(grid, outcome, targets, log=log, missing=missing)
    _later_phases(grid, outcome, missing, log)
    if targets:  # last: the request's comparisons and audit needed the old history
        if outcome.store is not None:
            outcome.store.close()
        adopt(outcome.run, keep_original=config.keep_original, log=log)
        request_journal.close(outcome.run)
    log(f"results in {outcome.run.path}")


def _later_phases(grid: Grid, outcome, missing: MissingClients, log) -> None:
    """The certified head, scrubbing and the membership audit, each when the run config asks for
    it and every client is there to answer (else refused, naming who is missing:
    :meth:`MissingClients.allows`); then ``summary.json`` counts the refusals and drops since
    training."""
    config = outcome.config
    in_memory = {}  # models audited without ever being written (the trained certified head)
    # Each phase's module is imported when its run asks for it (SciPy, scikit-learn, pandas,
    # matplotlib): the main job's ServerApp starts without them (docs/scale.md, "Start-up").
    if config.certified_head and missing.allows("certified-head", log):
        from server.certified.head import run_certified_head

        certified = run_certified_head(grid, outcome, log=log, dp_epsilon=dp_epsilon_of(config))
        in_memory.update(certified.audit_models())
    if config.scrub and missing.allows("scrub", log):
        from server.scrubbing.phase import run_scrubbing

        run_scrubbing(grid, outcome, log=log, missing=missing)
    if config.mia and missing.allows("mia", log):
        from server.audit.membership import run_membership_audit

        run_membership_audit(grid, outcome, log=log, in_memory=in_memory)
    missing.write_summary(outcome.run)


def context_run_directory(context: Context, overrides: Mapping[str, Any]) -> str:
    """The run directory this run writes to, as its run config names it (for messages)."""
    try:
        config = ExperimentConfig.from_run_config({**context.run_config, **overrides})
    except FedUnlearnError:
        return "the run directory printed at the start"
    name = config.run_name or "<the run directory's name printed at the start>"
    return str(config.output_path / name)


def disk_failure(error: OSError, where: str) -> FedUnlearnError | None:
    """A full disk or quota (ENOSPC, EDQUOT) or a read-only file system as one line that says
    which path and how to go on; None for any other OSError (a bug: its traceback is kept). The
    run directory stays consistent (atomic writes, a journalled history), so a resume finishes."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return None
    path = error.filename or where
    return FedUnlearnError(
        f"{error.strerror} writing {path}: free space (or make it writable), then continue the "
        f"run in {where} with --set resume=true and its run-name and output-dir"
    )


app = create_server_app()
