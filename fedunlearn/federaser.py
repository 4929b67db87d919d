"""FedEraser: reconstruct the global model without target clients from retained updates.

Liu et al., *FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning Models*
(IWQoS 2021), Section IV and Algorithm 1. The server retained, at rounds t_1 = 1, t_{j+1} = t_j + Δt,
each client's update U_k^{t_j} and the global model M^{t_j} (:mod:`fedunlearn.update_store`).
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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.model_state import State, state_sum, weighted_average
from fedunlearn.update_store import UpdateStore

#: ``calibrate(retained_round, model, clients) -> {client: Û_k}``: the remaining clients' updates
#: after E_cali epochs of training from ``model`` (Û_k = M̂_k − M̃).
CalibrateFn = Callable[[int, dict[str, torch.Tensor], list[int]], Mapping[int, State]]


def calibration_epochs(local_epochs: int, calibration_ratio: float) -> int:
    """E_cali = ⌈r · E_loc⌉, at least one epoch (the paper's code rounds up)."""
    if not 0 < calibration_ratio <= 1:
        raise ConfigError("calibration-ratio", calibration_ratio, "a number in (0, 1]")
    return max(1, math.ceil(calibration_ratio * local_epochs - 1e-9))


def calibrate_update(
    retained: State,
    calibration: State,
    *,
    layerwise: bool = True,
    scaled_keys: Collection[str] | None = None,
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

    Notes
    -----
    A calibration update of norm zero carries no direction: that tensor's step is zero (never NaN).
    """
    keys = [
        k
        for k in calibration
        if calibration[k].dtype.is_floating_point and (scaled_keys is None or k in scaled_keys)
    ]
    missing = [k for k in keys if k not in retained]
    if missing:
        raise ValueError(f"calibrate_update: the retained update lacks tensors {missing}")
    out = {k: v.detach().clone() for k, v in calibration.items()}
    if layerwise:
        for k in keys:
            out[k] = _rescale(calibration[k], _norm([retained[k]]), _norm([calibration[k]]))
    else:
        retained_norm = _norm(retained[k] for k in keys)
        calibration_norm = _norm(calibration[k] for k in keys)
        for k in keys:
            out[k] = _rescale(calibration[k], retained_norm, calibration_norm)
    return out


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def _rescale(direction: torch.Tensor, target_norm: float, direction_norm: float) -> torch.Tensor:
    if direction_norm == 0.0 or not math.isfinite(direction_norm):
        return torch.zeros_like(direction)
    return (direction.double() * (target_norm / direction_norm)).to(direction.dtype)


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


@dataclass
class Reconstruction:
    """The unlearned model and how it was made."""

    model: dict[str, torch.Tensor]
    steps: list[ReconstructionStep] = field(default_factory=list)


def fedaccum(store: UpdateStore, targets: Collection[int]) -> Reconstruction:
    """FedAccum (eq. 5 of Liu et al.): M^{t_1} plus every retained round's aggregate of the remaining
    clients' updates, without calibration. The baseline that shows why calibration is needed."""
    excluded = set(targets)
    model = _initial_model(store)
    steps = []
    for retained in store.iter_rounds(exclude=excluded):
        clients = _remaining(retained.updates, excluded)
        if not clients:
            continue
        step = aggregate_updates(retained.updates, retained.num_examples)
        model = state_sum(model, step)
        steps.append(ReconstructionStep(retained.round, clients, False, _norm(step.values())))
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
) -> Reconstruction:
    """Algorithm 1 of Liu et al.: the global model reconstructed without ``targets``.

    ``calibration_order="client"`` applies eq. (2) to each client's update, then aggregates (the
    paper's equations); ``"average"`` aggregates the retained and the calibration updates first and
    calibrates the averages (what the paper's released code does).

    ``calibrate`` is called once per retained round after the first, with the round t_j, the current
    calibrated model M̃^{t_j} and the remaining clients that have a retained update in t_j (never a
    target); it returns their calibration updates Û_k^{t_j}. A client missing from its reply is left
    out of that step. Reads one retained round at a time from ``store``.
    """
    if calibration_order not in ("client", "average"):
        raise ConfigError("calibration-order", calibration_order, "one of client, average")
    excluded = set(targets)
    model = _initial_model(store)
    steps: list[ReconstructionStep] = []
    first = True
    for retained in store.iter_rounds(exclude=excluded):
        clients = _remaining(retained.updates, excluded)
        if not clients:
            continue
        if first:
            first = False
            step = aggregate_updates(retained.updates, retained.num_examples)
            record = ReconstructionStep(retained.round, clients, False, _norm(step.values()))
        else:
            answers = calibrate(retained.round, model, clients)
            leaked = set(answers) & excluded
            if leaked:
                raise RuntimeError(
                    f"calibration returned updates of target clients {sorted(leaked)}"
                )
            answered = sorted(k for k in clients if k in answers)
            if not answered:
                raise RuntimeError(f"no client answered the calibration of round {retained.round}")
            if calibration_order == "client":
                calibrated = {
                    k: calibrate_update(
                        retained.updates[k],
                        answers[k],
                        layerwise=layerwise,
                        scaled_keys=scaled_keys,
                    )
                    for k in answered
                }
                step = aggregate_updates(calibrated, retained.num_examples)
            else:
                step = calibrate_update(
                    aggregate_updates(
                        {k: retained.updates[k] for k in answered}, retained.num_examples
                    ),
                    aggregate_updates({k: answers[k] for k in answered}, retained.num_examples),
                    layerwise=layerwise,
                    scaled_keys=scaled_keys,
                )
            calibrated = answered
            record = ReconstructionStep(
                retained.round, sorted(calibrated), True, _norm(step.values())
            )
        model = state_sum(model, step)
        steps.append(record)
        if progress is not None:
            progress(record)
    return Reconstruction(model, steps)
