"""One membership-inference audit of many models, judged against FedRetrain (Flower-free).

The audit's data (DESIGN.md, "Membership inference"):

* the target's data D_f: members of the original model, and what each unlearning method must forget;
* a held-out set split in two disjoint halves (:func:`fedunlearn.membership.attacks.split_held_out`): the
  first trains the shadow attack (non-members of the shadow), the second is the evaluation's
  non-members, as many as the target's samples;
* the shadow model is the original model (FedEraser's setting): its members are a sample of its
  training data other than the target's.

Every model is attacked by FedEraser's shadow-model attack (precision, recall, F1, AUC), by the
loss / confidence / entropy threshold attacks (AUC, TPR at 1% and 0.1% FPR) and, when reference
models' confidences are given, by offline LiRA (Carlini et al. 2022; AUC, TPR at 0.1% FPR).

A method is judged by its distance to FedRetrain, not by the lowest attack score: a model attacked
less successfully than the retrained one stands out as much as one attacked more successfully (the
Streisand effect), so :func:`judge` reports each score's gap to FedRetrain and a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.membership.attacks import ShadowModelAttack, loss_scores, threshold_attacks
from fedunlearn.membership.lira import lira_offline, logit_confidence
from fedunlearn.membership.metrics import roc_points, threshold_summary

#: The attack scores compared with FedRetrain's, and the verdict's tolerance on each.
JUDGED = ("shadow_f1", "shadow_auc", "loss_auc", "confidence_auc", "entropy_auc", "lira_auc")
DEFAULT_TOLERANCE = 0.02


@torch.no_grad()
def softmax_outputs(
    model: nn.Module, x: torch.Tensor, *, device="cpu", batch_size: int = 1024
) -> np.ndarray:
    """The model's softmax probabilities (n, K) in float64: all an output-only attacker sees."""
    model = model.to(device).eval()
    parts = [
        torch.softmax(model(x[s : s + batch_size].to(device)).double(), dim=1).cpu()
        for s in range(0, len(x), batch_size)
    ]
    if not parts:
        raise ConfigError("x", "an empty input", "at least one sample")
    return torch.cat(parts).numpy()


@dataclass
class ModelOutputs:
    """One model's outputs on the target's data (members) and on the evaluation non-members."""

    target_probs: np.ndarray
    target_labels: np.ndarray
    unseen_probs: np.ndarray
    unseen_labels: np.ndarray


@dataclass
class MembershipAudit:
    """Attacks fitted once (on the original model's outputs), applied to every model.

    Parameters
    ----------
    shadow_member_probs, shadow_nonmember_probs : array (n, K)
        The original (shadow) model's outputs on training data that is not the target's, and on
        the held-out half reserved for training the attack.
    seed : int
    """

    shadow_member_probs: np.ndarray
    shadow_nonmember_probs: np.ndarray
    seed: int = 0
    rows: list[dict] = field(default_factory=list)
    curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.shadow = ShadowModelAttack(self.seed).fit(
            self.shadow_member_probs, self.shadow_nonmember_probs
        )

    def fit_shadow(
        self, member_probs: np.ndarray, nonmember_probs: np.ndarray
    ) -> ShadowModelAttack:
        """A shadow-model attack fitted on another shadow's outputs on the same data as the
        original's (the shadow members and the attack's held-out half)."""
        return ShadowModelAttack(self.seed).fit(member_probs, nonmember_probs)

    def audit(
        self,
        name: str,
        outputs: ModelOutputs,
        *,
        lira_reference_phi: np.ndarray | None = None,
        extra: Mapping[str, float] | None = None,
        shadow: ShadowModelAttack | None = None,
    ) -> dict:
        """Attack one model; returns (and keeps) its row.

        ``lira_reference_phi`` (m, n_target + n_unseen) holds m >= 2 reference models' logit
        confidences on the same target-then-unseen samples, each reference trained without the
        target (offline LiRA); ``extra`` adds columns (accuracy, wall time); ``shadow`` replaces
        the attack fitted on the original model's outputs, for a model of another kind whose
        outputs the original's do not resemble (:meth:`fit_shadow`).
        """
        if name in {row["method"] for row in self.rows}:
            raise ConfigError("name", name, "a method not audited yet")
        o = outputs
        row: dict[str, float | str] = {"method": name}
        row["n_members"] = len(o.target_labels)
        row["n_nonmembers"] = min(len(o.unseen_labels), len(o.target_labels))
        shadow = (shadow or self.shadow).evaluate(o.target_probs, o.unseen_probs)
        row.update({f"shadow_{k}": float(shadow[k]) for k in ("precision", "recall", "f1", "auc")})
        attacks = threshold_attacks(
            o.target_probs, o.target_labels, o.unseen_probs, o.unseen_labels
        )
        for attack, summary in attacks.items():
            row[f"{attack}_auc"] = summary["auc"]
            row[f"{attack}_tpr@1%"] = summary["tpr_at_1pct_fpr"]
            row[f"{attack}_tpr@0.1%"] = summary["tpr_at_0.1pct_fpr"]
        curves = {}
        curves["loss"] = roc_points(
            loss_scores(o.target_probs, o.target_labels),
            loss_scores(o.unseen_probs, o.unseen_labels),
        )
        if lira_reference_phi is not None:
            phi = np.concatenate(
                [
                    logit_confidence(o.target_probs, o.target_labels),
                    logit_confidence(o.unseen_probs, o.unseen_labels),
                ]
            )
            scores = lira_offline(phi, np.asarray(lira_reference_phi, dtype=np.float64))
            n = len(o.target_labels)
            summary = threshold_summary(scores[:n], scores[n:])
            row["lira_auc"] = summary["auc"]
            row["lira_tpr@0.1%"] = summary["tpr_at_0.1pct_fpr"]
            curves["lira"] = roc_points(scores[:n], scores[n:])
        row.update(dict(extra or {}))
        self.rows.append(row)
        self.curves[name] = curves
        return row

    def table(self, *, reference: str = "fedretrain", tolerance: float | None = None):
        """Every audited model, judged against ``reference`` (see :func:`judge`)."""
        return judge(pd.DataFrame(self.rows), reference=reference, tolerance=tolerance)


