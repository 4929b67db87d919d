"""Crab's recovery: rollback, then update renewal, calibration and model updating.

Jiang, Shen, Liu, Tan, Lam, *Towards Efficient and Certified Recovery from Poisoning Attacks in
Federated Learning* (IEEE TIFS 2025, arXiv 2401.08216); the selection it reads is
:mod:`fedunlearn.unlearning.crab`'s, whose docstring says what follows the authors' code and what
follows the paper's Fig. 1.

Recovery (:func:`crab_recover`), Fig. 1: one *Rollback*, then *Update Renewal*, *Update
Calibration* and *Model Updating* in a loop whose broadcast is the updated model. The rollback goes
to the first kept round t_1 (``crab-rollback = first-kept``; the code has no rule and re-runs every
kept round). From M̃ = M^{t_1}: at t_1 the kept remaining clients' stored updates are aggregated as
they are (the model is M^{t_1}, so they are the updates those clients would compute; the code's
third-party re-implementations do the same); at each later kept round t the kept remaining clients
train E_loc epochs from M̃ (round t's batch order) and each renewed update takes the stored step
size, Ũ_k = ‖U_k^t‖ Û_k / ‖Û_k‖ per tensor (FedEraser's eq. 2, per client; the code calibrates the
clients' unweighted mean), M̃ += Σ_k N_k Ũ_k / Σ_k N_k. No round after the last kept one is trained.
The code differs here: ``adaptive_recover`` restarts every kept round from that round's *stored*
model (lines 324-349), so its result is the original trajectory's model at the last kept round
plus two one-epoch steps of the kept remaining clients (the second calibrated); Fig. 1 loops on
the updated model, and so do we.

``crab-rollback = sensitivity`` is ours (the code has no rollback rule and the paper's text was not
reachable): :func:`rollback_rounds` goes to the latest kept round t* with δ_τ <= β
(``crab-sensitivity-bound``) for every round τ < t*, δ_τ = Σ_{k∈E} ‖N_k U_k^τ‖/ΣN / ‖ΔM^τ‖ an upper
bound (triangle inequality) of the removed clients' share of round τ's global step, from norms the
selector records every round (:func:`~fedunlearn.unlearning.crab.contribution_norms`), never a
removed client's stored update.
With it round 1 is always kept as well (M^1 never saw a client: the rule's last resort).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fedunlearn.config.table import validated_parameters
from fedunlearn.errors import ConfigError
from fedunlearn.training.model_state import State, parameter_groups, state_sum
from fedunlearn.unlearning.crab import copy_influence_record
from fedunlearn.unlearning.federaser import (
    ExactUpdatesFn,
    aggregate_updates,
    apply_scales,
    calibration_scales,
)

#: ``crab-rollback``: the authors' (every kept round re-run from the first) or ours (β).
ROLLBACK_RULES = ("first-kept", "sensitivity")
DEFAULT_SENSITIVITY_BOUND = 0.1


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


# ------------------------------------------------------------------ rollback


def check_rollback_rule(value: object) -> str:
    """``crab-rollback``: one of :data:`ROLLBACK_RULES`."""
    return str(validated_parameters({"crab-rollback": value})["crab-rollback"])


def check_sensitivity_bound(value: object) -> float:
    """β (``crab-sensitivity-bound``): a finite number >= 0."""
    bound = validated_parameters({"crab-sensitivity-bound": value})["crab-sensitivity-bound"]
    if not math.isfinite(bound):
        raise ConfigError("crab-sensitivity-bound", value, "a finite number >= 0.0")
    return float(bound)


def excluded_sensitivities(influence: Mapping, excluded: Collection[int]) -> dict[int, list[float]]:
    """δ_t per group: Σ_{k∈E} ‖N_k U_k^t‖/ΣN over ‖ΔM^t‖, from the selector's ``influence`` (or
    its JSON form); an upper bound of the removed clients' share of round t's global step."""
    out = {}
    for t, raw in influence.items():
        record = copy_influence_record(raw)
        shares = []
        for g, step_norm in enumerate(record["step"]):
            part = sum(record["clients"][k][g] for k in excluded if k in record["clients"])
            shares.append(part / step_norm if step_norm > 0 else (math.inf if part > 0 else 0.0))
        out[int(t)] = shares
    return out


def rollback_rounds(
    retained_rounds: Sequence[int],
    sensitivities: Mapping[int, Sequence[float]],
    bound: float,
    groups: int,
) -> list[int]:
    """Per group, the latest retained round t* with δ_τ <= β for every recorded round τ < t*
    (``crab-rollback = sensitivity``, ours)."""
    bound, starts = check_sensitivity_bound(bound), []
    if any(len(s) != groups for s in sensitivities.values()):
        raise ConfigError("influence", "norms per group", f"{groups} value(s) per round")
    for g in range(groups):
        first = min((t for t, s in sensitivities.items() if s[g] > bound), default=math.inf)
        candidates = [t for t in retained_rounds if t <= first]
        if not candidates:
            raise ValueError(
                f"crab: the removed clients' share of round {first}'s global step exceeds the "
                f"sensitivity bound {bound}, and no retained round precedes it (retained: "
                f"{list(retained_rounds)}): no kept global model is free of their influence"
            )
        starts.append(max(candidates))
    return starts


# ------------------------------------------------------------------ recovery


@dataclass
class CrabStep:
    """One replayed round: its clients and whether they renewed (computed) their updates."""

    round: int
    clients: list[int]
    renewed: bool
    update_norm: float


@dataclass
class CrabRecovery:
    """The recovered model and what the recovery used.

    ``rule`` is the rollback rule (``first-kept``: the authors'); ``rollback_round`` the earliest
    group's rollback round (``rollback_rounds`` per group); ``rounds`` the kept rounds replayed,
    ``rerun_rounds`` those in which clients trained; ``exact_client_rounds`` counts the (round,
    client) updates the clients computed."""

    model: dict[str, torch.Tensor]
    rule: str
    rollback_round: int
    rollback_rounds: list[int]
    rounds: list[int] = field(default_factory=list)
    clients: dict[int, list[int]] = field(default_factory=dict)
    exact_client_rounds: int = 0
    sensitivities: dict[int, list[float]] = field(default_factory=dict)
    steps: list[CrabStep] = field(default_factory=list)

    @property
    def rerun_rounds(self) -> list[int]:
        return [s.round for s in self.steps if s.renewed]


def crab_recover(
    history,
    excluded: Collection[int],
    exact: ExactUpdatesFn,
    *,
    rollback: str = "first-kept",
    sensitivity_bound: float = DEFAULT_SENSITIVITY_BOUND,
    influence: Mapping | None = None,
    layerwise: bool = True,
    groups: Sequence[Sequence[str]] | None = None,
    progress: Callable[[CrabStep], None] | None = None,
) -> CrabRecovery:
    """Crab's recovery (Fig. 1): rollback, then update renewal, calibration and model updating over
    the kept rounds after it, without the ``excluded`` clients.

    ``history`` has the :class:`~fedunlearn.store.update_store.UpdateStore` read API and holds what
    the selector kept. ``rollback``: ``first-kept`` (the authors': every kept round is replayed
    from the first) or ``sensitivity`` (ours: :func:`rollback_rounds` with ``sensitivity_bound``
    on ``influence``, the selector's :attr:`CrabSelector.influence`; without it, the first kept
    round). For each kept round t >= t* in order, the remaining kept clients of t: at a group's
    rollback round their stored updates (the model is M^t: no client computes); later
    ``exact(t, M̃, clients)`` calibrated to Ũ_k = ‖U_k^t‖ Û_k / ‖Û_k‖ (per tensor when
    ``layerwise``, else per group); M̃ += Σ_k N_k Ũ_k / Σ_k N_k. A removed client is never asked and
    its stored updates are never read."""
    rule = check_rollback_rule(rollback)
    bound = check_sensitivity_bound(sensitivity_bound)
    excluded = {int(k) for k in excluded}
    rounds = list(history.rounds())
    if not rounds:
        raise ConfigError("history", history, "a history with at least one retained round")
    key_groups = parameter_groups(history.read_global(rounds[0]), groups)
    shares: dict[int, list[float]] = {}
    starts = [rounds[0]] * len(key_groups)
    if rule == "sensitivity" and influence is not None:
        shares = excluded_sensitivities(influence, excluded)
        starts = rollback_rounds(rounds, shares, bound, len(key_groups))
    result = CrabRecovery({}, rule, min(starts), starts, sensitivities=shares)
    for t in (r for r in rounds if r >= result.rollback_round):
        step = _replay_round(
            result, history.read_round(t, exclude=excluded), excluded, exact, key_groups, layerwise
        )
        if step is not None and progress is not None:
            progress(step)
    return result


def _replay_round(result: CrabRecovery, retained, excluded, exact, key_groups, layerwise):
    """One kept round of the recovery; returns its step (None when no remaining client was kept)."""
    t, starts = retained.round, result.rollback_rounds
    if t == result.rollback_round:
        result.model = {k: v.detach().clone() for k, v in retained.global_model.items()}
    starting = [g for g, s in enumerate(starts) if s == t]
    renewing = [g for g, s in enumerate(starts) if s < t]
    for g in starting:  # a later group's own rollback: its parameters become M^t's
        result.model.update({k: retained.global_model[k].detach().clone() for k in key_groups[g]})
    clients = sorted(k for k in retained.updates if k not in excluded)
    if not clients:
        return None
    answers: Mapping[int, State] = {}
    if renewing:
        answers = _renew(exact, t, result.model, clients, excluded)
        result.exact_client_rounds += len(clients)
        clients = [k for k in clients if k in answers]
    applied = {
        k: _applied_update(retained, k, answers.get(k), key_groups, starts, layerwise)
        for k in clients
    }
    step = aggregate_updates(applied, retained.num_examples)
    result.model = state_sum(result.model, step)
    result.rounds.append(t)
    result.clients[t] = clients
    record = CrabStep(t, clients, bool(renewing), _norm(step[k] for g in key_groups for k in g))
    result.steps.append(record)
    return record


def _renew(exact: ExactUpdatesFn, t: int, model: State, clients: list[int], excluded: set[int]):
    """Update renewal: the clients' exact updates from the current model, checked."""
    answers = exact(t, {k: v.clone() for k, v in model.items()}, list(clients))
    leaked = set(answers) & excluded
    if leaked:
        raise RuntimeError(
            f"crab: update renewal returned updates of removed clients {sorted(leaked)}"
        )
    if not any(k in answers for k in clients):
        raise RuntimeError(f"crab: no client answered the update renewal of round {t}")
    return answers


def _applied_update(retained, client, answer, key_groups, starts, layerwise) -> dict:
    """Client ``client``'s update for this round, group by group: the stored U_k^t for a group
    rolling back now, the calibrated renewal for a group already replaying, zeros for a group whose
    rollback round is later; other tensors (buffers) from the renewal when there is one."""
    stored = retained.updates[client]
    out = {k: v.detach().clone() for k, v in (answer if answer is not None else stored).items()}
    squares = getattr(retained, "squares", {}).get(client)
    for g, keys in enumerate(key_groups):
        if starts[g] == retained.round:
            out.update({k: stored[k].detach().clone() for k in keys})
        elif starts[g] > retained.round:
            out.update({k: torch.zeros_like(stored[k]) for k in keys})
        else:
            scales = calibration_scales(
                stored, answer, layerwise=layerwise, scaled_keys=keys, retained_squares=squares
            )
            out.update(apply_scales({k: answer[k] for k in keys}, scales))
    return out
