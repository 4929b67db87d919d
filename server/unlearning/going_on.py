"""Which of an unlearning request's methods go on, and which are refused for the request.

A method that messages the remaining clients and has no rule for one that cannot be asked
(``MethodSpec.offline`` false) needs every remaining client. It is refused, naming the clients and
their nodes, when one is offline at the request (after the request waited ``reply-timeout``) or
dropped from the run (in training, or in an earlier method of the request): the account of who is
missing is :class:`server.federation.missing.MissingClients`. The rule is asked before each method
(:func:`refusal_rule`), so a client dropped by FedEraser's calibration refuses a later FedRecover;
a method that cannot go on with the replies it got is refused when it stops
(:class:`server.method_runner.MethodRunner`). Keep-training, which spends another method's
client-epochs, is refused with that method.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from fedunlearn.registry import UNLEARNING
from server.federation.availability import await_clients
from server.federation.missing import MissingClients
from server.progress import Log
from server.unlearning.comparison import KEEP_TRAINING


def keep_training_last(specs: list) -> list:
    """``specs`` with keep-training moved last: it spends the budget of a method of the same
    request, which must have run."""
    return [s for s in specs if s.name != KEEP_TRAINING] + [
        s for s in specs if s.name == KEEP_TRAINING
    ]


def budget_refused(config, refused: Collection[str]) -> str | None:
    """Why keep-training is refused when the method whose client-epochs it spends was."""
    named = config.keep_training_budget
    if config.keep_training_rounds or named not in refused:
        return None
    return f"its budget is {named}'s client-epochs, and {named} was refused"


def without_budget(config, specs: list, refused: dict, log: Log) -> tuple[list, dict]:
    """Keep-training refused too when the method whose client-epochs it spends was refused."""
    why = budget_refused(config, refused)
    if why is None or KEEP_TRAINING not in config.methods:
        return specs, refused
    log(f"{KEEP_TRAINING} refused for this request: {why}")
    return [s for s in specs if s.name != KEEP_TRAINING], {**refused, KEEP_TRAINING: why}


def offline_remaining(grid, outcome, excluded, log: Log) -> dict:
    """The remaining clients still offline after the request waited ``reply-timeout`` for them
    (:func:`server.federation.availability.await_clients`): partition -> node, None for a client
    whose node did not connect to this run's discovery (an ``unlearn-only`` request)."""
    members = outcome.members
    remaining = {
        p: members.node_of_partition.get(p)
        for p in range(outcome.config.num_clients)
        if p not in excluded and p not in members.dropped
    }
    what = "unlearning request"
    wait = outcome.config.reply_timeout
    return await_clients(grid.get_node_ids, remaining, wait, what=what, log=log)


def going_on_without(
    methods: list[str], missing: MissingClients, excluded: Collection[int], log: Log
) -> tuple[list, dict[str, str]]:
    """(the methods that run, {method: why refused}): with remaining clients offline or dropped,
    a method that messages them runs only when it goes on with those there
    (``MethodSpec.offline``: FedEraser calibrates with them, FedRetrain trains them)."""
    specs = [UNLEARNING[name] for name in methods]
    causes = missing.causes(excluded, refused=False)
    if not causes:
        return specs, {}
    refused = {s.name: why for s in specs if (why := missing.refuses_method(s, excluded))}
    going = [s.name for s in specs if s.name not in refused]
    log(f"{missing.describe(causes)}; going on without them: {', '.join(going) or 'no method'}")
    for name, why in refused.items():
        log(f"{name} refused for this request: {why}")
    return [s for s in specs if s.name not in refused], refused


def refusal_rule(config, missing: MissingClients, context, refused: dict[str, str]) -> Callable:
    """``refusal(spec)`` for :meth:`server.method_runner.MethodRunner.run_all`: why ``spec`` is
    refused as it is about to run (clients dropped by an earlier method; keep-training's budget
    method refused: ``refused``, the runner's, read live), or None. Before each method the
    clients dropped so far leave ``context.remaining_nodes``: a method that goes on with the
    clients there trains, and counts, those left."""

    def refusal(spec) -> str | None:
        members = context.outcome.members
        context.remaining_nodes = [
            n for n in context.remaining_nodes if members.partition_of(n) not in members.dropped
        ]
        budget = budget_refused(config, refused) if spec.name == KEEP_TRAINING else None
        return budget or missing.refuses_method(spec, context.excluded)

    return refusal
