"""PGA: the leaving client's projected gradient ascent of Halimi, Kadhe, Rawat, Baracaldo,
*Federated Unlearning: How to Efficiently Erase a Client in FL?* (arXiv 2207.05521, 2022),
Flower-free.

The target client i maximises its own empirical loss F_i(w) (cross-entropy) over the L2 ball
{w : ‖w - w_ref‖ ≤ δ} by projected gradient ascent (PGD), starting from w_ref, the mean of the
other clients' models of the last training round; the server then runs a few FedAvg rounds
without client i (post-training). The paper's Section 3 / the authors' notebook (IBM/
federated-unlearning, ``federated_unlearning.ipynb``, section 4) give:

* w_ref = (N w^T - w_i^{T}) / (N - 1) with equal weights (:func:`reference_model`). With
  FedAvg's sample weights n_k it is ours: w_ref = M^{T-1} + Σ_{k≠i} n_k U_k / Σ_{k≠i} n_k, the
  n_k-weighted mean of the other clients' last models, which equals (Σ n_k w^T - n_i w_i^T) /
  (Σ n_k - n_i); with partial participation, the mean of the last round's other participants.
* δ: the notebook draws 10 freshly initialised models, takes the mean of their *squared* L2
  distances to w_ref over the model parameters, divides it by 3 and projects onto the sphere of
  radius sqrt(that) (:func:`ball_radius`; δ² = mean ‖w_ref - w_rand‖² / 3).
* The ascent (:func:`projected_gradient_ascent`): SGD on -CE (lr 0.01, momentum 0.9, batch 128,
  at most 5 epochs), the gradient's norm clipped at 5 before each step, projected back into the
  ball after each step (:func:`project_to_ball`). Only parameters are projected (the notebook's
  ``parameters_to_vector``); buffers (BatchNorm statistics) are not.
* Early stopping, one of three rules (``pga-stop``):

  - ``validation``, the paper's: the ascent stops "if the validation accuracy drops below a
    predetermined threshold τ" (Halimi et al., Section 3). τ is not given a value there; we set it
    relative to the start, τ = acc(w_ref) − m (:func:`validation_threshold`), so that one margin m
    serves every network and dataset. The validation samples are the server's, sent with the
    ascent request (the notebook measures the reference's clean accuracy on its test loader);
  - ``distance``, the authors' code's: once the squared distance from the unlearned model to the
    target's own last model exceeds 2.2 (``anchor``, ``stop_distance``), a constant for their
    MNIST FLNet;
  - ``ratio``, ours: that squared distance above a multiple of where it started
    (:func:`stop_distance`).

  Each is checked after every projected step, as the notebook checks its rule.
* Post-training (the lead's FedAvg, not here): the notebook runs 10 rounds without the target,
  each client 1 local epoch capped at 51 batches of 128 (lr 0.01, momentum 0.9).

:class:`LastRoundRetention` keeps, during training, what the server needs to compute w_ref when
a request comes: the last round's start model M^{T-1} and every client's update U_k.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.retention import RetentionPolicy, Selection
from fedunlearn.training.local import evaluate
from fedunlearn.training.model_state import state_sum, weighted_average

State = Mapping[str, torch.Tensor]
#: The ascent's stop rules (``pga-stop``): the paper's, the authors' code's, ours.
STOP_RULES = ("validation", "distance", "ratio")

#: The authors' notebook's hyper-parameters (section 4 and 5), for the lead's wiring.
PGA_DEFAULTS: dict[str, Any] = {
    "epochs": 5,
    "lr": 0.01,
    "momentum": 0.9,
    "batch_size": 128,
    "clip_norm": 5.0,
    "random_models": 10,
    "radius_fraction": 1 / 3,  # of the mean *squared* distance: δ² = mean d² / 3
    "stop_distance": 2.2,  # squared distance to the target's last model (notebook's stop)
    "post_training_rounds": 10,
    "post_training_batches": 51,  # per local epoch (their num_updates_in_epoch = 50, inclusive)
}


def reference_model(
    global_state: State,
    updates: Mapping[int, State],
    counts: Mapping[int, int],
    targets: Collection[int] = (),
) -> dict[str, torch.Tensor]:
    """w_ref = M^{T-1} + Σ_{k∉targets} n_k U_k / Σ_{k∉targets} n_k (Section 3, "reference model").

    Parameters
    ----------
    global_state : mapping of str to Tensor
        M^{T-1}, the global model the last training round started from.
    updates : mapping of int to state
        U_k = M_k^T - M^{T-1} of the last round's clients, by partition id.
    counts : mapping of int to int
        n_k, each client's number of training samples (FedAvg's weight).
    targets : collection of int
        The leaving clients; left out of the mean (absent ones are allowed: a target that did not
        take part in the last round, or whose update is already deleted).
    """
    others = sorted(int(k) for k in updates if int(k) not in {int(t) for t in targets})
    if not others:
        raise ConfigError("targets", sorted(targets), "leave at least one other client's update")
    for k in others:
        n = counts.get(k)
        if not isinstance(n, numbers.Real) or not n > 0:
            raise ConfigError(f"counts[{k}]", n, "a number of samples > 0")
    step = weighted_average([updates[k] for k in others], [counts[k] for k in others])
    return state_sum(global_state, step)


def _floating_keys(state: State, keys: Sequence[str] | None) -> list[str]:
    if keys is None:
        return [k for k, t in state.items() if t.dtype.is_floating_point]
    missing = [k for k in keys if k not in state]
    if missing:
        raise ConfigError("keys", missing, f"keys of the state: {sorted(state)}")
    return list(keys)


def parameter_distance(a: State, b: State, keys: Sequence[str]) -> float:
    """‖a - b‖ over ``keys`` taken as one vector, in float64."""
    total = sum(
        float((a[k].detach().double().cpu() - b[k].detach().double().cpu()).pow(2).sum())
        for k in keys
    )
    return math.sqrt(total)


def project_to_ball(
    state: State, center: State, radius: float, keys: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """Π_B(w): the nearest point of the ball {‖w - w_ref‖ ≤ δ} (Section 3, PGD's projection).

    ``w`` itself when inside, else w_ref + δ (w - w_ref) / ‖w - w_ref‖, the L2 norm taken over
    ``keys`` (default: every floating tensor of ``state``) as one vector; other tensors unchanged.
    """
    if not (isinstance(radius, numbers.Real) and radius >= 0 and math.isfinite(radius)):
        raise ConfigError("radius", radius, "a finite number >= 0")
    keys = _floating_keys(state, keys)
    out = {k: t.detach().clone() for k, t in state.items()}
    distance = parameter_distance(state, center, keys)
    if distance <= radius:
        return out
    scale = radius / distance
    for k in keys:
        c = center[k].detach().double().to(out[k].device)
        out[k] = (c + (out[k].double() - c) * scale).to(out[k].dtype)
    return out


def stop_distance(start_distance2: float, absolute: float, ratio: float) -> float:
    """The squared distance to the target's own model at which its ascent stops: ``ratio`` times
    where it starts (``start_distance2`` = ‖w_ref − w_i‖², ours: scale-free) when ``ratio`` > 0,
    else the absolute ``absolute`` (the authors' code: 2.2, for their MNIST FLNet, where the
    reference starts 0.45 from the client's model in the run their notebook stores: 4.9x)."""
    for name, value in (("start_distance2", start_distance2), ("pga-stop-distance", absolute)):
        if not (isinstance(value, numbers.Real) and value >= 0 and math.isfinite(value)):
            raise ConfigError(name, value, "a finite number >= 0")
    if not (isinstance(ratio, numbers.Real) and ratio >= 0 and math.isfinite(ratio)):
        raise ConfigError("pga-stop-ratio", ratio, "a finite number >= 0")
    return ratio * start_distance2 if ratio > 0 else absolute


def validation_threshold(reference_accuracy: float, margin_points: float) -> float:
    """τ = acc(w_ref) − m: the validation accuracy below which the paper's ascent stops, ``m``
    (``pga-stop-margin``) in points of accuracy (Halimi et al., Section 3: "stop if the validation
    accuracy drops below a predetermined threshold τ"; τ relative to w_ref is ours)."""
    if not (isinstance(reference_accuracy, numbers.Real) and 0 <= reference_accuracy <= 1):
        raise ConfigError("reference_accuracy", reference_accuracy, "a fraction in [0, 1]")
    if not (isinstance(margin_points, numbers.Real) and 0 <= margin_points <= 100):
        raise ConfigError("pga-stop-margin", margin_points, "points of accuracy in [0, 100]")
    return float(reference_accuracy) - float(margin_points) / 100.0


def ball_radius(
    reference: State,
    build: Callable[[int], nn.Module],
    *,
    num_models: int = PGA_DEFAULTS["random_models"],
    seed: int = 0,
    fraction: float = PGA_DEFAULTS["radius_fraction"],
) -> float:
    """δ = sqrt(fraction · mean_j ‖w_ref - w_rand^j‖²), the authors' notebook's rule (section 4:
    ``threshold = mean(squared distances) / 3``, projection radius ``sqrt(threshold)``).

    ``build(seed)`` returns a freshly initialised model; models are built from seeds ``seed``,
    ``seed + 1``, ... and compared over their parameters (not buffers), as the notebook's
    ``parameters_to_vector`` does.
    """
    if not (isinstance(num_models, numbers.Integral) and num_models >= 1):
        raise ConfigError("num_models", num_models, "an integer >= 1")
    if not (isinstance(fraction, numbers.Real) and 0 < fraction and math.isfinite(fraction)):
        raise ConfigError("fraction", fraction, "a finite number > 0")
    squares = []
    for j in range(int(num_models)):
        params = dict(build(seed + j).named_parameters())
        squares.append(parameter_distance(params, reference, list(params)) ** 2)
    return math.sqrt(fraction * sum(squares) / len(squares))


def _check_ascent_arguments(x, y, epochs, lr, batch_size, radius, stop_accuracy, clip_norm):
    # stop_accuracy may be below 0 (tau = acc(w_ref) - m): the rule then never fires
    if len(x) == 0 or len(y) != len(x):
        raise ConfigError("x", f"{len(x)} samples, {len(y)} labels", "a non-empty labelled set")
    if not (isinstance(epochs, numbers.Integral) and epochs >= 1):
        raise ConfigError("epochs", epochs, "an integer >= 1")
    if not (isinstance(batch_size, numbers.Integral) and batch_size >= 1):
        raise ConfigError("batch_size", batch_size, "an integer >= 1")
    if not (isinstance(lr, numbers.Real) and lr > 0 and math.isfinite(lr)):
        raise ConfigError("lr", lr, "a finite number > 0")
    if not (isinstance(radius, numbers.Real) and radius >= 0 and math.isfinite(radius)):
        raise ConfigError("radius", radius, "a finite number >= 0")
    if stop_accuracy is not None and not (
        isinstance(stop_accuracy, numbers.Real) and -1 <= stop_accuracy <= 1
    ):
        raise ConfigError("stop_accuracy", stop_accuracy, "None or a number in [-1, 1]")
    if clip_norm is not None and not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ConfigError("clip_norm", clip_norm, "None or a finite number > 0")


@torch.no_grad()
def _project_model(model: nn.Module, center: State, radius: float) -> float:
    """Project the model's parameters into the ball in place; their distance to the center."""
    params = dict(model.named_parameters())
    projected = project_to_ball(params, center, radius, list(params))
    for name, p in params.items():
        p.copy_(projected[name])
    return parameter_distance(params, center, list(params))


def _stop_reason(model, validation, device, stop_accuracy, anchor, stop_distance, accuracy):
    """Why the ascent stops after this step (None: it goes on), and the validation accuracy last
    measured."""
    if stop_accuracy is not None:
        accuracy = evaluate(model, *validation, device=device).accuracy
        model.train()  # evaluate leaves the model in eval mode
        if accuracy < stop_accuracy:
            return "accuracy", accuracy
    if anchor is not None:
        params = {k: p.detach() for k, p in model.named_parameters()}
        if parameter_distance(params, anchor, list(params)) ** 2 > stop_distance:
            return "distance", accuracy
    return None, accuracy


def projected_gradient_ascent(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    reference: State,
    radius: float,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    validation: tuple[torch.Tensor, torch.Tensor] | None = None,
    stop_accuracy: float | None = None,
    clip_norm: float | None = None,
    momentum: float = 0.0,
    anchor: State | None = None,
    stop_distance: float | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """max_{‖w - w_ref‖ ≤ δ} F_i(w) by PGD (Section 3, the unlearning problem), in place.

    The model is first projected into the ball (a no-op when it starts at w_ref, as the authors
    do). Each step: SGD on the batch's -CE (fresh optimizer, seeded batches as in
    :func:`fedunlearn.training.local.train_epochs`), the gradient norm clipped at ``clip_norm``,
    then the parameters projected back into the ball. After each step it stops early when the
    accuracy on ``validation`` (inputs, labels) is below ``stop_accuracy`` (the paper's τ,
    :func:`validation_threshold`) or when the squared distance to ``anchor`` (the target's last
    local model) exceeds ``stop_distance`` (the notebook's rule).

    Returns ``steps``, ``epochs`` (begun), ``last_loss`` (CE of the last batch, before its step),
    ``stopped_early``, ``stop_reason`` (``"accuracy"``, ``"distance"`` or None), ``accuracy``
    (the last validation accuracy measured, or None) and ``distance`` (‖w - w_ref‖ at the end).
    """
    _check_ascent_arguments(x, y, epochs, lr, batch_size, radius, stop_accuracy, clip_norm)
    if (anchor is None) != (stop_distance is None):
        raise ConfigError("stop_distance", stop_distance, "given together with anchor, or neither")
    if (validation is None) != (stop_accuracy is None):
        raise ConfigError(
            "stop_accuracy", stop_accuracy, "given together with validation, or neither"
        )
    if validation is not None and (
        len(validation[0]) == 0 or len(validation[0]) != len(validation[1])
    ):
        raise ConfigError("validation", len(validation[0]), "a non-empty labelled set")
    device = torch.device(device)
    model.to(device).train()
    center = {k: t.detach().to(device) for k, t in reference.items()}
    distance = _project_model(model, center, radius)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed)
    steps, epochs_begun, last_loss, accuracy, reason = 0, 0, float("nan"), None, None
    loss_fn = nn.CrossEntropyLoss()
    while reason is None and epochs_begun < epochs:
        epochs_begun += 1
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            index = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[index].to(device)), y[index].to(device))
            (-loss).backward()  # ascent: descend on the negated loss
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            distance = _project_model(model, center, radius)
            steps, last_loss = steps + 1, loss.item()
            reason, accuracy = _stop_reason(
                model, validation, device, stop_accuracy, anchor, stop_distance, accuracy
            )
            if reason is not None:
                break
    return {
        "steps": steps,
        "epochs": epochs_begun,
        "last_loss": last_loss,
        "stopped_early": reason is not None,
        "stop_reason": reason,
        "accuracy": accuracy,
        "distance": distance,
    }


