"""The unlearning phase of an experiment: forget the target clients with every requested method,
measure each resulting model, and decide which trajectory becomes the run's history (adopted, with
the targets' retained updates deleted, once the request's later phases ran: :mod:`server.unlearning.adoption`).
A request is a transaction (:mod:`server.unlearning.journal`).

Methods (Liu et al., FedEraser, Section V), registered in :data:`fedunlearn.registry.UNLEARNING`
and run by the shared :class:`server.method_runner.MethodRunner`:

* ``federaser``  — calibrated reconstruction from retained updates (Algorithm 1);
* ``fedaccum``   — the retained updates of the remaining clients, accumulated without calibration (eq. 5);
* ``fedretrain`` — FedAvg from the same initial model, same seeds, rounds and local epochs, without
  the targets (they receive no message);
* ``fedavg``     — the original model, the starting point every method is compared with.

The readouts need the targets' training data. In a simulation the server rebuilds those partitions
from the run configuration for measurement only; no method ever reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import pandas as pd
from flwr.serverapp import Grid

from fedunlearn.console_table import console_table
from fedunlearn.errors import ConfigError
from fedunlearn.memory import megabytes, release_free_memory, take_interval_peak_rss_bytes
from fedunlearn.progress import Progress
from fedunlearn.registry import UNLEARNING, run_retention, trajectory_serves
from fedunlearn.store.history import check_retained, history
from fedunlearn.store.run_directory import UNLEARNING_LOG
from fedunlearn.tracking import open_tracker
from fedunlearn.unlearning.calibration_top_up import TopUp
from fedunlearn.unlearning.federaser import fedaccum as accumulate_retained
from fedunlearn.unlearning.verdicts import (
    Adoption,
    AdoptionRefused,
    choose_adoption,
    training_flag,
)
from server.federation.members import round_sampler
from server.federation.missing import MissingClients
from server.federation.queries import collect_replies
from server.method_runner import MethodRunner
from server.progress import Log, count
from server.training.rounds import (
    TrainingOutcome,
    fedavg_rounds,
    participant_strategy,
    train_config_record,
)
from server.unlearning import journal as request_journal
from server.unlearning.adoption import discard_stagings, open_staging
from server.unlearning.comparison import (
    measure,
    retained_blobs_of,
    with_costs,
    with_keep_training,
    with_verdicts,
)
from server.unlearning.going_on import (
    going_on_without,
    keep_training_last,
    offline_remaining,
    refusal_rule,
    without_budget,
)
from strategies.federaser import FedEraser

LOG_NAME = UNLEARNING_LOG  # each request's record (named in fedunlearn.store.run_directory)


def unlearning_done(run, targets: list[int]) -> bool:
    """Whether ``run``'s unlearning log records a finished request for exactly ``targets`` (a
    request interrupted before its log entry left no record and is simply run again)."""
    return any(sorted(entry["targets"]) == sorted(targets) for entry in run.read_log(LOG_NAME))


@dataclass
class UnlearningContext:
    """What an unlearning method gets (``implementation(context, name)``): the trained run, whom to
    leave out (``excluded``: this request's ``targets`` and every earlier one's), who remains, and
    the stores the methods the request may adopt (``candidates``) write their trajectories to.
    Only a method registered with ``target_participates`` addresses ``targets``
    (:mod:`server.unlearning.participation`)."""

    grid: Grid
    outcome: TrainingOutcome
    excluded: list[int]
    remaining_nodes: list[int]
    log: Log
    candidates: list[str]
    staging: dict = field(default_factory=dict)
    targets: list[int] = field(default_factory=list)
    #: remaining clients offline at the request (partition -> node, None: never connected in
    #: this run): left out by the methods that go on without them (``MethodSpec.offline``)
    offline: dict[int, int | None] = field(default_factory=dict)
    #: each method's cost so far in this request (:class:`server.federation.metering.Cost`), by
    #: name, filled as the methods run: keep-training spends another method's budget
    costs: dict = field(default_factory=dict)

    def trajectory(self, name: str):
        """The store for ``name``'s trajectory when the request may adopt it, else None."""
        return self.staging.get(name)

    def history(self, name: str):
        """What the training run retained for method ``name`` (its policy's selection)."""
        policy = UNLEARNING[name].policy()
        if policy is None:
            raise ConfigError(
                "retention", None, f"a retention policy for {name} (it reads history)"
            )
        return history(self.outcome.store, policy.name, method=name)


