"""The field's baselines on Flower (the methods the field compares against): rapid
retraining, PGA, FedQUIT and FedAU; FedOSD in :mod:`server.unlearning.fedosd`. Their math is
Flower-free in :mod:`fedunlearn.unlearning`; this module moves models between the server and the
clients and reads what training kept.

Every retraining here runs the run's own aggregation (``strategy``) over the remaining clients, with a
server-side evaluation after each round (``accuracy_by_round`` in the method's details: how fast it
gets where FedRetrain gets). PGA and FedQUIT ask the leaving client for its step first
(:func:`server.unlearning.participation.target_requests`); after that step it receives nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fedunlearn.data.federated_data import validation_samples
from fedunlearn.data.poisoning import poisoning_success_rate
from fedunlearn.registry import UNLEARNING
from fedunlearn.seeding import derive_seed
from fedunlearn.store.history import load_policy
from fedunlearn.training.local import resolve_device
from fedunlearn.training.model_state import state_sum
from fedunlearn.unlearning.fedau import AuxiliaryHeads, fedau_unlearn, split_head
from fedunlearn.unlearning.pga import (
    parameter_distance,
    reference_model,
    stop_distance,
    validation_threshold,
)
from server.progress import count
from server.training.rounds import (
    DivergedRound,
    evaluate_run_model,
    fedavg_rounds,
    participant_strategy,
)
from server.unlearning.participation import (
    mean_model,
    target_requests,
    target_updates,
    targets_model,
)


def rounds_from(
    context,
    name: str,
    start: Mapping[str, torch.Tensor],
    rounds: int,
    *,
    extra: Mapping[str, int | float | str] | None = None,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``rounds`` rounds of the run's aggregation from ``start`` by the remaining clients (each
    training message also carries ``extra``); returns the model and its test accuracy after each
    round."""
    outcome, config, log = context.outcome, context.outcome.config, context.log
    model = outcome.new_model()
    model.load_state_dict(dict(start))
    curve: list[float] = []
    if rounds == 0:
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, curve

    def progress(server_round, result, _metrics, replied, seconds):
        curve.append(round(float(result.accuracy), 6))
        log(
            f"{name}: round {server_round}/{rounds}, {count(replied, 'client')}, "
            f"test accuracy {result.accuracy:.4f}, {seconds:.1f}s"
        )

    test = outcome.data.splits.test
    state = fedavg_rounds(
        context.grid,
        participant_strategy(
            config, context.remaining_nodes, members=outcome.members, phase=name, log=log
        ),
        model,
        config,
        test=(test.x, test.y),
        on_round=progress,
        rounds=rounds,
        extra_config=extra,
        screen=outcome.screen,
        phase=name,
        log=log,
    )
    return state, curve


def rapid_retraining(context, name: str):
    """Rapid retraining (Liu et al., INFOCOM 2022): FedAvg from the initial model by the remaining
    clients, each client's local optimiser a diagonal-Fisher quasi-Newton step
    (:mod:`fedunlearn.unlearning.rapid_retraining`), for ``rapid-rounds`` rounds."""
    config = context.outcome.config
    rounds = config.rapid_rounds or config.rounds
    extra = {
        "objective": UNLEARNING[name].objective(),
        "rapid-lr": config.rapid_lr,
        "rapid-damping": config.rapid_damping,
    }
    state, curve = rounds_from(context, name, context.outcome.initial_state, rounds, extra=extra)
    clients = len(context.remaining_nodes)
    return state, {
        "did": f"retrained {rounds} round(s) with {clients} client(s), diagonal-Fisher steps",
        "rounds": rounds,
        "accuracy_by_round": curve,
    }


def fedau(context, name: str):
    """FedAU (Gu et al., IJCAI 2024): the final model's head, linearly combined with the
    auxiliary heads the targets trained after the last round (``W_u = (1 - alpha) W + alpha
    mean_k W_a^k``, :func:`fedunlearn.unlearning.fedau.fedau_unlearn`); no client computes
    anything at request time. None (no row) when a target left no auxiliary head."""
    outcome, config = context.outcome, context.outcome.config
    policy = load_policy(outcome.store, AuxiliaryHeads, method=name)
    missing = [k for k in context.targets if k not in policy.heads]
    if missing:
        context.log(f"{name}: no auxiliary head kept for client(s) {missing}; not run")
        return None
    state = dict(outcome.final_state)
    for member, prefix in enumerate(_head_prefixes(state)):
        shape = state[f"{prefix}.weight"].shape
        kept = {k: split_head(policy.heads[k], shape, member) for k in context.targets}
        state = fedau_unlearn(state, kept, context.targets, alpha=config.fedau_alpha, head=prefix)
    return state, {
        "did": (
            f"combined the head with client(s) {context.targets}' auxiliary head(s), "
            f"alpha {config.fedau_alpha:g}; no client work"
        ),
        "alpha": config.fedau_alpha,
    }


