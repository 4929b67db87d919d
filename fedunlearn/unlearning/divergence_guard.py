"""A divergence guard for recoveries that estimate client updates. Ours, not the papers'.

FedRecover (Cao et al., IEEE S&P 2023) checks an estimated update only coordinate by coordinate
(abnormality fixing, Sec. IV-C): an estimate is recomputed exactly when one of its coordinates
exceeds τ. Nothing in the paper checks a round as a whole. On label-skewed federations that is
not enough: 18 of 19 L-BFGS estimates of one round passed τ, their aggregate stepped 2.4 times
farther than any exact round had, the model fell from 0.947 to 0.103 test accuracy, and every
exact update computed from it afterwards exploded (MNIST, Dirichlet(0.5), 20 clients).

The guard holds each estimated round to the range the *exact* rounds of the same recovery set
(warm-up, periodic correction, final tuning, and rounds the guard redid), with a relative
``slack``:

* step: the aggregated step's norm (per parameter group) is at most (1 + slack) times the largest
  step of an exact round so far;
* loss (when the server can evaluate one): the rise of the server-side loss over the round is at
  most max(0, the largest rise of an exact round) + slack · the loss before the round;
* non-finite steps and losses always fail.

A round that fails is redone with exact updates from every remaining client (the estimates it
replaces are discarded; the L-BFGS buffers take the exact updates, as always).

Exact replies are screened against the history: an exact update whose norm in a group exceeds
(1 + slack) times the largest norm any retained update of the remaining clients had in that group
is refused (left out of the round, and out of the L-BFGS buffers); a round whose every update is
refused leaves the model unchanged. An exact update is computed from the recovered model, so one
far larger than anything the original training produced means the recovered model, or the client,
went wrong.

Off (``guard=None`` in :func:`fedunlearn.unlearning.fedrecover.fedrecover`, run-config
``fedrecover-guard = false``), the recovery is the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fedunlearn.config import Interval, coerce, validate_parameter_constraints

_CONSTRAINTS = {"fedrecover-guard-slack": Interval(float, 0)}


@dataclass(frozen=True)
class DivergenceGuard:
    """The guard's one parameter.

    Parameters
    ----------
    slack : float, default 0.5
        ``fedrecover-guard-slack``: how far beyond the exact rounds' range an estimated round may
        go (relative), and how far beyond the history's largest update norm an exact reply may.
    """

    slack: float = 0.5

    def __post_init__(self) -> None:
        slack = coerce("fedrecover-guard-slack", self.slack, float)
        validate_parameter_constraints({"fedrecover-guard-slack": slack}, _CONSTRAINTS)
        object.__setattr__(self, "slack", slack)


@dataclass
class GuardRanges:
    """What the exact rounds of one recovery set (per parameter group), and the history's largest
    update norms (``history_peaks``), against which estimated rounds and exact replies are held."""

    guard: DivergenceGuard
    history_peaks: Sequence[float]
    max_step: list[float] = field(default_factory=list)
    max_rise: float = -math.inf

    def __post_init__(self) -> None:
        if not self.max_step:
            self.max_step = [0.0] * len(self.history_peaks)

    def record_exact(
        self, step_norms: Sequence[float], loss_before: float | None, loss_after: float | None
    ) -> None:
        """An exact round's step norms and, when known, its loss before and after."""
        self.max_step = [
            max(m, s) if math.isfinite(s) else m for m, s in zip(self.max_step, step_norms)
        ]
        if loss_before is not None and loss_after is not None:
            rise = loss_after - loss_before
            if math.isfinite(rise):
                self.max_rise = max(self.max_rise, rise)

    def step_problem(self, step_norms: Sequence[float]) -> str | None:
        """Why an estimated round's step leaves the range (None when it does not)."""
        limit = 1 + self.guard.slack
        for g, (norm, largest) in enumerate(zip(step_norms, self.max_step)):
            if not math.isfinite(norm):
                return f"its step is not finite (group {g})"
            if norm > limit * largest:
                where = f" in group {g}" if len(step_norms) > 1 else ""
                return (
                    f"its step {norm:.4g}{where} exceeds {limit:g} x {largest:.4g}, the largest "
                    "step of an exact round"
                )
        return None

    def loss_problem(self, loss_before: float | None, loss_after: float | None) -> str | None:
        """Why an estimated round's server-side loss leaves the range (None when it does not,
        or when no loss is known)."""
        if loss_before is None or loss_after is None:
            return None
        if not math.isfinite(loss_after):
            return "the server-side loss after it is not finite"
        allowed = max(0.0, self.max_rise) + self.guard.slack * abs(loss_before)
        if loss_after - loss_before > allowed:
            return (
                f"it raised the server-side loss from {loss_before:.4g} to {loss_after:.4g}, more "
                f"than the {allowed:.4g} the exact rounds allow"
            )
        return None

    def reply_problem(self, update_norms: Sequence[float]) -> str | None:
        """Why an exact update is refused: a group's norm above (1 + slack) times the largest
        norm of a retained update in that group (None when it passes)."""
        limit = 1 + self.guard.slack
        for norm, peak in zip(update_norms, self.history_peaks):
            if not math.isfinite(norm) or norm > limit * peak:
                return f"its norm {norm:.4g} exceeds {limit:g} x {peak:.4g}, the history's largest"
        return None
