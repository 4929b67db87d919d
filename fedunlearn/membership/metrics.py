"""How well a membership-inference attack tells members from non-members, from its scores.

Every function takes the attack's scores on known members and on known non-members, with the
convention that a higher score means "more likely a member". Beyond the area under the ROC curve
we report the true-positive rate at a small false-positive rate, as Carlini et al., "Membership
Inference Attacks From First Principles" (IEEE S&P 2022), argue an attack should be judged: an
attack that confidently identifies a few members matters even when its AUC is near 0.5. The ROC
points are meant for their log-log plots.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import roc_curve

from fedunlearn.errors import ConfigError

__all__ = [
    "precision_recall_f1",
    "roc_auc",
    "roc_points",
    "threshold_summary",
    "tpr_at_fpr",
]


def _scores(values: object, name: str) -> np.ndarray:
    """``values`` as a non-empty 1-D finite float64 array, else ConfigError naming ``name``."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ConfigError(name, type(values).__name__, "a 1-D array of numbers") from error
    if array.ndim != 1:
        raise ConfigError(name, f"array of shape {array.shape}", "a 1-D array of scores")
    if array.size == 0:
        raise ConfigError(name, "an empty array", "at least one score")
    if not np.all(np.isfinite(array)):
        bad = int(np.sum(~np.isfinite(array)))
        raise ConfigError(name, f"{bad} non-finite score(s)", "finite scores only")
    return array


def _both(member_scores: object, nonmember_scores: object) -> tuple[np.ndarray, np.ndarray]:
    return _scores(member_scores, "member_scores"), _scores(nonmember_scores, "nonmember_scores")


def roc_auc(member_scores: object, nonmember_scores: object) -> float:
    """Area under the ROC curve of the rule "member iff score >= t".

    The probability that a random member outscores a random non-member, ties counting 1/2 (the
    Mann-Whitney U statistic divided by n_members * n_nonmembers); equal to
    ``sklearn.metrics.roc_auc_score`` with members as the positive class.

    Parameters
    ----------
    member_scores, nonmember_scores : array_like, shape (n,) and (m,)
        Finite attack scores of known members and known non-members (higher = more member-like).

    Returns
    -------
    float
        The AUC in [0, 1]; 0.5 is chance.
    """
    members, nonmembers = _both(member_scores, nonmember_scores)
    ranks = rankdata(np.concatenate([members, nonmembers]))  # average ranks: ties count 1/2
    n_pos, n_neg = members.size, nonmembers.size
    u_statistic = float(ranks[:n_pos].sum()) - n_pos * (n_pos + 1) / 2.0
    return u_statistic / (n_pos * n_neg)