def _head_prefixes(state: Mapping[str, torch.Tensor]) -> list[str]:
    """``["head"]``, or a judge stack's ``["members.0.head", ...]`` in member order."""
    if "head.weight" in state:
        return ["head"]
    members = sorted(int(key.split(".")[1]) for key in state if key.endswith(".head.weight"))
    return [f"members.{i}.head" for i in members]


def fedquit(context, name: str):
    """FedQUIT (Mora et al. 2024): each leaving client distils the final model from its
    quasi-competent virtual teacher on its own data (``fedquit-epochs`` of Adam at ``fedquit-lr``;
    several targets: the mean of their models, ours), then ``post-training-rounds`` rounds of the
    run's aggregation by the remaining clients. The target receives nothing after its step."""
    config = context.outcome.config
    extra = {"objective": UNLEARNING[name].objective(), "fedquit-lr": config.fedquit_lr}
    requests = target_requests(context, name, epochs=config.fedquit_epochs, extra=extra)
    unlearned, replied = targets_model(context, requests, context.outcome.final_state)
    did = f"client(s) {replied} distilled {config.fedquit_epochs} epoch(s) from the virtual teacher"
    return post_trained(context, name, unlearned, did)


def post_trained(context, name: str, unlearned, did: str):
    """The model after the leaving clients' step (``did`` says what it was), post-trained for
    ``post-training-rounds`` rounds by the remaining clients; with the method's details (its test
    accuracy before and after each post-training round)."""
    accuracy, attack = model_accuracy(context, unlearned), attack_success(context, unlearned)
    attacked = "" if math.isnan(attack) else f", attack success {attack:.4f}"
    context.log(f"{name}: {did}; test accuracy {accuracy:.4f}{attacked} before post-training")
    before = {"accuracy_after_unlearning": accuracy}
    if not math.isnan(attack):  # post-training may bring a removed backdoor back
        before["attack_success_after_unlearning"] = attack
    rounds = context.outcome.config.post_training_rounds
    try:
        state, curve = rounds_from(context, name, unlearned, rounds)
    except DivergedRound as diverged:
        # the unlearned model broke the remaining clients' training: its row, flagged, not a crash
        context.log(f"{name}: {diverged}; its row is the model before post-training, flagged")
        return unlearned, {
            "did": f"{did}; post-training diverged",
            "diverged": str(diverged),
            **before,
        }
    return state, {
        "did": f"{did}, then {rounds} post-training round(s)",
        **before,
        "accuracy_by_round": curve,
    }


def attack_success(context, state) -> float:
    """The backdoor's success on ``state`` (NaN without a data-poisoning attack; a judge stack's
    models are not measured here)."""
    outcome = context.outcome
    attack = getattr(outcome.data, "attack", None)
    if attack is None or not any(k.startswith("head.") for k in state):
        return math.nan
    model = outcome.new_model()
    model.load_state_dict(dict(state))
    device = resolve_device(outcome.config.device)
    return poisoning_success_rate(model, attack, outcome.data.splits.test, device=device)


def model_accuracy(context, state, samples=None) -> float:
    """The accuracy of ``state`` (a stack's: its members' mean) on ``samples`` (inputs, labels;
    default: the test set)."""
    outcome = context.outcome
    device = resolve_device(outcome.config.device)
    model = outcome.new_model().to(device)
    model.load_state_dict(dict(state))
    test = outcome.data.splits.test
    x, y = samples if samples is not None else (test.x, test.y)
    return float(evaluate_run_model(model, x, y, device=device).accuracy)


