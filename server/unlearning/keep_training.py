"""Keep-training on Flower (:mod:`fedunlearn.unlearning.keep_training`): the remaining clients go on
training the original model with the run's aggregation, for another method's client-epochs in the
same request or for a number of rounds, and the test accuracy and the forgetting signal are
recorded after every round against the client-epochs spent.

Its rounds continue the training run's numbering (round T + 1 onwards: the clients' batches are
those a longer training would have drawn). The target receives nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed
from fedunlearn.training.stacked import member_state
from fedunlearn.unlearning.keep_training import CurvePoint, PlannedRound, round_plan
from server.progress import count
from server.training.rounds import fedavg_rounds, participant_strategy
from server.unlearning.baselines import attack_success, model_accuracy

NAME = "keep-training"


def keep_training(context, name: str):
    """Keep-training: the original model trained on by the remaining clients for the budget of
    ``keep-training-budget`` (a method that ran before it in this request, its client-epochs spent
    exactly: :func:`fedunlearn.unlearning.keep_training.round_plan`) or ``keep-training-rounds``
    rounds; its details hold the ``curve`` (client-epochs, test accuracy, backdoor success) from
    the original (0 client-epochs) to its end, and in a ``stack-models`` run each member's
    (``member_curves``)."""
    outcome, config = context.outcome, context.outcome.config
    plan, budget = _plan(context)
    model = outcome.new_model()
    model.load_state_dict(dict(outcome.final_state))
    state = dict(outcome.final_state)
    curve = [_point(context, state, 0.0, model_accuracy(context, state))]
    members = [_member_points(context, state, 0.0)]
    spent = 0
    for index, planned in enumerate(plan, start=1):
        server_round = config.rounds + index
        state, accuracy = _round(context, name, model, planned, server_round, index, len(plan))
        spent += planned.client_epochs
        curve.append(_point(context, state, float(spent), accuracy))
        members.append(_member_points(context, state, float(spent)))
    stacked = {"member_curves": [list(c) for c in zip(*members)]} if members[0] else {}
    return state, {
        **stacked,
        "did": (
            f"kept training the original model: {len(plan)} round(s), {spent} client-epochs "
            f"({budget}); no unlearning"
        ),
        "rounds": len(plan),
        "budget_method": None if config.keep_training_rounds else config.keep_training_budget,
        "curve": [point.as_dict() for point in curve],
    }


def _plan(context) -> tuple[list[PlannedRound], str]:
    """The rounds to run and what set their budget."""
    config = context.outcome.config
    clients = len(context.remaining_nodes)
    if config.keep_training_rounds:
        plan = [PlannedRound(config.local_epochs, clients)] * config.keep_training_rounds
        return plan, f"keep-training-rounds {config.keep_training_rounds}"
    named = config.keep_training_budget
    cost = getattr(context, "costs", {}).get(named)
    if cost is None:
        raise ConfigError(
            "keep-training-budget",
            named,
            "a method of unlearn-methods that ran before keep-training in this request",
        )
    return round_plan(cost.client_epochs, clients, config.local_epochs), f"{named}'s budget"


def _round(context, name: str, model, planned: PlannedRound, server_round: int, index, total):
    """One planned round: ``planned.clients`` of the remaining clients (all of them, or a seeded
    draw for the last round's remainder) train ``planned.epochs`` each; the new state and its test
    accuracy (the round's own evaluation)."""
    outcome, config, log = context.outcome, context.outcome.config, context.log
    nodes = sorted(context.remaining_nodes)
    if planned.clients < len(nodes):  # node ids are 64-bit: draw positions, not ids
        drawn = _generator(config.seed, server_round).permutation(len(nodes))[: planned.clients]
        nodes = sorted(nodes[int(i)] for i in drawn)

    accuracy = []

    def progress(_round, result, _metrics, replied, seconds):
        accuracy.append(float(result.accuracy))
        log(
            f"{name}: round {index}/{total}, {count(replied, 'client')} x {planned.epochs} "
            f"epoch(s), test accuracy {result.accuracy:.4f}, {seconds:.1f}s"
        )

    test = outcome.data.splits.test
    state = fedavg_rounds(
        context.grid,
        participant_strategy(config, nodes, members=outcome.members, phase=name, log=log),
        model,
        config,
        test=(test.x, test.y),
        on_round=progress,
        rounds=server_round,
        first_round=server_round,
        extra_config={"local-epochs": planned.epochs},
        screen=outcome.screen,
        phase=name,
        log=log,
    )
    return state, accuracy[-1]


def _generator(seed: int, server_round: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, NAME, server_round))


def _point(context, state, client_epochs: float, accuracy: float) -> CurvePoint:
    return CurvePoint(client_epochs, accuracy, attack_success(context, state))


def _member_points(context, state, client_epochs: float) -> list[dict]:
    """In a ``stack-models`` run, each member's point of the curve, measured as its single run
    measures it (:meth:`server.training.rounds.TrainingOutcome.member`); else empty."""
    outcome = context.outcome
    points = []
    for index in range(outcome.config.stack_models):
        member = SimpleNamespace(outcome=outcome.member(index))
        own = member_state(state, index)
        accuracy = model_accuracy(member, own)
        points.append(CurvePoint(client_epochs, accuracy, attack_success(member, own)).as_dict())
    return points