def null_auc_std(n_members: int, n_nonmembers: int) -> float:
    """Standard deviation of the AUC of an attack with no signal (Mann-Whitney under H0):
    ``sqrt((n1 + n2 + 1) / (12 n1 n2))``."""
    return float(np.sqrt((n_members + n_nonmembers + 1) / (12.0 * n_members * n_nonmembers)))


def judge(
    table: pd.DataFrame, *, reference: str = "fedretrain", tolerance: float | None = None
) -> pd.DataFrame:
    """Add each judged score's gap to the ``reference`` row and a verdict.

    The verdict compares the attack scores with the reference's, not with zero: ``as retrained``
    when every judged score is within the tolerance of it, ``leaks membership`` when some score is
    higher by more, ``Streisand effect`` when some is lower by more (and none higher: a model
    attacked less successfully than the retrained one is conspicuous too). The tolerance is
    ``tolerance`` or, by default, per row the larger of 0.02 and twice the standard deviation of a
    no-signal AUC on that many members and non-members (:func:`null_auc_std`): a gap smaller than
    that is sampling noise (135 targets: 0.07; 3,000: 0.015).
    """
    if "method" not in table or reference not in set(table["method"]):
        raise ConfigError("reference", reference, "a method present in the table (its judge)")
    if tolerance is not None and not tolerance >= 0:
        raise ConfigError("tolerance", tolerance, "a number >= 0, or None (from the sample sizes)")
    out = table.copy()
    if tolerance is not None:
        out["tolerance"] = float(tolerance)
    elif {"n_members", "n_nonmembers"} <= set(out.columns):
        out["tolerance"] = [
            max(DEFAULT_TOLERANCE, 2 * null_auc_std(int(m), int(n)))
            for m, n in zip(out["n_members"], out["n_nonmembers"], strict=True)
        ]
    else:
        out["tolerance"] = DEFAULT_TOLERANCE
    base = out.set_index("method").loc[reference]
    judged = [c for c in JUDGED if c in out]
    for column in judged:
        out[f"{column}_gap"] = out[column] - base[column]
    gaps = out[[f"{c}_gap" for c in judged]].to_numpy(dtype=float)
    verdicts = []
    for row, limit in zip(gaps, out["tolerance"], strict=True):
        finite = row[np.isfinite(row)]
        if finite.size and finite.max() > limit:
            verdicts.append("leaks membership")
        elif finite.size and finite.min() < -limit:
            verdicts.append("Streisand effect")
        else:
            verdicts.append("as retrained")
    out["max_abs_gap"] = np.nanmax(np.abs(gaps), axis=1) if gaps.size else np.nan
    out["verdict"] = verdicts
    return out


def mean_std(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Per method, every numeric column's mean and standard deviation over seeds (one table per
    seed), as ``<column>`` and ``<column>_std``, methods in their first table's order."""
    if not tables:
        raise ConfigError("tables", "none", "at least one table (one per seed)")
    stacked = pd.concat(tables, ignore_index=True)
    numeric = stacked.select_dtypes("number").columns
    grouped = stacked.groupby("method", sort=False)[list(numeric)]
    mean, std = grouped.mean(), grouped.std(ddof=1 if len(tables) > 1 else 0)
    out = mean.join(std.add_suffix("_std"))
    out.insert(0, "seeds", stacked.groupby("method", sort=False).size())
    return out.reset_index()