def run_unlearning(
    grid,
    outcome: TrainingOutcome,
    targets: list[int],
    *,
    log: Log = print,
    missing: MissingClients | None = None,
) -> pd.DataFrame:
    """Forget ``targets`` (partition ids, the config's ``unlearn-clients``) with each method;
    returns the comparison table. ``missing``: the run's account of who is missing (default: a
    new one), which the request fills (offline clients, drops, refusals, refused methods) for the
    phases after it."""
    config = outcome.config
    missing = missing if missing is not None else MissingClients(outcome.members, outcome.screen)
    history = outcome.run.read_log(LOG_NAME)
    already = _check_not_unlearned(outcome, history, targets)
    if config.retain:
        check_retained(outcome.store, config.methods)
    # Each request keeps its own outputs: unlearning.csv, then unlearning-2.csv, ...
    request = len(history) + 1
    suffix = "" if not history else f"-{request}"
    excluded = sorted(set(targets) | set(already))
    missing.offline = offline = offline_remaining(grid, outcome, excluded, log)
    missing.key = f"request {request}"
    specs, refused = going_on_without(config.methods, missing, excluded, log)
    specs, refused = without_budget(config, specs, refused, log)
    context = UnlearningContext(
        grid,
        outcome,
        excluded,
        outcome.members.nodes(exclude=[*excluded, *offline]),
        log,
        config.adoption_candidates,
        targets=sorted(targets),
        offline=offline,
    )
    request_journal.begin(outcome.run, request, targets)  # before the request's first file
    _open_stagings(outcome, context, request)
    log(
        f"unlearning client(s) {targets} with {', '.join(config.methods)}; "
        f"{len(context.remaining_nodes)} client(s) remain"
    )
    runner = MethodRunner(outcome.run, log=log, suffix=suffix, flag_divergence=True)
    runner.add("fedavg", outcome.final_state)
    context.costs = runner.costs
    rule = refusal_rule(config, missing, context, runner.refused)
    specs = keep_training_last(specs)
    methods = Progress("unlearning", len(specs), unit="methods", log=log)
    runner.run_all(specs, context, refusal=rule, progress=methods.start())
    for staging in context.staging.values():
        staging.close()
    missing.refused_methods = {**refused, **runner.refused}
    table = _compare(outcome, runner, targets, already, suffix, log, request=request)
    adoption = _adopt_one(outcome, context, table, request, log)
    deleted = retained_blobs_of(outcome.store, targets)
    request_journal.decide(outcome.run)
    outcome.run.append_log(
        LOG_NAME,
        {
            "request": request,
            "suffix": suffix,
            "targets": targets,
            "previously_unlearned": already,
            "methods": config.methods,
            "offline_clients": sorted(offline),
            **_accounted(missing, log),
            "adopted": adoption.method,
            "adoption": adoption.reason,
            "flags": {m: f for m, f in zip(table["method"], table["flag"]) if f},
            "parameters": _parameters(config),
            "seconds": runner.seconds,
            "details": runner.details,
            "deleted_blobs": deleted,
        },
    )
    log(
        f"decided; the {deleted} retained update(s) of client(s) {targets} go with the old "
        f"history at adoption; table {outcome.run.path / f'unlearning{suffix}.csv'}"
    )
    return table


def _open_stagings(outcome, context: UnlearningContext, request: int) -> None:
    """The stores the request's adoption candidates write their trajectories to (a crashed
    attempt's removed first)."""
    if outcome.store is not None:
        discard_stagings(outcome.run, request)
        context.staging = {
            m: open_staging(outcome.run, request, outcome.store, m) for m in context.candidates
        }


