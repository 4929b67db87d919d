"""FedEraser: reconstruct the global model without target clients from retained updates.

Liu et al., *FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning Models*
(IWQoS 2021), Section IV and Algorithm 1. The server retained, at rounds t_1 = 1, t_{j+1} = t_j + Δt,
each client's update U_k^{t_j} and the global model M^{t_j} (:mod:`fedunlearn.store.update_store`).
To forget the targets:

* start from the initial model M̃^{t_1} = M^{t_1}, which has never seen a target;
* first step, no calibration: M̃^{t_2} = M̃^{t_1} + Σ_k w_k U_k^{t_1} over the remaining clients;
* each later retained round t_j: the remaining clients train E_cali = r·E_loc epochs from M̃^{t_j}
  and return Û_k^{t_j}; the server calibrates (eq. 2) Ũ_k = ‖U_k^{t_j}‖ · Û_k / ‖Û_k‖, aggregates
  (eq. 3) Ũ = Σ_k N_k Ũ_k / Σ_k N_k, and steps M̃^{t_{j+1}} = M̃^{t_j} + Ũ.

The norm is taken per parameter tensor (layer-wise, as eq. 2 is applied in the paper's code) or over
the whole parameter vector (``layerwise=False``). The paper's own code averages first and calibrates
the average; we calibrate each client's update, as the paper's equation reads.

Buffers that are not trained (BatchNorm running statistics and counters) have no retained "step size"
worth keeping: the reconstruction takes the calibrating clients' buffer updates as they are (no
rescaling), i.e. the buffers follow the remaining clients' data seen through the calibrated model.
In the first, uncalibrated step they come from the retained updates like everything else.

A store kept with ``retain-mode = norms`` holds round t_1 whole and, at later rounds, only the
recorded ‖U_k^{t_j}‖² per tensor, which is all eq. (2) reads with ``calibration_order="client"``:
the reconstruction is then the same, bit for bit, as from the whole updates. (Should every client
of t_1 be a target, the first step falls on a round kept as norms: it is calibrated, since no
uncalibrated update of it was kept.)

Under client sampling (``fraction-train`` < 1) a retained round holds its participants only, and
Algorithm 1, read as it is, calibrates the round over its remaining participants; ours, off by
default, tops thin rounds up with remaining non-participants (``calibration-clients``,
:mod:`fedunlearn.unlearning.calibration_top_up`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from fedunlearn.config.table import validated_parameters
from fedunlearn.errors import ConfigError, TooFewReplies
from fedunlearn.store.retention import INTERVAL, Plan, RetentionPolicy, Selection
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.model_state import RunningAverage, State, state_sum, weighted_average
from fedunlearn.unlearning.calibration_top_up import TopUp, check_order, top_up_round

#: ``calibrate(retained_round, model, clients) -> {client: Û_k}``: the remaining clients' updates
#: after E_cali epochs of training from ``model`` (Û_k = M̂_k − M̃).
CalibrateFn = Callable[[int, dict[str, torch.Tensor], list[int]], Mapping[int, State]]
#: ``exact(round, model, clients) -> {client: U_k}``: the clients' updates after E_loc epochs from
#: ``model`` with the batch order of original round ``round`` (FedRecover's and Crab's exact
#: updates; the same exchange as a calibration, with the run's local epochs).
ExactUpdatesFn = CalibrateFn


def calibration_epochs(local_epochs: int, calibration_ratio: float) -> int:
    """E_cali = ⌈r · E_loc⌉, at least one epoch (the paper's code rounds up)."""
    if not 0 < calibration_ratio <= 1:
        raise ConfigError("calibration-ratio", calibration_ratio, "a number in (0, 1]")
    return max(1, math.ceil(calibration_ratio * local_epochs - 1e-9))


def calibration_scales(
    retained: State,
    calibration: State,
    *,
    layerwise: bool = True,
    scaled_keys: Collection[str] | None = None,
    retained_squares: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """The factors ‖U‖ / ‖Û‖ of eq. (2) of Liu et al., per tensor to rescale (one shared factor
    when not ``layerwise``); 0 where ‖Û‖ is zero or not finite (no direction, no step).

    ``retained_squares`` gives ‖U[tensor]‖² as the store recorded them; otherwise they are
    computed from ``retained``. Eq. (2) reads nothing of U but these norms."""
    keys = [
        k
        for k in calibration
        if calibration[k].dtype.is_floating_point and (scaled_keys is None or k in scaled_keys)
    ]
    squares = dict(retained_squares) if retained_squares is not None else None
    missing = [k for k in keys if k not in (squares if squares is not None else retained)]
    if missing:
        raise ValueError(f"calibrate_update: the retained update lacks tensors {missing}")
    if squares is None:
        squares = {k: float(retained[k].detach().double().pow(2).sum()) for k in keys}
    if layerwise:
        return {k: _ratio(math.sqrt(squares[k]), _norm([calibration[k]])) for k in keys}
    ratio = _ratio(math.sqrt(sum(squares[k] for k in keys)), _norm(calibration[k] for k in keys))
    return dict.fromkeys(keys, ratio)


def apply_scales(calibration: State, scales: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """``calibration`` with each tensor in ``scales`` multiplied by its factor (in float64); the
    other tensors (buffers) as they are."""
    out = {k: v.detach().clone() for k, v in calibration.items()}
    for k, factor in scales.items():
        if factor == 0.0:  # no direction: no step (zeros, never -0.0 or a NaN from inf * 0)
            out[k] = torch.zeros_like(calibration[k])
        else:
            out[k] = (calibration[k].double() * factor).to(calibration[k].dtype)
    return out


def calibrate_update(
    retained: State,
    calibration: State,
    *,
    layerwise: bool = True,
    scaled_keys: Collection[str] | None = None,
    retained_squares: Mapping[str, float] | None = None,
) -> dict[str, torch.Tensor]:
    """Eq. (2) of Liu et al.: Ũ = ‖U‖ · Û / ‖Û‖.

    Parameters
    ----------
    retained : State
        U_k^{t_j}, the client's retained update (its norm is the step size).
    calibration : State
        Û_k^{t_j}, the calibration update (its direction is the step's direction).
    layerwise : bool, default True
        Take norms per tensor; otherwise over all scaled tensors as one vector.
    scaled_keys : collection of str, optional
        The tensors to rescale (the model's parameters). Others (buffers) are taken from
        ``calibration`` unchanged. Default: every floating tensor.
    retained_squares : mapping, optional
        ‖U[tensor]‖² as recorded by the store (see :func:`calibration_scales`).

    Notes
    -----
    A calibration update of norm zero carries no direction: that tensor's step is zero (never NaN).
    """
    scales = calibration_scales(
        retained,
        calibration,
        layerwise=layerwise,
        scaled_keys=scaled_keys,
        retained_squares=retained_squares,
    )
    return apply_scales(calibration, scales)


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def _ratio(target_norm: float, direction_norm: float) -> float:
    if direction_norm == 0.0 or not math.isfinite(direction_norm):
        return 0.0
    return target_norm / direction_norm


def aggregate_updates(updates: Mapping[int, State], num_examples: Mapping[int, int]) -> dict:
    """Eq. (3): Σ_k N_k U_k / Σ_k N_k over the clients in ``updates``."""
    if not updates:
        raise ValueError("aggregate_updates: no client updates to aggregate")
    clients = sorted(updates)  # a fixed order: the sum is reproducible bit for bit
    return weighted_average([updates[k] for k in clients], [num_examples[k] for k in clients])


def _initial_model(store: UpdateStore) -> dict[str, torch.Tensor]:
    """M^{t_1}, the global model of the first retained round: it has never seen any client."""
    rounds = store.rounds()
    if not rounds:
        raise ConfigError("store", str(store.root), "a store with at least one retained round")
    return store.read_global(rounds[0])


def _remaining(store_clients: Iterable[int], excluded: set[int]) -> list[int]:
    return sorted(set(store_clients) - excluded)


@dataclass
class ReconstructionStep:
    """What one step of the reconstruction used."""

    retained_round: int
    clients: list[int]
    calibrated: bool
    update_norm: float
    #: Remaining clients that calibrated this round without having taken part in it (TopUp).
    topped_up: list[int] = field(default_factory=list)


@dataclass
class Reconstruction:
    """The unlearned model and how it was made."""

    model: dict[str, torch.Tensor]
    steps: list[ReconstructionStep] = field(default_factory=list)


def fedaccum(store: UpdateStore, targets: Collection[int]) -> Reconstruction:
    """FedAccum (eq. 5 of Liu et al.): M^{t_1} plus every retained round's aggregate of the remaining
    clients' updates, without calibration. The baseline that shows why calibration is needed.
    Reads one update at a time."""
    excluded = set(targets)
    model = _initial_model(store)
    steps = []
    for retained in _rounds(store, excluded):
        clients = _remaining(retained.clients, excluded)
        if not clients:
            continue
        if retained.norms_only:
            raise ConfigError(
                "unlearn-methods",
                "fedaccum",
                "methods that read only the norms of updates after round t_1 (federaser): "
                f"round {retained.round} kept only norms (retain-mode = norms)",
            )
        step = _Step(retained, clients)
        for k, update, _ in store.iter_updates(retained.round, clients):
            step.add(k, update)
        update = step.result()
        model = state_sum(model, update)
        steps.append(
            ReconstructionStep(retained.round, step.clients, False, _norm(update.values()))
        )
    return Reconstruction(model, steps)


def federaser(
    store: UpdateStore,
    targets: Collection[int],
    calibrate: CalibrateFn,
    *,
    layerwise: bool = True,
    scaled_keys: Collection[str] | None = None,
    calibration_order: str = "client",
    progress: Callable[[ReconstructionStep], None] | None = None,
    trajectory: UpdateStore | None = None,
    top_up: TopUp | None = None,
) -> Reconstruction:
    """Algorithm 1 of Liu et al.: the global model reconstructed without ``targets``.

    ``calibration_order="client"`` applies eq. (2) to each client's update, then aggregates (the
    paper's equations); ``"average"`` aggregates the retained and the calibration updates first and
    calibrates the averages (what the paper's released code does).

    ``calibrate`` is called once per retained round after the first, with the round t_j, the current
    calibrated model M̃^{t_j} and the remaining clients that have a retained update in t_j (never a
    target); it returns their calibration updates Û_k^{t_j}. A client missing from its reply is left
    out of that step. A ``calibrate`` with a ``stream(round, model, clients, fold)`` method is asked
    through it instead (``calibration_order="client"``): it calls ``fold(client, Û_k)`` as each
    reply comes, in ascending client order, and the step adds each client's Ũ_k to eq. (3)'s sum
    then, so that memory holds a few updates, not one per client. Retained updates are read one
    at a time.

    ``trajectory``, an empty store, receives the reconstruction as a history of its own (the
    design's "History after unlearning"): for each step, M̃^{t_j} and per client the update the step
    applied: round t_1's retained U_k (computed from M^{t_1}, which never saw a target), then the
    calibrated Ũ_k (with ``"average"``, Û_k rescaled by the average's factors), each recorded with
    the norms of the U_k it stands for, so that a later request calibrates with the same step sizes.

    ``top_up`` (ours, for sampled rounds; ``calibration_order="client"`` only): each calibrated
    round is calibrated by at least ``top_up.minimum`` remaining clients (:class:`TopUp`); a
    round with that many remaining participants is untouched. The uncalibrated first step adds
    round t_1's retained updates only.
    """
    if calibration_order not in ("client", "average"):
        raise ConfigError("calibration-order", calibration_order, "one of client, average")
    check_order(top_up, calibration_order)
    excluded = set(targets)
    model = _initial_model(store)
    steps: list[ReconstructionStep] = []
    for retained in _rounds(store, excluded):
        clients = _remaining(retained.clients, excluded)
        if not clients:
            continue
        calibrated, topped_up = bool(steps) or bool(retained.norms_only), set()
        if calibrated:
            clients, topped_up = top_up_round(store, retained, clients, top_up, excluded)
        step = _Step(retained, clients, trajectory, model, topped_up)
        with step:
            if not calibrated:  # the first step: no calibration
                for k, update, squares in store.iter_updates(retained.round, clients):
                    step.add(k, update, squares)
            elif calibration_order == "client":
                _calibrate_each(
                    store, retained, step, calibrate, model, excluded, layerwise, scaled_keys
                )
            else:
                _calibrate_average(
                    store, retained, step, calibrate, model, excluded, layerwise, scaled_keys
                )
            if not step.clients:
                raise TooFewReplies(f"no client answered the calibration of round {retained.round}")
        update = step.result()
        record = ReconstructionStep(
            retained.round,
            step.clients,
            bool(steps),
            _norm(update.values()),
            sorted(topped_up & set(step.clients)),
        )
        model = state_sum(model, update)
        steps.append(record)
        if progress is not None:
            progress(record)
    return Reconstruction(model, steps)


class _Step:
    """One step of the reconstruction: eq. (3)'s Σ_k N_k Ũ_k / Σ_k N_k folded client by client in
    ascending order (the same sum, bit for bit, as :func:`aggregate_updates` over the clients
    that answered, when all answered), and each Ũ_k written to ``trajectory`` as it is added."""

    def __init__(
        self, retained, clients: list[int], trajectory=None, model=None, topped_up=frozenset()
    ) -> None:
        self.retained, self.asked = retained, set(clients)
        self.average = RunningAverage(sum(retained.num_examples[k] for k in clients))
        self.clients: list[int] = []
        # a topped-up client is recorded as the round's participants are: whole, or norms only
        participants_norms = set(retained.norms_only) - set(topped_up)
        self._norms = participants_norms | (set(topped_up) if participants_norms else set())
        self._trajectory, self._model, self._writer = trajectory, model, None

    def __enter__(self) -> _Step:
        if self._trajectory is not None:
            model = None if self._norms else self._model
            self._writer = self._trajectory.begin_round(self.retained.round, model).__enter__()
        return self

    def __exit__(self, *error) -> None:
        if self._writer is not None:
            self._writer.__exit__(*error)

    def add(self, client: int, applied: State, squares: Mapping[str, float] | None = None) -> None:
        """Add client ``client``'s applied update (after every client before it)."""
        if client not in self.asked:
            raise RuntimeError(f"an update of client {client}, which this step did not ask")
        if self.clients and client <= self.clients[-1]:
            raise RuntimeError(f"client {client}'s update came after client {self.clients[-1]}'s")
        count = self.retained.num_examples[client]
        self.average.add(applied, count)
        self.clients.append(client)
        if self._writer is not None:
            add = self._writer.add_norms if client in self._norms else self._writer.add_update
            add(client, applied, count, squares=squares)

    def result(self) -> dict[str, torch.Tensor]:
        return self.average.result()


def _rounds(store: UpdateStore, excluded: set[int]):
    """Each retained round, ascending, without its blobs: counts and norms rows (the whole updates
    are read a client at a time, ``store.iter_updates``)."""
    for round_number in store.rounds():
        yield store.read_round(round_number, exclude=excluded, blobs="none")


class _Squares:
    """The recorded ‖U_k‖² per tensor of a round's clients, asked in ascending client order: a
    norms row's at once, a whole update's read from the store in one pass over the round."""

    def __init__(self, store: UpdateStore, retained, clients: list[int]) -> None:
        self.retained = retained
        whole = [k for k in clients if k in retained.unread]
        self._updates = store.iter_updates(retained.round, whole)
        self._next = next(self._updates, None)

    def __call__(self, client: int) -> Mapping[str, float]:
        if client not in self.retained.unread:
            return self.retained.squares[client]
        while self._next is not None and self._next[0] < client:
            self._next = next(self._updates, None)
        if self._next is None or self._next[0] != client:
            raise RuntimeError(f"round {self.retained.round} holds no update of client {client}")
        return self._next[2]


def _calibrate_each(store, retained, step, calibrate, model, excluded, layerwise, scaled_keys):
    """Eq. (2) on each answering client, added to the step as its answer comes (``excluded``: the
    targets, whose answer is an error)."""
    squares_of = _Squares(store, retained, sorted(step.asked))

    def fold(client: int, answer: State) -> None:
        if client in excluded:
            raise RuntimeError(f"calibration returned updates of target clients [{client}]")
        if client not in step.asked:
            return
        squares = squares_of(client)
        calibrated = calibrate_update(
            {}, answer, layerwise=layerwise, scaled_keys=scaled_keys, retained_squares=squares
        )
        step.add(client, calibrated, squares)

    clients = sorted(step.asked)
    if hasattr(calibrate, "stream"):
        calibrate.stream(retained.round, model, clients, fold)
        return
    answers = calibrate(retained.round, model, clients)
    leaked = sorted(set(answers) & excluded)
    if leaked:
        raise RuntimeError(f"calibration returned updates of target clients {leaked}")
    for client in sorted(answers):
        fold(client, answers[client])


def _calibrate_average(store, retained, step, calibrate, model, excluded, layerwise, scaled_keys):
    """The released code's order: Û_k rescaled by the factors eq. (2) gives the averages of the
    retained and the calibration updates (both needed whole: the round is read at once)."""
    if retained.norms_only:
        raise ConfigError(
            "calibration-order",
            "average",
            f"client: round {retained.round} kept only the updates' norms (retain-mode = norms), "
            "and the average's norm needs the whole updates",
        )
    clients = sorted(step.asked)
    answers = calibrate(retained.round, model, clients)
    leaked = sorted(set(answers) & excluded)
    if leaked:
        raise RuntimeError(f"calibration returned updates of target clients {leaked}")
    answered = [k for k in clients if k in answers]
    if not answered:
        return
    whole = store.read_round(retained.round, clients=answered)
    scales = calibration_scales(
        aggregate_updates({k: whole.updates[k] for k in answered}, retained.num_examples),
        aggregate_updates({k: answers[k] for k in answered}, retained.num_examples),
        layerwise=layerwise,
        scaled_keys=scaled_keys,
    )
    for k in answered:
        step.add(k, apply_scales(answers[k], scales), whole.squares[k])


# ------------------------------------------------------------------ retention (Section IV-B)
def is_retained_round(server_round: int, retain_interval: int) -> bool:
    """Whether round ``server_round`` (1-based) is one of t_1 = 1, t_{j+1} = t_j + Δt, with
    Δt = ``retain_interval`` (validated by :class:`IntervalRetention`, the one route)."""
    return server_round >= 1 and (server_round - 1) % retain_interval == 0


class IntervalRetention(RetentionPolicy):
    """FedEraser's schedule: every client's update at rounds 1, 1+Δt, 1+2Δt, ...; with
    ``mode="norms"``, round t_1 = 1 whole (M^{t_1} and the U_k^{t_1} of the uncalibrated first
    step) and at later retained rounds only each update's norm per tensor (eq. 2's step size).
    Δt and the mode are checked against the run config's own constraints (``retain-interval``,
    ``retain-mode``)."""

    name = INTERVAL

    def __init__(self, retain_interval: int, mode: str = "full") -> None:
        checked = validated_parameters({"retain-interval": retain_interval, "retain-mode": mode})
        self.retain_interval = int(checked["retain-interval"])
        self.mode = str(checked["retain-mode"])

    @classmethod
    def from_config(cls, config) -> IntervalRetention:
        return cls(config.retain_interval, config.retain_mode)

    def plan(self, server_round: int) -> Plan:
        """Decided by the round number alone: nothing, every client's norms, or every update."""
        if not is_retained_round(server_round, self.retain_interval):
            return Plan()
        if self.mode == "norms" and server_round > 1:
            return Plan(norms=True)
        return Plan(keep_global=True, updates=True)

    def select(self, server_round, global_state, updates, num_examples, *, loss=None) -> Selection:
        return self.plan(server_round).selection(updates)
