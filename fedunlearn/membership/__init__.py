"""Membership-inference audit: attacks, LiRA, metrics and the comparative evaluation.

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.membership.attacks import (
    PROB_FLOOR,
    THRESHOLD_SCORES,
    ShadowModelAttack,
    confidence_scores,
    disjoint_indices,
    entropy_scores,
    loss_scores,
    split_held_out,
    threshold_attacks,
)
from fedunlearn.membership.evaluation import (
    DEFAULT_TOLERANCE,
    JUDGED,
    MembershipAudit,
    ModelOutputs,
    judge,
    mean_std,
    null_auc_std,
    softmax_outputs,
)
from fedunlearn.membership.lira import (
    LiraReference,
    lira_offline,
    lira_online,
    logit_confidence,
    other_classes_mass,
)
from fedunlearn.membership.metrics import (
    precision_recall_f1,
    roc_auc,
    roc_points,
    threshold_summary,
    tpr_at_fpr,
)

__all__ = [
    "PROB_FLOOR",
    "loss_scores",
    "confidence_scores",
    "entropy_scores",
    "THRESHOLD_SCORES",
    "threshold_attacks",
    "ShadowModelAttack",
    "disjoint_indices",
    "split_held_out",
    "JUDGED",
    "DEFAULT_TOLERANCE",
    "softmax_outputs",
    "ModelOutputs",
    "MembershipAudit",
    "null_auc_std",
    "judge",
    "mean_std",
    "logit_confidence",
    "other_classes_mass",
    "lira_offline",
    "lira_online",
    "LiraReference",
    "roc_auc",
    "tpr_at_fpr",
    "roc_points",
    "precision_recall_f1",
    "threshold_summary",
]