def _accounted(missing: MissingClients, log: Log) -> dict:
    """The request's log fields of who was missing (``refused_methods``, ``refused_replies``,
    ``refused_clients``, ``dropped_clients``, ``missing_clients``: whom the phases after it miss),
    said on the console too when there were refusals or drops."""
    account = missing.account()
    del account["refused_phases"]  # the later phases decide, and say, for themselves
    if account["refused_replies"] or account["dropped_clients"]:
        by_client = ", ".join(f"client {p}: {n}" for p, n in account["refused_clients"].items())
        dropped = ", ".join(account["dropped_clients"]) or "none"
        missing_now = ", ".join(map(str, account["missing_clients"])) or "none"
        log(
            f"this request refused {account['refused_replies']} repl(ies) ({by_client}); "
            f"client(s) dropped: {dropped}; missing for the phases that need every client: "
            f"{missing_now}"
        )
    return account


def _compare(outcome, runner: MethodRunner, targets, already, suffix: str, log: Log, *, request):
    """Measure every model, say what each method did and flag the rows that must not read as
    results; publish the table (to TensorBoard and MLflow too when asked: request ``request`` is
    their step) and the figures."""
    config = outcome.config
    excluded = sorted(set(targets) | set(already))
    table, angles, clients = measure(outcome, runner.models, runner.seconds, targets, excluded)
    forgets_attacker = bool(set(config.attack_targets) & set(targets))
    table = with_costs(table, runner, outcome.store)
    table = with_keep_training(table, runner.details)
    table = with_verdicts(table, runner.details, config.flag_gap, forgets_attacker)
    metrics = outcome.run.metrics
    if "test_accuracy" in metrics:
        original = (table["method"] == "fedavg").to_numpy()
        table.loc[original, "flag"] = training_flag(metrics["test_accuracy"])
    runner.publish(
        "unlearning",
        table,
        title=f"unlearning results (every column: unlearning{suffix}.csv)",
        floatfmt=".4f",
        console=console_table,
    )
    _track(outcome, table, request)
    for method, flag in zip(table["method"], table["flag"]):
        if flag:
            log(f"FLAGGED {method}: {flag}; its row is not a result")
    title = (config.dataset, config.num_clients, targets, already)
    _plot_comparison(outcome.run, table, angles, clients, title, suffix)
    return table


def _plot_comparison(run, table, angles, clients, title_of: tuple, suffix: str) -> None:
    """The request's figures (and its per-client table) in the run directory; ``title_of``:
    :func:`~fedunlearn.plots.forgetting_title`'s arguments."""
    from fedunlearn.plots import (  # matplotlib: once a request is compared, not at start
        forgetting_title,
        plot_client_accuracy,
        plot_neuron_angles,
        plot_tradeoff,
        plot_unlearning_comparison,
    )

    title = forgetting_title(*title_of)
    plot_unlearning_comparison(table, run.path / f"unlearning{suffix}.png", title=title)
    plot_tradeoff(table, run.path / f"tradeoff{suffix}.png", title=title)
    if angles:
        plot_neuron_angles(angles, run.path / f"last_layer_angles{suffix}.png", title=title)
    if not clients.empty:
        run.write_table(f"client_accuracy{suffix}", clients, floatfmt=".4f")
        plot_client_accuracy(clients, run.path / f"client_accuracy{suffix}.png", title=title)


def _track(outcome, table: pd.DataFrame, request: int) -> None:
    """The request's comparison, one row per method, to TensorBoard and MLflow when the run
    config asks for them (:mod:`fedunlearn.tracking`)."""
    tracker = open_tracker(outcome.config, outcome.run.path)
    if tracker.active:
        tracker.log_comparison(table.to_dict("records"), request=request)
    tracker.close()


