"""Did a method forget? The verdict of a forgetting signal measured on every model of a comparison:
the success of a backdoor the forgotten client planted (Gu et al. 2017's trigger; the way SIFU,
FedRecover, VeriFi and Halimi et al. verify that a client was removed).

The signal s of a model is the share of triggered test inputs (of the other classes) it puts in
the backdoor's class. Two rows of the same request calibrate it: the original model, which learned
from the client (s_o), and FedRetrain, which never saw it (s_r). Nothing else sets a threshold:

* **not measurable** — the target holds fewer than :data:`MIN_TARGET_SAMPLES` samples, or the
  original did not learn the backdoor: s_o is less than :data:`MIN_SIGNAL_POINTS` points above
  s_r. Then no row can show that it forgot, and none passes;
* **forgot as FedRetrain** — s ≤ s_r + g (g = ``flag-gap`` points);
* **forgot nothing** — s ≥ s_o − g: the signal stayed where the original left it;
* **kept part** — in between: more than g points of the backdoor left above FedRetrain's.

Only the first passes. Keep-training (the remaining clients go on training the original model, no
unlearning) is a row like the others: it shows how much of the signal plain training removes by
itself at a given cost (:mod:`fedunlearn.unlearning.keep_training`), so a method's forgetting reads
against it at equal client-epochs, never against distances between parameters (which say nothing
of forgetting between networks trained along different trajectories).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A target with fewer samples than this is too small for its forgetting to be measured.
MIN_TARGET_SAMPLES = 20
#: The original must hold the backdoor this many points above FedRetrain for the signal to
#: separate "forgot" from "forgot nothing".
MIN_SIGNAL_POINTS = 20.0

AS_REFERENCE = "as fedretrain"
KEPT_PART = "kept part"
FORGOT_NOTHING = "forgot nothing"
NOT_MEASURABLE = "not measurable"


@dataclass(frozen=True)
class Signal:
    """The calibration of a request's forgetting signal.

    Parameters
    ----------
    original, reference : float
        The backdoor's success on the original model (s_o) and on FedRetrain's (s_r), in [0, 1].
    target_samples : int or None
        How many samples the forgotten clients hold (None: not known, not checked).
    """

    original: float
    reference: float
    target_samples: int | None = None

    def problem(self) -> str:
        """Why the signal cannot measure forgetting (``""``: it can)."""
        if not (_finite(self.original) and _finite(self.reference)):
            return "the backdoor's success was not measured on the original and fedretrain"
        if self.target_samples is not None and self.target_samples < MIN_TARGET_SAMPLES:
            return (
                f"the target holds {self.target_samples} sample(s), fewer than {MIN_TARGET_SAMPLES}"
            )
        learned = _points(self.original - self.reference)
        if learned < MIN_SIGNAL_POINTS:
            return (
                f"the original did not learn the backdoor: success {self.original:.3f}, "
                f"{learned:.1f} points above fedretrain's {self.reference:.3f} (needs "
                f"{MIN_SIGNAL_POINTS:g})"
            )
        return ""


def verdict(success: float, signal: Signal, gap: float) -> tuple[str, str]:
    """``(label, flag)`` of a model whose backdoor success is ``success``: the label one of
    :data:`AS_REFERENCE`, :data:`KEPT_PART`, :data:`FORGOT_NOTHING`, :data:`NOT_MEASURABLE`;
    the flag ``""`` for :data:`AS_REFERENCE`, else why the row is no result; ``gap`` is
    ``flag-gap`` in points."""
    problem = signal.problem()
    if problem:
        return NOT_MEASURABLE, f"forgetting not measurable: {problem}"
    if not _finite(success):
        return NOT_MEASURABLE, "forgetting not measurable: its backdoor success is not finite"
    above = _points(success - signal.reference)
    if above <= gap:
        return AS_REFERENCE, ""
    calibration = f"the original's {signal.original:.3f}, fedretrain's {signal.reference:.3f}"
    if _points(signal.original - success) <= gap:
        return FORGOT_NOTHING, (
            f"forgot nothing: backdoor success {success:.4f}, within {gap:g} points of the "
            f"original's ({calibration})"
        )
    return KEPT_PART, (
        f"kept the attack: success {success:.4f}, {above:.1f} points above fedretrain's "
        f"{signal.reference:.4f} (flag-gap {gap:g}; {calibration})"
    )


def _points(value: float) -> float:
    """``value`` in percentage points, rounded to 1e-9 so that a difference printed as 20.0 is
    not refused as 19.999999999999996 (1.0 - 0.8 in floating point)."""
    return round(100.0 * value, 9)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