def _counts_at_thresholds(
    members: np.ndarray, nonmembers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """True- and false-positive counts of "member iff score >= t" for every candidate t.

    The candidates are the distinct observed scores plus +inf, so tied scores move together.
    """
    thresholds = np.append(np.unique(np.concatenate([members, nonmembers])), np.inf)
    sorted_members, sorted_nonmembers = np.sort(members), np.sort(nonmembers)
    true_positives = members.size - np.searchsorted(sorted_members, thresholds, side="left")
    false_positives = nonmembers.size - np.searchsorted(sorted_nonmembers, thresholds, side="left")
    return true_positives, false_positives


def tpr_at_fpr(member_scores: object, nonmember_scores: object, fpr: float) -> float:
    """Exact true-positive rate at a bounded false-positive rate (Carlini et al., 2022).

    Among the thresholds t of the rule "member iff score >= t", taken at every observed score and
    at +inf (where nothing is called a member), keep those whose false-positive rate is at most
    ``fpr`` and return the largest true-positive rate among them. Tied scores are always on the
    same side of a threshold; no interpolation between ROC points is done.

    Parameters
    ----------
    member_scores, nonmember_scores : array_like, shape (n,) and (m,)
        Finite attack scores of known members and known non-members (higher = more member-like).
    fpr : float
        The largest false-positive rate allowed, in [0, 1].

    Returns
    -------
    float
        The true-positive rate in [0, 1].
    """
    members, nonmembers = _both(member_scores, nonmember_scores)
    if isinstance(fpr, bool) or not isinstance(fpr, (int, float, np.integer, np.floating)):
        raise ConfigError("fpr", fpr, "a number in [0, 1]")
    if not (math.isfinite(float(fpr)) and 0.0 <= float(fpr) <= 1.0):
        raise ConfigError("fpr", fpr, "a number in [0, 1]")
    true_positives, false_positives = _counts_at_thresholds(members, nonmembers)
    # Integer comparison; the tiny slack absorbs rounding such as 0.29 * 100 = 28.999999999999996.
    allowed_false_positives = math.floor(float(fpr) * nonmembers.size + 1e-9)
    feasible = false_positives <= allowed_false_positives  # always holds at t = +inf
    return float(true_positives[feasible].max()) / members.size


def roc_points(member_scores: object, nonmember_scores: object) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve's points, for the log-log plots of Carlini et al. (2022).

    Parameters
    ----------
    member_scores, nonmember_scores : array_like, shape (n,) and (m,)
        Finite attack scores of known members and known non-members (higher = more member-like).

    Returns
    -------
    fpr, tpr : numpy.ndarray
        False- and true-positive rates of "member iff score >= t" at +inf and at every distinct
        observed score, in increasing order (from (0, 0) to (1, 1)), as from
        ``sklearn.metrics.roc_curve(..., drop_intermediate=False)``.
    """
    members, nonmembers = _both(member_scores, nonmember_scores)
    truth = np.concatenate([np.ones(members.size, dtype=int), np.zeros(nonmembers.size, dtype=int)])
    fpr, tpr, _ = roc_curve(truth, np.concatenate([members, nonmembers]), drop_intermediate=False)
    return fpr, tpr


def _predictions(values: object, name: str, *, allow_empty: bool) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ConfigError(name, f"array of shape {array.shape}", "a 1-D boolean array")
    if array.dtype != np.bool_:
        is_binary = array.dtype.kind in "iuf" and np.all((array == 0) | (array == 1))
        if not is_binary:
            raise ConfigError(name, f"array of dtype {array.dtype}", "a boolean array (or 0/1)")
        array = array.astype(bool)
    if array.size == 0 and not allow_empty:
        raise ConfigError(name, "an empty array", "at least one prediction")
    return array


def precision_recall_f1(
    predicted_members_among_members: object, predicted_members_among_nonmembers: object
) -> dict[str, float]:
    """Precision, recall and F1 of a membership attack's hard decisions, members being positive.

    The readouts FedEraser (Liu et al., "FedEraser: Enabling Efficient Client-Level Data Removal
    from Federated Learning Models", IWQoS 2021) reports for its membership-inference attack.

    Parameters
    ----------
    predicted_members_among_members : array_like of bool, shape (n,)
        The attack's decision ("member") on each true member; at least one.
    predicted_members_among_nonmembers : array_like of bool, shape (m,)
        The attack's decision on each true non-member; may be empty.

    Returns
    -------
    dict
        ``precision`` = TP / (TP + FP), defined as 0 when nothing is predicted a member;
        ``recall`` = TP / n; ``f1`` = their harmonic mean, 0 when both are 0.
    """
    on_members = _predictions(
        predicted_members_among_members, "predicted_members_among_members", allow_empty=False
    )
    on_nonmembers = _predictions(
        predicted_members_among_nonmembers, "predicted_members_among_nonmembers", allow_empty=True
    )
    true_positives = int(on_members.sum())
    false_positives = int(on_nonmembers.sum())
    predicted = true_positives + false_positives
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / on_members.size
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def threshold_summary(member_scores: object, nonmember_scores: object) -> dict[str, float]:
    """AUC and the exact TPR at 1% and 0.1% FPR of a score (Carlini et al., 2022).

    Returns
    -------
    dict
        Keys ``auc``, ``tpr_at_1pct_fpr`` and ``tpr_at_0.1pct_fpr``.
    """
    members, nonmembers = _both(member_scores, nonmember_scores)
    return {
        "auc": roc_auc(members, nonmembers),
        "tpr_at_1pct_fpr": tpr_at_fpr(members, nonmembers, 0.01),
        "tpr_at_0.1pct_fpr": tpr_at_fpr(members, nonmembers, 0.001),
    }