def _adopt_one(outcome, context: UnlearningContext, table, request: int, log: Log) -> Adoption:
    """The candidate the request adopts (:func:`choose_adoption`); the other candidates'
    staging stores are removed. When none may be adopted, every staging store is removed and the
    request is refused before anything is deleted or logged as done."""
    config = outcome.config
    explicit = None if config.unlearn_adopt == "auto" else config.unlearn_adopt
    try:
        adoption = choose_adoption(
            table,
            list(table["flag"]),
            context.candidates,
            explicit=explicit,
            tolerance=config.adopt_tolerance,
        )
    except AdoptionRefused as refused:
        request_journal.abandon(outcome.run)  # its staging stores, and any certificate it wrote
        log(f"adoption refused: {refused.allowed}")
        raise
    discard_stagings(outcome.run, request, keep=adoption.method)
    passed_over = [
        f"{m} was no candidate (its trajectory keeps {', '.join(trajectory_serves(UNLEARNING[m]))} "
        f"only, and a later request must be able to run {', '.join(config.methods)})"
        for m in UNLEARNING.names(adoptable=True)
        if explicit is None and m in config.methods and m not in context.candidates
    ]
    if passed_over:
        adoption = Adoption(adoption.method, "; ".join(passed_over))
    log(f"adopting {adoption.method}'s trajectory as the run's history: {adoption.reason}")
    return adoption


def _check_not_unlearned(outcome: TrainingOutcome, history: list[dict], targets) -> list[int]:
    """The clients earlier requests unlearned; a target among them is refused."""
    already = sorted({t for entry in history for t in entry["targets"]})
    if set(targets) & set(already):
        raise ConfigError(
            "unlearn-clients",
            outcome.config.unlearn_clients,
            f"clients not unlearned before; {sorted(set(targets) & set(already))} "
            f"already were (see {outcome.run.path / LOG_NAME})",
        )
    return already


def _parameters(config) -> dict:
    """The settings a request's log records beside its results."""
    return {
        "calibration_ratio": config.calibration_ratio,
        "calibration_layerwise": config.calibration_layerwise,
        "calibration_order": config.calibration_order,
        "calibration_clients": config.calibration_clients,
        "retain_interval": config.retain_interval,
        "retain_mode": config.retain_mode,
        "strategy": config.strategy,
        "allow_target_participation": config.allow_target_participation,
        "local_epochs": config.local_epochs,
        "rounds": config.rounds,
        "seed": config.seed,
    }


# ---------------------------------------------------------------------- methods
def federaser(context: UnlearningContext, name: str):
    """FedEraser (Algorithm 1): calibrated reconstruction from the retained updates."""
    return _federaser(
        context.grid,
        context.outcome,
        context.history(name),
        context.excluded,
        context.log,
        context.trajectory(name),
        context.offline,
    )


def fedaccum(context: UnlearningContext, name: str):
    """FedAccum (eq. 5): the remaining clients' retained updates, accumulated uncalibrated."""
    reconstruction = accumulate_retained(context.history(name), context.excluded)
    steps = len(reconstruction.steps)
    return reconstruction.model, {
        "steps": steps,
        "did": f"accumulated {steps} retained round(s) uncalibrated; no client work",
    }


def fedretrain(context: UnlearningContext, name: str):
    """FedRetrain: FedAvg from the initial model without the targets (the reference)."""
    return _fedretrain(
        context.grid,
        context.outcome,
        context.remaining_nodes,
        context.log,
        context.trajectory(name),
    )


