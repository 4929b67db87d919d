"""A stacked comparison (``stack-models`` = N): N federations trained as one stack, every method run
once over the stack, and the single run's comparison measured member by member.

Member i is the run a single federation with ``model-seed`` = :func:`stack_seeds` ``[i]`` trains:
the same split and target, its own initial weights and batch order (the judge's stack,
:mod:`server.audit.judge`). Every method of the run stacks
(:attr:`fedunlearn.method_spec.MethodSpec.stacks`): its model of member i is that single run's,
up to floating-point summation order (``tests/federation/test_stacked_comparison.py``). One run
thus gives the rows of N single runs' ``unlearning.csv`` while paying the federation's start and
per-round costs (messages, Ray, the server's checks and aggregation) once.

``unlearning.csv`` holds every member's rows, ``member`` and ``model_seed`` first, each measured
as :func:`server.unlearning.comparison.measure` measures a single run (keep-training against the
member's own curve). The costs are a member's share: client-epochs as a single run counts them
(one message trains every member), megabytes exchanged and retained divided by N; ``seconds``
is the stack's, for all N. ``stack.json`` names the members' seeds. Then the target's retained
updates are deleted, as after any request; the run's history is not replaced (no adoption).
"""

from __future__ import annotations

import time

import pandas as pd
from flwr.serverapp import Grid

from fedunlearn.config import ExperimentConfig
from fedunlearn.console_table import console_table
from fedunlearn.progress import Progress
from fedunlearn.registry import UNLEARNING, retention_policies
from fedunlearn.store.history import forget_clients
from fedunlearn.training.stacked import member_state
from server.method_runner import MethodRunner
from server.progress import Log
from server.training.original import train_federated
from server.training.rounds import TrainingOutcome, stack_seeds
from server.unlearning.comparison import measure, with_costs, with_keep_training, with_verdicts
from server.unlearning.going_on import keep_training_last
from server.unlearning.request import UnlearningContext

#: The cost columns a single run's table gives per run: a stack exchanges and keeps N models.
_SHARED_MB = ("communication_mb", "retained_mb")


def run_stacked_comparison(
    grid: Grid, config: ExperimentConfig, *, log: Log = print
) -> pd.DataFrame:
    """Train N federations as one stack, forget ``unlearn-clients`` with every method over the
    stack, and write every member's comparison (``unlearning.csv/.md``) and ``stack.json``."""
    started = time.perf_counter()
    outcome = train_federated(grid, config, log=log)
    training_seconds = time.perf_counter() - started
    targets = config.unlearn_targets
    remaining = outcome.members.nodes(exclude=targets)
    log(f"stack: forgetting client(s) {targets} in {config.stack_models} federations")
    context = UnlearningContext(
        grid, outcome, targets, remaining, log, candidates=[], targets=sorted(targets)
    )
    runner = MethodRunner(outcome.run, log=log, label="stack ", flag_divergence=True)
    runner.add("fedavg", outcome.final_state)
    context.costs = runner.costs  # keep-training spends another method's client-epochs
    specs = keep_training_last([UNLEARNING[name] for name in config.methods])
    runner.run_all(specs, context, progress=Progress("unlearning", len(specs), log=log).start())
    tables = [member_table(outcome, runner, targets, i) for i in range(config.stack_models)]
    table = pd.concat(tables, ignore_index=True)
    runner.publish(
        "unlearning",
        table,
        title=f"{config.stack_models} federations, member by member (every column: unlearning.csv)",
        floatfmt=".4f",
        console=console_table,
    )
    deleted = forget_clients(outcome.store, targets, retention_policies())
    outcome.run.write_json(
        "stack.json",
        {
            "members": config.stack_models,
            "model_seeds": stack_seeds(config),
            "training_seconds": training_seconds,
            "seconds": time.perf_counter() - started,
            "deleted_blobs": deleted,
        },
    )
    log(f"stack: deleted {deleted} retained update(s) of client(s) {targets}")
    log(f"results in {outcome.run.path}")
    return table


def member_table(
    outcome: TrainingOutcome, runner: MethodRunner, targets: list[int], member: int
) -> pd.DataFrame:
    """Member ``member``'s comparison, as its single run's ``unlearning.csv`` measures it."""
    single = outcome.member(member)
    models = {method: member_state(state, member) for method, state in runner.models.items()}
    details = member_details(runner.details, member)
    table, _, _ = measure(single, models, runner.seconds, targets)
    table = with_costs(table, runner, outcome.store)
    for column in _SHARED_MB:
        table[column] = table[column] / outcome.config.stack_models
    table = with_keep_training(table, details)
    forgets_attacker = bool(set(single.config.attack_targets) & set(targets))
    table = with_verdicts(table, details, single.config.flag_gap, forgets_attacker)
    table.insert(0, "model_seed", single.config.model_seed)
    table.insert(0, "member", member)
    return table


def member_details(details: dict, member: int) -> dict:
    """Each method's details as member ``member``'s single run has them: keep-training's curve is
    the member's own (``member_curves``)."""
    own = {}
    for method, detail in details.items():
        curves = detail.get("member_curves") if isinstance(detail, dict) else None
        own[method] = {**detail, "curve": curves[member]} if curves else detail
    return own
