"""Keep-training: the baseline with no unlearning at all. The remaining clients go on training the
original model, without the target, for a budget of client-epochs (Mora & Bellavista, ICAIIC 2025:
without it no method's forgetting claim means anything, since plain training fades a client's
trace by itself, slowly: the target stayed detectable for 50 rounds in their runs).

Its budget is another method's client-epochs in the same request (``keep-training-budget``, by
default FedRetrain's: continuing costs what retraining costs), spent exactly
(:func:`round_plan`), or a number of rounds (``keep-training-rounds``). After every round its
test accuracy and forgetting signal are recorded against the client-epochs spent so far
(:class:`CurvePoint`), so that each method of the request can be read against keep-training *at
its own cost* (:func:`at_client_epochs`), not only at the budget's.

It is never adopted: its trajectory starts from the original model, a function of the target's
updates.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from fedunlearn.errors import ConfigError


@dataclass(frozen=True)
class PlannedRound:
    """One round of keep-training: ``clients`` of the remaining clients train ``epochs`` each."""

    epochs: int
    clients: int

    @property
    def client_epochs(self) -> int:
        return self.epochs * self.clients


def round_plan(budget: float, clients: int, local_epochs: int) -> list[PlannedRound]:
    """Rounds whose client-epochs sum to ``budget`` exactly: as many whole rounds as fit (every
    one of ``clients`` trains ``local_epochs``), then one round of the whole epochs left per client,
    then one epoch for the clients the remainder covers.

    ``budget`` is a whole number of client-epochs (a metered method's cost); 0 gives no round (the
    original model itself)."""
    if not (isinstance(budget, numbers.Real) and budget >= 0 and math.isfinite(budget)):
        raise ConfigError("keep-training budget", budget, "a finite number of client-epochs >= 0")
    if budget != int(budget):
        raise ConfigError("keep-training budget", budget, "a whole number of client-epochs")
    for key, value in (("clients", clients), ("local-epochs", local_epochs)):
        if not (isinstance(value, numbers.Integral) and value >= 1):
            raise ConfigError(key, value, "an integer >= 1")
    left = int(budget)
    whole, left = divmod(left, clients * local_epochs)
    plan = [PlannedRound(local_epochs, clients)] * whole
    epochs, left = divmod(left, clients)
    if epochs:
        plan.append(PlannedRound(epochs, clients))
    if left:
        plan.append(PlannedRound(1, left))
    return plan


@dataclass(frozen=True)
class CurvePoint:
    """Keep-training after ``client_epochs``: its test accuracy and its forgetting signal (the
    backdoor's success, NaN without one)."""

    client_epochs: float
    test_accuracy: float
    attack_success: float = math.nan

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def at_client_epochs(curve: Sequence[Mapping[str, float]], client_epochs: float) -> dict | None:
    """Keep-training at a method's cost: the first point of ``curve`` (in order, from the original
    at 0) that spent at least ``client_epochs``, so that keep-training is never given less than the
    method; None when the curve stops short of it."""
    for point in curve:
        if point["client_epochs"] >= client_epochs - 1e-9:
            return dict(point)
    return None
