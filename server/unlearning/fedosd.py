"""FedOSD on Flower (Pan et al., AAAI 2025; the authors' code, github.com/zibinpan/FedOSD): the
math is :mod:`fedunlearn.unlearning.fedosd`; this module asks the clients for gradients at the
model the server holds and takes the server's steps.

* ``fedosd-rounds`` unlearning rounds: the leaving client sends the gradient of the Unlearning
  Cross-Entropy on its data, every remaining client its cross-entropy gradient; the server steps
  along the orthogonal steepest descent direction (no remaining client's loss rises to first
  order), at ``fedosd-lr`` decayed by 0.999 a round (the code's schedule);
* ``post-training-rounds`` rounds without the leaving client: the remaining clients train as in
  a FedAvg round (E_loc epochs) and each update, read as the pseudo-gradient -U_k the code's
  clients send, is projected so as not to undo the unlearning (``non_reverting``) before the
  mean is applied (ours: the code's post-training rate 1e-6 on one epoch's pseudo-gradient left
  the model where the unlearning rounds put it).

A gradient travels as a ``train`` reply whose model is M - g (the client's objective takes one
step of size 1 along its exact full-data gradient), so the reply screen checks it like any other.
The leaving client receives nothing after the unlearning rounds. In a judge run each member of
the stack is its own model: every direction is computed member by member.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from fedunlearn.registry import UNLEARNING
from fedunlearn.training.stacked import member_groups
from fedunlearn.unlearning.fedosd import learning_rate, post_training_step, unlearning_step
from server.unlearning.participation import client_requests, target_requests


def fedosd(context, name: str):
    """FedOSD: unlearning rounds along the orthogonal steepest descent, then post-training that
    does not revert them; see the module docstring."""
    outcome, config = context.outcome, context.outcome.config
    original = dict(outcome.final_state)
    parameters = [key for key, _ in outcome.new_model().named_parameters()]
    spec = UNLEARNING[name]  # its entry names the two client objectives
    leaving = target_requests(
        context, name, epochs=1, extra={"objective": spec.objective("unlearning")}
    )
    remaining = client_requests(
        context, name, epochs=1, extra={"objective": spec.objective("gradient")}
    )
    clients = [k for k in outcome.members.partition_ids if k not in context.excluded]
    state = dict(original)
    for t in range(config.fedosd_rounds):
        g_u = _gradients(leaving(t + 1, state, list(context.targets)), parameters)
        g_r = _gradients(remaining(t + 1, state, clients), parameters)
        if not g_u:
            raise RuntimeError(f"{name}: no leaving client sent its gradient in round {t + 1}")
        lr = learning_rate(t, config.fedosd_lr)
        state = _by_member(
            state,
            lambda s, k, g_u=g_u, g_r=g_r, lr=lr: unlearning_step(s, _of(g_u, k), _of(g_r, k), lr),
        )
    context.log(f"{name}: {config.fedosd_rounds} unlearning round(s); the leaving client is done")
    rounds, training = config.post_training_rounds, client_requests(context, name)
    for t in range(rounds):
        # each client's local training (E_loc epochs) as a pseudo-gradient -U_k with step 1
        g_r = _gradients(training(config.fedosd_rounds + t + 1, state, clients), parameters)
        lr = 1.0
        state = _by_member(
            state,
            lambda s, k, g_r=g_r, lr=lr: post_training_step(
                s, _subset(original, k), _of(g_r, k), lr
            ),
        )
    return state, {
        "did": (
            f"{config.fedosd_rounds} unlearning round(s) along the orthogonal steepest descent, "
            f"then {rounds} non-reverting post-training round(s)"
        ),
        "unlearning_rounds": config.fedosd_rounds,
        "post_training_rounds": rounds,
    }


def _gradients(updates: Mapping[int, Mapping[str, torch.Tensor]], keys) -> list[dict]:
    """Each reply's gradient g = -(M_hat - M) over the parameters ``keys``, in client order."""
    return [{k: -updates[client][k] for k in keys} for client in sorted(updates)]


def _by_member(state: dict, step: Callable[[dict, list[str]], dict]) -> dict:
    """``step(sub-state, keys)`` on each member's keys of a judge stack (the whole state for one
    network), merged back."""
    groups = member_groups(state) or [list(state)]
    merged = dict(state)
    for keys in groups:
        merged.update(step(_subset(state, keys), keys))
    return merged


def _subset(state: Mapping[str, torch.Tensor], keys) -> dict:
    return {k: state[k] for k in keys if k in state}


def _of(gradients: list[dict], keys) -> list[dict]:
    """Each gradient restricted to ``keys`` (one member's parameters)."""
    return [_subset(g, keys) for g in gradients]