class LastRoundRetention(RetentionPolicy):
    """PGA's retention: the last round's start model M^{T-1} and every client's update U_k^T,
    from which the server computes w_ref (:func:`reference_model`) when a request comes.

    Every round is kept whole when it happens; once a newer one is kept, :meth:`settle` releases
    the previous one (``{round: None}``), so the store holds one round at a time.
    """

    name = "last-round"

    def __init__(self) -> None:
        self.last_round: int | None = None
        self._released: dict[int, None] = {}

    @classmethod
    def from_config(cls, config) -> LastRoundRetention:
        return cls()

    def select(self, server_round, global_state, updates, num_examples, *, loss=None) -> Selection:
        if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 1:
            raise ConfigError("server_round", server_round, "a whole number >= 1")
        if self.last_round is not None and server_round <= self.last_round:
            raise ValueError(f"LastRoundRetention: round {server_round} after {self.last_round}")
        if not updates:
            # ours: a round without updates gives no w_ref; the previous round stays the last kept
            return Selection(False, frozenset())
        if self.last_round is not None:
            self._released[self.last_round] = None
        self.last_round = server_round
        return Selection(True, frozenset(int(k) for k in updates))

    def settle(self) -> dict[int, None]:
        """The rounds superseded since the last call, each released whole (None)."""
        out, self._released = self._released, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"format": 1, "last_round": self.last_round}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        last = state.get("last_round") if isinstance(state, Mapping) else None
        valid = last is None or (isinstance(last, int) and not isinstance(last, bool) and last >= 1)
        if not isinstance(state, Mapping) or state.get("format") != 1 or not valid:
            raise StoreCorruptionError(f"retention policy {self.name}: malformed state {state!r}")
        self.last_round = last
        self._released = {}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LastRoundRetention:
        policy = cls()
        policy.load_state_dict(state)
        return policy
