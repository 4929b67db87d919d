"""FedRecover: retrain without removed clients, estimating the remaining clients' updates.

Cao, Jia, Zhang & Gong, *FedRecover: Recovering from Poisoning Attacks in Federated Learning using
Historical Information* (IEEE S&P 2023), Section IV. The server retained, in every round t of the
original training, the global model M^t (M̄_t in the paper) and every client's update U_k^t (ḡ_t^i).
The recovery starts again from the initial model M̂^1 = M^1, which no client has touched, and runs
the same rounds with the clients of each round minus the removed ones. A client's update in round
t is, by the integral mean value theorem (Sec. IV-B),

    U_k(M̂^t) = U_k^t + J_k^t (M̂^t − M^t),   J_k^t = ∫₀¹ ∂U_k/∂M (M^t + z(M̂^t − M^t)) dz,

and the server estimates it with an L-BFGS approximation of the integrated Jacobian built from the
client's last s pairs (Δw, Δg) of rounds in which it computed its exact update
(:func:`fedunlearn.unlearning.lbfgs.lbfgs_hvp`, the paper's Algorithm 1).

Sign convention. The paper's updates are gradients (the server steps w − η·g), so its integrated
Hessian is positive definite for a convex loss. Our updates are model deltas, U = M_k − M ≈ −η Σ∇L,
whose Jacobian is negative definite (U = ((I − ηA)^E − I) M + c for E full-batch steps on a
quadratic of Hessian A). We therefore build the L-BFGS matrix P̃ ≈ −J from the pairs

    Δw = M̂^t − M^t,   Δg = U_k^t − U_k(M̂^t)   (stored minus exact: Δwᵀ Δg > 0 when convex),

and estimate Û_k^t = U_k^t − P̃_k (M̂^t − M^t).

Exact updates (the client trains; :data:`ExactUpdatesFn`) are asked for (Sec. IV-C):

* warm-up: the first T_w rounds;
* periodic correction: every T_c-th round after the warm-up;
* final tuning: the last T_f rounds;
* abnormality fixing: in any other round, from a client whose estimate has a coordinate of
  absolute value above τ. τ comes from the history: τ_t is the smallest value that at most a
  fraction α (the tolerance rate) of the coordinates of round t's original updates (the remaining
  clients', pooled) exceed in absolute value, and τ = max_t τ_t (:func:`abnormality_thresholds`).

Ours, not the paper's, on by default: a divergence guard (:mod:`fedunlearn.unlearning.
divergence_guard`) redoes with exact updates an estimated round whose aggregated step, or whose
server-side loss, leaves the range the exact rounds set, and refuses exact replies far larger than
any retained update. ``guard=None`` gives the paper's recovery.

Every exact update pushes the pair (Δw, Δg) into that client's buffer (its last s pairs). The paper
keeps one ΔW buffer for all clients (refreshed only when every client computed) beside per-client
ΔG buffers; we keep both per client so that each Δg is paired with the Δw of its own round.

A stack of models (``members.<i>.…`` keys, the judge's) is a list of groups of keys handled as
independent models: each group has its own vectors, buffers and τ. An exact update, once paid for,
serves every group. Tensors outside the groups (integer buffers) come from the update used, stored
or exact, as FedAvg would aggregate them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from fedunlearn.errors import ConfigError, TooFewReplies
from fedunlearn.store.retention import RetentionPolicy, Selection
from fedunlearn.training.model_state import State, parameter_groups, state_norm, state_sum
from fedunlearn.unlearning.divergence_guard import DivergenceGuard, GuardRanges
from fedunlearn.unlearning.federaser import ExactUpdatesFn, aggregate_updates
from fedunlearn.unlearning.fedrecover_schedule import (  # noqa: F401 (re-exported)
    FedRecoverSchedule,
    HistoryScales,
    abnormality_thresholds,
    flat,
    history_scales,
    remaining,
    tolerance_threshold,
)
from fedunlearn.unlearning.lbfgs import lbfgs_hvp

#: How a recovery round got its updates (:attr:`FedRecoverStep.kind`).
EXACT, ESTIMATED, GUARDED = "exact", "estimated", "guarded"


@dataclass
class FedRecoverStep:
    """One recovery round: who took part, who computed exactly, and why.

    ``kind`` is ``"exact"`` (scheduled: warm-up, correction, final tuning), ``"estimated"`` or
    ``"guarded"`` (estimated, then redone exactly by the guard for ``reason``); ``refused`` lists
    the clients whose exact reply the guard refused (left out of the round); ``missing`` those
    whose exact update never came (refused by the reply screen or silent): estimated in a
    scheduled exact round when their L-BFGS buffers allow, else left out of the round."""

    round: int
    clients: list[int]
    exact: list[int]
    fixed: list[int]
    update_norm: float
    kind: str = EXACT
    reason: str | None = None
    refused: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)


class NotEnoughReplies(TooFewReplies):
    """Fewer usable exact updates in a round than ``min-reply-fraction`` of its clients."""


@dataclass
class Recovery:
    """The recovered model and what it cost the clients.

    ``exact_client_rounds`` counts the (round, client) exact updates asked for (the server turns
    it into client-epochs); ``exact_rounds``, ``estimated_rounds`` and ``guarded`` (round ->
    the guard's reason) say how each round got its updates; ``fixed`` maps a round to the clients
    abnormality fixing asked, ``refused`` to the clients whose exact replies the guard refused,
    ``missing`` to those whose exact update never came, ``unpaired`` to the clients of an
    estimated round that had no pair yet and computed exactly (sampled rounds); ``thresholds``
    is τ per group."""

    model: dict[str, torch.Tensor]
    exact_rounds: list[int] = field(default_factory=list)
    estimated_rounds: list[int] = field(default_factory=list)
    guarded: dict[int, str] = field(default_factory=dict)
    exact_client_rounds: int = 0
    fixed: dict[int, list[int]] = field(default_factory=dict)
    refused: dict[int, list[int]] = field(default_factory=dict)
    missing: dict[int, list[int]] = field(default_factory=dict)
    unpaired: dict[int, list[int]] = field(default_factory=dict)
    steps: list[FedRecoverStep] = field(default_factory=list)
    thresholds: list[float] = field(default_factory=list)


def _with_vector(update: State, keys: Sequence[str], vector: torch.Tensor) -> dict:
    """``update`` with the tensors of ``keys`` read back from ``vector`` (in their dtypes)."""
    out = dict(update)
    offset = 0
    for key in keys:
        size = update[key].numel()
        chunk = vector[offset : offset + size].reshape(update[key].shape)
        out[key] = chunk.to(update[key].dtype)
        offset += size
    return out


def _consecutive_rounds(history) -> list[int]:
    rounds = list(history.rounds())
    if not rounds or rounds != list(range(rounds[0], rounds[0] + len(rounds))):
        raise ConfigError(
            "history",
            rounds,
            "every round's global model and client updates, rounds consecutive (retain interval 1)",
        )
    return rounds


#: A client's L-BFGS buffers: per group, its last s pairs (Δw, Δg), oldest first.
ClientBuffers = list[deque]


def _estimate(
    stored: State, shifts: Sequence[torch.Tensor], groups, buffers: ClientBuffers | None
) -> dict:
    """Û_k^t = U_k^t − P̃_k (M̂^t − M^t) per group (Sec. IV-B with our sign convention); the
    stored update itself where the client has no pair yet (no correction)."""
    estimate = dict(stored)
    for g, keys in enumerate(groups):
        pairs = buffers[g] if buffers is not None else ()
        if not pairs:
            continue
        correction = lbfgs_hvp([s for s, _ in pairs], [y for _, y in pairs], shifts[g])
        estimate = _with_vector(estimate, keys, flat(stored, keys) - correction)
    return estimate


def _abnormal(update: State, groups, thresholds: Sequence[float]) -> bool:
    """Some coordinate of some group above its τ; a non-finite estimate always is."""
    return any(
        not float(flat(update, keys).abs().max()) <= tau for keys, tau in zip(groups, thresholds)
    )


def _group_norms(state: State, groups) -> list[float]:
    return [float(flat(state, keys).norm()) for keys in groups]


def _push(buffers: dict[int, ClientBuffers], client, shifts, stored, exact_update, groups, size):
    """Append (Δw, Δg) = (M̂^t − M^t, U_k^t − U_k(M̂^t)) to each of the client's group buffers."""
    if client not in buffers:
        buffers[client] = [deque(maxlen=size) for _ in groups]
    for g, keys in enumerate(groups):
        change = flat(stored, keys) - flat(exact_update, keys)
        buffers[client][g].append((shifts[g], change.float()))


@dataclass
class _Recovering:
    """The state a recovery carries from round to round."""

    history: object
    exact: ExactUpdatesFn
    excluded: set[int]
    groups: list[list[str]]
    buffer_size: int
    recovery: Recovery
    ranges: GuardRanges | None
    loss: Callable[[State], float] | None
    buffers: dict[int, ClientBuffers] = field(default_factory=dict)
    current_loss: float | None = None
    min_reply_fraction: float = 1.0

    def ask(self, t: int, model: State, clients: list[int]) -> dict:
        """The exact updates from ``model`` in round ``t`` of those of ``clients`` that sent a
        usable one, checked and counted; the others are recorded as ``missing`` (the round decides
        what to do without them)."""
        answers = self.exact(t, {k: v.clone() for k, v in model.items()}, list(clients))
        leaked = set(answers) & self.excluded
        if leaked:
            raise RuntimeError(
                f"exact updates of round {t} came from removed clients {sorted(leaked)}"
            )
        for k in clients:
            if k in answers and set(answers[k]) != set(model):
                raise ValueError(
                    f"client {k}'s exact update of round {t} holds tensors {sorted(answers[k])}, "
                    f"the model {sorted(model)}"
                )
        self.recovery.exact_client_rounds += len(clients)
        missing = [k for k in clients if k not in answers]
        if missing:
            self.recovery.missing.setdefault(t, []).extend(missing)
        return {k: answers[k] for k in clients if k in answers}

    def check_enough(self, t: int, clients: list[int], used: dict) -> None:
        """At least ``min_reply_fraction`` of the round's clients have an update to average."""
        needed = max(1, math.ceil(self.min_reply_fraction * len(clients) - 1e-9))
        if len([k for k in clients if k in used]) < needed:
            missing = self.recovery.missing.get(t, [])
            raise NotEnoughReplies(
                f"FedRecover round {t}: {len(clients) - len(missing)} of {len(clients)} clients "
                f"sent a usable exact update (none from clients {missing}), fewer than "
                f"min-reply-fraction={self.min_reply_fraction:g} requires ({needed})"
            )

    def evaluate(self, model: State) -> float | None:
        return None if self.loss is None or self.ranges is None else float(self.loss(model))


def _estimated(run: _Recovering, t, clients, model, stored, shifts):
    """Round ``t``'s estimates, abnormal ones replaced by exact updates; returns (updates, the
    clients computed exactly, the clients abnormality fixing asked).

    A client with no pair (Δw, Δg) yet has no estimate: the correction is built from its own
    exact rounds. With every client in every round the warm-up gives each one its pairs; with
    clients sampled per round (``fraction-train``) a client may first take part after the
    warm-up, and it then computes its exact update in that round, as the warm-up would have had
    it do (ours: the paper assumes every client in every round), instead of its stored update
    being used uncorrected."""
    unpaired = [k for k in clients if not run.buffers.get(k)]
    used = {
        k: _estimate(stored[k], shifts, run.groups, run.buffers[k])
        for k in clients
        if k not in unpaired
    }
    fixed = [k for k in used if _abnormal(used[k], run.groups, run.recovery.thresholds)]
    asked = [k for k in clients if k in unpaired or k in fixed]
    if asked:
        answers = run.ask(t, model, asked)
        for k in asked:  # an abnormal estimate is never used: without its exact update, left out
            if k in answers:
                used[k] = answers[k]
            else:
                used.pop(k, None)
        if fixed:
            run.recovery.fixed[t] = fixed
        if unpaired:
            run.recovery.unpaired[t] = unpaired
    return used, [k for k in asked if k in used], fixed


def _guard_problem(run: _Recovering, model, used, clients, num_examples, refused):
    """Why the guard redoes this estimated round (None: it stands); also its loss after."""
    kept = {k: used[k] for k in clients if k in used and k not in refused}
    step = aggregate_updates(kept, num_examples) if kept else None
    if step is None:
        return None, None
    problem = run.ranges.step_problem(_group_norms(step, run.groups))
    if problem is not None:
        return problem, None
    loss_after = run.evaluate(state_sum(model, step))
    return run.ranges.loss_problem(run.current_loss, loss_after), loss_after


def _screen(run: _Recovering, used, computed) -> list[int]:
    """The clients among ``computed`` whose exact reply the guard refuses."""
    if run.ranges is None:
        return []
    return [k for k in computed if run.ranges.reply_problem(_group_norms(used[k], run.groups))]


def _recover_round(run: _Recovering, t: int, scheduled: bool) -> FedRecoverStep:
    """One round of FedRecover: exact or estimated (fixed, guarded) updates, then the FedAvg step."""
    history, recovery = run.history, run.recovery
    clients = remaining(history.clients(t), run.excluded)
    if not clients:
        return FedRecoverStep(t, [], [], [], 0.0)
    model = recovery.model
    original = history.read_global(t)
    shifts = [flat(model, keys) - flat(original, keys) for keys in run.groups]
    stored = {k: history.read_update(t, k) for k in clients}
    num_examples = history.num_examples(t)
    kind, reason, fixed, loss_after = EXACT, None, [], None
    if scheduled:
        used = run.ask(t, model, clients)
        computed = list(used)
        for k in clients:  # no exact update: its estimate where its buffers hold pairs
            if k not in used and run.buffers.get(k):
                used[k] = _estimate(stored[k], shifts, run.groups, run.buffers[k])
    else:
        kind = ESTIMATED
        used, computed, fixed = _estimated(run, t, clients, model, stored, shifts)
        if run.ranges is not None:
            refused = _screen(run, used, computed)
            reason, loss_after = _guard_problem(run, model, used, clients, num_examples, refused)
            if reason is not None:
                kind, loss_after = GUARDED, None
                rest = [k for k in clients if k not in computed]
                answers = run.ask(t, model, rest)
                used = {k: used[k] for k in computed} | answers  # the guard's estimates: none
                computed = list(used)
                recovery.guarded[t] = reason
    run.check_enough(t, clients, used)
    refused = _screen(run, used, computed)
    if refused:
        recovery.refused[t] = refused
    (recovery.exact_rounds if kind == EXACT else recovery.estimated_rounds).append(t)
    # pairs kept in float32 (lbfgs_hvp computes in float64): s pairs per client and group of a
    # large model are the method's main memory cost on the server; Δw is shared by the clients
    kept_shifts = [shift.float() for shift in shifts]
    for k in computed:
        if k not in refused:
            _push(run.buffers, k, kept_shifts, stored[k], used[k], run.groups, run.buffer_size)
    kept = {k: used[k] for k in clients if k in used and k not in refused}
    norm = 0.0
    if kept:
        step = aggregate_updates(kept, num_examples)
        recovery.model = state_sum(model, step)
        norm = state_norm(step)
        _track(run, kind, step, loss_after)
    missing = recovery.missing.get(t, [])
    return FedRecoverStep(t, clients, computed, fixed, norm, kind, reason, refused, missing)


def _track(run: _Recovering, kind: str, step: State, loss_after: float | None) -> None:
    """Move the loss forward; an exact (or redone) round widens the guard's range."""
    if run.ranges is None:
        return
    before = run.current_loss
    after = loss_after if loss_after is not None else run.evaluate(run.recovery.model)
    if kind != ESTIMATED:
        run.ranges.record_exact(_group_norms(step, run.groups), before, after)
    run.current_loss = after


def fedrecover(
    history,
    excluded: Collection[int],
    exact: ExactUpdatesFn,
    schedule: FedRecoverSchedule | None = None,
    *,
    groups: Sequence[Sequence[str]] | None = None,
    guard: DivergenceGuard | None = None,
    loss: Callable[[State], float] | None = None,
    progress: Callable[[FedRecoverStep], None] | None = None,
    min_reply_fraction: float = 1.0,
) -> Recovery:
    """FedRecover (Cao et al., Sec. IV): the model retrained without ``excluded``, most clients'
    updates estimated from the history.

    Parameters
    ----------
    history
        An :class:`~fedunlearn.store.update_store.UpdateStore` or any object with its read API
        (``rounds``, ``clients``, ``num_examples``, ``read_global``, ``read_update``) holding every
        round, the first round's global model being the initial model. Excluded clients' updates
        are never read.
    excluded : collection of int
        The removed (malicious) clients.
    exact : ExactUpdatesFn
        Asks the listed remaining clients for their exact updates; never asked for an excluded
        client.
    schedule : FedRecoverSchedule, optional
        T_w, T_c, T_f, s, τ (or α); the paper's defaults when omitted.
    groups : sequence of sequences of str, optional
        Keys handled as independent models (a stack's members); default one group of every
        floating tensor.
    guard : DivergenceGuard, optional
        Ours (:mod:`fedunlearn.unlearning.divergence_guard`): estimated rounds held to the exact
        rounds' range, exact replies to the history's norms. None (the default here; the run
        config's default is on): the paper's recovery.
    loss : callable, optional
        The server-side loss of a model state, for the guard's loss check (one group only).
    progress : callable, optional
        Called with each round's :class:`FedRecoverStep`.
    min_reply_fraction : float, optional
        A round goes on without an exact update that never came (see :class:`FedRecoverStep`)
        while this fraction of its clients has one, else :class:`NotEnoughReplies` (default 1).

    Returns
    -------
    Recovery
        The recovered model M̂^{T+1}, how each round got its updates, and what it cost.
    """
    schedule = FedRecoverSchedule() if schedule is None else schedule
    excluded = set(excluded)
    rounds = _consecutive_rounds(history)
    model = history.read_global(rounds[0])
    keys = parameter_groups(model, groups)
    if loss is not None and len(keys) > 1:
        raise ConfigError("loss", "one loss", "no loss for a stack of models (groups)")
    tau = schedule.abnormality_threshold
    scales = None
    if tau is None or guard is not None:
        scales = history_scales(history, excluded, keys, schedule.tolerance_rate)
    thresholds = scales.thresholds if tau is None else [float(tau)] * len(keys)
    ranges = None if guard is None else GuardRanges(guard, scales.peaks)
    run = _Recovering(
        history,
        exact,
        excluded,
        keys,
        schedule.buffer_size,
        Recovery(model=model, thresholds=thresholds),
        ranges,
        loss,
        min_reply_fraction=min_reply_fraction,
    )
    run.current_loss = run.evaluate(model)
    for position, t in enumerate(rounds, start=1):
        step = _recover_round(run, t, schedule.is_exact(position, len(rounds)))
        run.recovery.steps.append(step)
        if progress is not None:
            progress(step)
    return run.recovery


class EveryRound(RetentionPolicy):
    """FedRecover's retention (Section 4): every round's global model and, unless
    ``models_only``, every client's update."""

    name = "round-history"

    def __init__(self, *, models_only: bool = False) -> None:
        self.models_only = bool(models_only)

    @classmethod
    def from_config(cls, config) -> EveryRound:
        return cls()

    def select(self, server_round, global_state, updates, num_examples, *, loss=None) -> Selection:
        return Selection(True, frozenset() if self.models_only else frozenset(updates))