def _federaser(
    grid,
    outcome: TrainingOutcome,
    store,
    excluded: list[int],
    log: Log,
    trajectory=None,
    offline=(),
):
    """FedEraser over the run's grid; the remaining clients ``offline`` are left out of each
    calibration, as a failed reply is (eq. 2 over the clients there)."""
    config = outcome.config
    offline = frozenset(offline)
    eraser = FedEraser(
        partial(collect_replies, grid, timeout=config.reply_timeout, log=log),
        outcome.members.node_of_partition,
        local_epochs=config.local_epochs,
        calibration_ratio=config.calibration_ratio,
        train_config={k: v for k, v in train_config_record(config).items() if k != "local-epochs"},
        layerwise=config.calibration_layerwise,
        calibration_order=config.calibration_order,
        screen=outcome.screen.training if outcome.screen is not None else None,
        is_dropped=lambda partition: partition in offline or partition in outcome.members.dropped,
        screening=outcome.screen.training_screening if outcome.screen is not None else None,
        top_up=_top_up(config, outcome.members, set(excluded) | offline),
    )
    parameters = {name for name, _ in outcome.new_model().named_parameters()}

    peaks: list[float] = []
    take_interval_peak_rss_bytes()  # each step's peak from here
    steps = Progress("federaser", len(store.rounds()), log=log).start()

    def progress(step):
        peaks.append(megabytes(take_interval_peak_rss_bytes()))
        release_free_memory()  # the step's calibration replies are freed
        kind = "calibrated" if step.calibrated else "first step, uncalibrated"
        log(
            f"federaser: retained round {step.retained_round}, {count(len(step.clients), 'client')}, {kind}"
            f", server peak RSS {peaks[-1]:,.0f} MiB"
        )
        steps.advance()

    reconstruction = eraser.unlearn(
        store, excluded, scaled_keys=parameters, progress=progress, trajectory=trajectory
    )
    steps.finish()  # a retained round without remaining clients is no step
    calibrated = sum(1 for step in reconstruction.steps if step.calibrated)
    topped_up = sum(len(step.topped_up) for step in reconstruction.steps)
    return reconstruction.model, {
        "steps": len(reconstruction.steps),
        "calibrated_rounds": calibrated,
        "calibration_epochs": eraser.calibration_epochs,
        "step_peak_rss_mb": peaks,
        "calibration_updates": sum(len(s.clients) for s in reconstruction.steps if s.calibrated),
        "topped_up_updates": topped_up,
        "did": (
            f"{len(reconstruction.steps)} retained round(s): {calibrated} calibrated "
            f"({eraser.calibration_epochs} epoch(s) each), the first uncalibrated"
            + (
                f"; {topped_up} calibration(s) by non-participants (calibration-clients)"
                if topped_up
                else ""
            )
        ),
    }


def _top_up(config, members, unavailable: set[int]) -> TopUp | None:
    """``calibration-clients`` as a :class:`TopUp` over the remaining clients that can be asked
    (``unavailable``: the targets, earlier ones and those offline; dropped ones are left out)."""
    if config.calibration_clients <= 0:
        return None
    pool = {
        k: n
        for k, n in members.num_examples.items()
        if k not in unavailable and k not in members.dropped
    }
    return TopUp(config.calibration_clients, pool, config.seed)


def _fedretrain(
    grid, outcome: TrainingOutcome, remaining_nodes: list[int], log: Log, trajectory=None
):
    """FedAvg from the initial model without the targets; with ``trajectory`` (a store) it retains
    its own updates at the run's Δt (the history FedRetrain leaves when it is adopted)."""
    config = outcome.config
    # An adopted retraining keeps what the training run kept (every method's retention), so
    # that a later request can run any of the run's methods on the new history.
    policies = run_retention(config) if trajectory is not None else ()
    sampler = round_sampler(outcome.members, config, "fedretrain")
    strategy = participant_strategy(
        config,
        remaining_nodes,
        trajectory,
        policies,
        sampler,
        members=outcome.members,
        phase="fedretrain",
        log=log,
    )
    model = outcome.new_model()
    model.load_state_dict(outcome.initial_state)
    curve: list[float] = []

    def progress(server_round, result, _metrics, replied, round_seconds):
        curve.append(round(float(result.accuracy), 6))
        log(
            f"fedretrain: round {server_round}/{config.rounds}, {count(replied, 'client')}, "
            f"test accuracy {result.accuracy:.4f}, {round_seconds:.1f}s"
        )

    test = outcome.data.splits.test
    state = fedavg_rounds(
        grid,
        strategy,
        model,
        config,
        test=(test.x, test.y),
        on_round=progress,
        screen=outcome.screen,
        phase="fedretrain",
        log=log,
    )
    return state, {
        "rounds": config.rounds,
        "clients": len(remaining_nodes),
        "accuracy_by_round": curve,
        "did": f"retrained {config.rounds} round(s) with {len(remaining_nodes)} client(s)"
        + (f", {config.fraction_train:g} of them a round" if sampler is not None else ""),
    }
