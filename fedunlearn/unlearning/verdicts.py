"""What a comparison may claim of each method's model: flags on rows that must not read as results,
and which model an unlearning request may adopt.

A row of the comparison table is flagged (``flag`` column, the console, the figures) when

* its model is not finite, or its test loss is not, or its rounds diverged in the clients'
  training (``diverged``: its model is the one that round sent; a diverged FedRetrain is no
  reference);
* it is more than ``flag-gap`` points of test accuracy below the reference (FedRetrain, the model
  retrained without the targets), or, without a reference in the run, below the original model;
* it did not forget: when the request forgets a client that planted a backdoor
  (``attack_forgotten``) and the original and the reference have its success (``attack_success``),
  the forgetting signal's verdict (:func:`fedunlearn.unlearning.forgetting.verdict`): flagged
  unless its success is within ``flag-gap`` points of FedRetrain's ("kept the attack", "forgot
  nothing"), and every row when the signal cannot measure forgetting (a target of fewer than 20
  samples, a backdoor the original did not learn: "forgetting not measurable"). That is
  forgetting measured directly, so it replaces the L2 test below (a method that makes a small,
  targeted change, FedOSD on MNIST: backdoor 99.9% -> 2.8% at L2 1.25 from the original against
  5.24 to FedRetrain, would read as "forgot nothing");
* without such a signal, it forgot nothing, whatever its accuracy: with a reference, its model is
  nearer the original than a quarter of the way the original is from the reference (L2 over all
  parameters, :data:`FORGOT_NOTHING_SHARE`); without one, it is the original model itself (L2 to
  it 0).

Why not "no closer to the reference than the original is" (L2): parameter distances between
networks trained along different trajectories say nothing of forgetting. On the main job (IID
digits) FedEraser lands 0.22 points from FedRetrain with an L2 to it of 2.25, against the
original's 1.16; on digits label shards SIFU, which retrained from a noised M^1, is 2.03 from
FedRetrain against the original's 1.43, and 2.29 from the original. Both would read as "forgot
nothing". A model that stayed by the original (Crab rolling back nothing: L2 to FedRetrain 2.164
against the original's 2.159) is caught by its own distance to the original.

The original (``fedavg``) is held to its own training instead (:func:`training_flag`): a federation
that learned nothing, or collapsed after learning, makes every row of its comparison meaningless,
FedRetrain's included (MNIST at lr 0.05 on Dirichlet(0.1), seed 2: 0.098 after 10 rounds, every
method "within flag-gap" of a retrained model as broken as the original).

Adoption (``unlearn-adopt``): the adopted model's trajectory becomes the run's history, and every
later request builds on it, so ``auto`` never adopts a flagged model: it takes the first candidate
(FedEraser before FedRetrain) that is unflagged and, when FedRetrain ran, within
``adopt-tolerance`` points of its test accuracy. When nothing qualifies the request is refused
(:class:`AdoptionRefused`) before anything is deleted. A method named explicitly is the user's
decision: it is adopted, flagged or not, and a flag is stated in the reason the log records; a
diverged one is refused even then (its trajectory stops where it diverged, or is not finite).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from fedunlearn.errors import ConfigError
from fedunlearn.unlearning import forgetting

REFERENCE = "fedretrain"
ORIGINAL = "fedavg"
#: Training learned nothing when its final test accuracy is within this of the initial model's.
LEARNED_NOTHING = 0.05
#: Training collapsed when its final test accuracy fell below this share of its best round's.
COLLAPSED_SHARE = 0.5
#: A model within this share of the original's distance to the reference, from the original,
#: forgot nothing.
FORGOT_NOTHING_SHARE = 0.25
#: How a diverged row's flag begins; such a model is never adopted, not even when named.
DIVERGED = "diverged"


def _points(value: float) -> float:
    return 100.0 * value


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def forgetting_signal(
    reference: pd.Series | None, original: pd.Series | None
) -> forgetting.Signal | None:
    """The request's forgetting signal, calibrated on the original's and FedRetrain's backdoor
    success (and the target's sample count, column ``target_samples``, when the table has it);
    None when either success is not measured (no backdoor: a scaled-update attack)."""
    if reference is None or original is None:
        return None
    s_o, s_r = original.get("attack_success", math.nan), reference.get("attack_success", math.nan)
    if not (_finite(s_o) and _finite(s_r)):
        return None
    samples = reference.get("target_samples", None)
    samples = int(samples) if _finite(samples) else None
    return forgetting.Signal(float(s_o), float(s_r), samples)


def row_flag(
    row: pd.Series,
    reference: pd.Series | None,
    original: pd.Series | None,
    gap: float,
    attack_forgotten: bool = False,
):
    """The reason ``row`` is flagged, or ``""``; ``reference`` and ``original`` are the table's
    FedRetrain and original rows (None when absent), ``gap`` is ``flag-gap`` in points;
    ``attack_forgotten``: the request forgets a client that planted a backdoor, so its success
    measures forgetting (:func:`forgetting_signal`)."""
    if row["method"] == ORIGINAL:
        return ""
    if not _finite(row["test_loss"]) or not _finite(row.get("l2_to_original", 0.0)):
        return f"{DIVERGED}: its model or test loss is not finite"
    anchor, anchor_name = (
        (reference, REFERENCE) if reference is not None else (original, "original")
    )
    if anchor is not None and row["method"] != anchor_name:
        below = _points(anchor["test_accuracy"] - row["test_accuracy"])
        if below > gap:
            return f"{below:.1f} points below {anchor_name} (flag-gap {gap:g})"
    signal = forgetting_signal(reference, original) if attack_forgotten else None
    if signal is not None:
        if row["method"] == REFERENCE:
            return ""
        return forgetting.verdict(row.get("attack_success", math.nan), signal, gap)[1]
    moved = row.get("l2_to_original", math.nan)
    if reference is not None and original is not None and row["method"] != REFERENCE:
        span = original["l2_to_fedretrain"]
        if _finite(moved) and _finite(span) and moved <= FORGOT_NOTHING_SHARE * span:
            return (
                f"forgot nothing: it stayed by the original (L2 {moved:.4g} from it, against "
                f"{span:.4g} from the original to {REFERENCE})"
            )
    if reference is None and moved == 0:
        return "forgot nothing: it is the original model"
    return ""


def forgetting_labels(
    table: pd.DataFrame, flag_gap: float, attack_forgotten: bool = False
) -> list[str]:
    """Each row's forgetting verdict (:mod:`fedunlearn.unlearning.forgetting`: "as fedretrain",
    "kept part", "forgot nothing", "not measurable"); ``""`` for the original, for FedRetrain and
    wherever the request has no forgetting signal."""
    rows = {row["method"]: row for _, row in table.iterrows()}
    signal = (
        forgetting_signal(rows.get(REFERENCE), rows.get(ORIGINAL)) if attack_forgotten else None
    )
    if signal is None:
        return [""] * len(table)
    return [
        "" if method in (ORIGINAL, REFERENCE) else forgetting.verdict(success, signal, flag_gap)[0]
        for method, success in zip(table["method"], table["attack_success"])
    ]


def flag_rows(
    table: pd.DataFrame,
    flag_gap: float,
    attack_forgotten: bool = False,
    diverged: Mapping[str, str] | None = None,
) -> list[str]:
    """:func:`row_flag` for every row of a comparison table (columns ``method``,
    ``test_accuracy``, ``test_loss``, ``l2_to_fedretrain``, ``l2_to_original``, and
    ``attack_success`` where the run was poisoned); ``diverged``: why each method whose rounds
    diverged in the clients' training did (its row's model is finite, the one the diverged round
    sent, so only this says so)."""
    diverged = dict(diverged or {})
    rows = {row["method"]: row for _, row in table.iterrows()}
    reference, original = rows.get(REFERENCE), rows.get(ORIGINAL)
    if reference is not None and (not _finite(reference["test_loss"]) or REFERENCE in diverged):
        reference = None  # a diverged reference measures nothing: held to the original instead
    return [
        f"{DIVERGED}: {diverged[row['method']]}"
        if row["method"] in diverged
        else row_flag(row, reference, original, flag_gap, attack_forgotten)
        for _, row in table.iterrows()
    ]


def training_flag(test_accuracy: Sequence[float]) -> str:
    """Why the training run whose per-round test accuracies (round 0, the initial model, first)
    are ``test_accuracy`` is no basis for a comparison, or ``""``: a final accuracy not
    :data:`LEARNED_NOTHING` above the initial model's, or below :data:`COLLAPSED_SHARE` of the best
    round's, or not finite."""
    values = [float(a) for a in test_accuracy]
    if len(values) < 2:
        return ""
    initial, final = values[0], values[-1]
    best = max((a for a in values[1:] if math.isfinite(a)), default=math.nan)
    if not math.isfinite(final):
        return "training diverged: the final test accuracy is not finite"
    if final < COLLAPSED_SHARE * best:
        return (
            f"training collapsed: final test accuracy {final:.4f}, below {COLLAPSED_SHARE:g} of "
            f"its best round's {best:.4f} (lower lr)"
        )
    if final - initial < LEARNED_NOTHING:
        return (
            f"training learned nothing: final test accuracy {final:.4f} against the initial "
            f"model's {initial:.4f}"
        )
    return ""