def pga(context, name: str):
    """PGA (Halimi et al. 2022): the reference model w_ref, the mean of the other clients' models
    of the last training round (its policy keeps that round); each leaving client runs projected
    gradient ascent from w_ref within the ball around it (``pga-epochs`` at ``pga-lr``), stopped
    by ``pga-stop``: the paper's rule, at the first step whose accuracy on the server's validation
    samples (:func:`fedunlearn.data.federated_data.validation_samples`, sent with the request) is
    below w_ref's minus ``pga-stop-margin`` points; the authors' code's, once its squared distance
    to its own last model passes ``pga-stop-distance``; or ours, ``pga-stop-ratio`` times where
    it started; then ``post-training-rounds`` rounds of the run's aggregation by the remaining
    clients."""
    config, history = context.outcome.config, context.history(name)
    last = history.rounds()[-1]
    start = history.read_global(last)
    updates = {k: history.read_update(last, k) for k in history.clients(last)}
    reference = reference_model(start, updates, history.num_examples(last), context.excluded)
    extra = {
        "objective": UNLEARNING[name].objective(),
        "pga-lr": config.pga_lr,
        "pga-stop": config.pga_stop,
        "pga-stop-margin": config.pga_stop_margin,
        "pga-stop-distance": config.pga_stop_distance,
        "pga-stop-ratio": config.pga_stop_ratio,
    }
    validation = _validation(context) if config.pga_stop == "validation" else None
    shared = {} if validation is None else {"validation": {"x": validation[0], "y": validation[1]}}
    requests = target_requests(context, name, epochs=config.pga_epochs, extra=extra)
    # each target's anchor: its own model of the last round, M^{T-1} + U_k (the code's stop rule)
    anchors = {k: state_sum(start, updates[k]) for k in context.targets if k in updates}
    ascended = target_updates(context, requests, reference, anchors=anchors, shared=shared)
    did = (
        f"reference of round {last}'s other clients; client(s) {sorted(ascended)} ascended up to "
        f"{config.pga_epochs} epoch(s) in its ball, {config.pga_stop} stop"
    )
    ascent = _ascent(context, reference, ascended, anchors, validation)
    state, details = post_trained(context, name, mean_model(context, reference, ascended), did)
    return state, {**details, "ascent": ascent}


def _validation(context) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's validation samples for PGA's paper stop (``pga-validation-samples`` of them;
    where they come from is logged)."""
    config = context.outcome.config
    seed = derive_seed(config.seed, "pga-validation")
    samples, source = validation_samples(context.outcome.data, config.pga_validation_samples, seed)
    context.log(f"pga: {len(samples.x)} validation samples ({source}) sent with the ascent request")
    return samples.x, samples.y


def _ascent(context, reference, ascended, anchors, validation=None) -> dict[int, dict[str, float]]:
    """How far each target's ascent went, over the model's parameters (the client's distances):
    ``moved`` ‖w_k − w_ref‖, and the squared distance to its own last model before
    (``start_distance2``) and after (``end_distance2``); with the paper's stop, the validation
    accuracy of w_ref (``reference_validation_accuracy``), tau and the ascended model's
    (``validation_accuracy``: below tau when the rule stopped it). A distance stop that leaves no
    room is said in the log (the authors' 2.2 is for their MNIST network)."""
    config = context.outcome.config
    keys = [k for k, _ in context.outcome.new_model().named_parameters()]
    out = {}
    for k, update in sorted(ascended.items()):
        unlearned = state_sum(reference, update)
        row = {"moved": parameter_distance(unlearned, reference, keys)}
        if validation is not None:
            before = model_accuracy(context, reference, validation)
            row["reference_validation_accuracy"] = before
            row["tau"] = validation_threshold(before, config.pga_stop_margin)
            row["validation_accuracy"] = model_accuracy(context, unlearned, validation)
        if k in anchors:
            row["start_distance2"] = parameter_distance(reference, anchors[k], keys) ** 2
            row["end_distance2"] = parameter_distance(unlearned, anchors[k], keys) ** 2
            if config.pga_stop != "validation":
                row["stop_distance2"] = stop_distance(
                    row["start_distance2"],
                    config.pga_stop_distance,
                    config.pga_stop_ratio if config.pga_stop == "ratio" else 0.0,
                )
                _say_no_room(context, k, row)
        out[k] = {key: round(value, 6) for key, value in row.items()}
    return out


def _say_no_room(context, client: int, row: dict) -> None:
    """A distance stop already passed where the ascent starts, said in the log."""
    if 0 < row["stop_distance2"] <= row["start_distance2"]:
        context.log(
            f"pga: client {client}'s reference is already {row['start_distance2']:.3g} (squared) "
            f"from its own model, past the stop at {row['stop_distance2']:.3g}: its ascent "
            "stopped at the first step; raise pga-stop-distance or use pga-stop = validation"
        )