class AdoptionRefused(ConfigError):
    """No model of the request may become the run's history."""


@dataclass(frozen=True)
class Adoption:
    """The adopted method and why (one line for the log)."""

    method: str
    reason: str


def choose_adoption(
    table: pd.DataFrame,
    flags: Sequence[str],
    candidates: Sequence[str],
    *,
    explicit: str | None,
    tolerance: float,
) -> Adoption:
    """Which of ``candidates`` (adoptable methods that wrote a trajectory, in preference order)
    the request adopts: ``explicit`` (``unlearn-adopt`` other than auto), flagged or not unless it
    diverged; else the first unflagged candidate within ``tolerance`` points of FedRetrain (when it
    ran).

    Raises :class:`AdoptionRefused` naming every candidate's problem when none qualifies."""
    accuracy = dict(zip(table["method"], table["test_accuracy"]))
    flagged = {m: f for m, f in zip(table["method"], flags) if f}
    problems = []
    if explicit in accuracy and not flagged.get(explicit, "").startswith(DIVERGED):
        warning = f"; it is FLAGGED ({flagged[explicit]})" if explicit in flagged else ""
        return Adoption(explicit, "unlearn-adopt names it" + warning)
    for method in [explicit] if explicit else candidates:
        if method not in accuracy:
            problems.append(f"{method} has no model in this request")
        elif method in flagged:
            problems.append(f"{method} is flagged ({flagged[method]})")
        elif method == REFERENCE or REFERENCE not in accuracy or REFERENCE in flagged:
            return Adoption(method, _why(method, problems))
        else:
            below = _points(accuracy[REFERENCE] - accuracy[method])
            if below <= tolerance:
                return Adoption(
                    method,
                    f"{below:.2f} points below {REFERENCE}, within adopt-tolerance {tolerance:g}",
                )
            problems.append(
                f"{method} is {below:.2f} points below {REFERENCE} (adopt-tolerance {tolerance:g})"
            )
    key, value = ("unlearn-adopt", explicit) if explicit else ("unlearn-methods", candidates)
    raise AdoptionRefused(
        key,
        value,
        "a model that may become the run's history; none may: "
        + "; ".join(problems)
        + ". Nothing was adopted or deleted: run the request again with fedretrain among "
        "unlearn-methods, raise flag-gap / adopt-tolerance, or name the model to adopt in "
        "unlearn-adopt",
    )


def _why(method: str, problems: Sequence[str]) -> str:
    if method == REFERENCE:
        return "; ".join(problems) or "the only candidate"
    return "unflagged; no unflagged fedretrain in the request to compare with"
