"""U-LiRA: the per-example likelihood-ratio test of unlearning.

Hayes, Shumailov, Triantafillou, Khalifa and Papernot, "Inexact Unlearning Needs More Careful
Evaluations to Avoid a False Sense of Privacy", SaTML 2025 (arXiv:2403.01218), Sec. 4: LiRA
(Carlini et al. 2022) adapted to unlearning. For each forget example the attacker fits one Gaussian
to the example's logit-scaled confidences under models that trained on it and then *unlearned* it,
and one to those under models *retrained* without it; a model under test is called "unlearned" when

    Λ = log N(φ; μ_U, σ_U²) − log N(φ; μ_R, σ_R²) > 0.

The game is balanced (as many unlearned as retrained models under test), so its accuracy is 50%
when unlearning is perfect (the two populations cannot be told apart) and 100% when every test
succeeds. Here both populations serve as shadow models and as models under test: each model is
tested in turn against Gaussians fitted *without it* (leave one model out), so its own confidence
never informs the test it faces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from fedunlearn.errors import ConfigError
from fedunlearn.membership.metrics import tpr_at_fpr

#: Standard deviations are floored here so that a population that never varies gives a finite Λ.
MIN_STD = 1e-3


@dataclass(frozen=True)
class ULiraResult:
    """U-LiRA on one unlearned population against the retrained one.

    Attributes
    ----------
    accuracy : float
        Balanced accuracy of "unlearned iff Λ > 0" over every (model, example): the mean of the
        true-positive rate on unlearned models and the true-negative rate on retrained ones (plain
        accuracy when N_u = N_r). 0.5 is perfect forgetting.
    tpr_at_1pct, tpr_at_0_1pct : float
        TPR at 1% and 0.1% FPR of Λ pooled over models and examples (unlearned = positive).
    scores : array (N_u + N_r, n)
        Λ of every held-out model (unlearned models first) on every example.
    labels : bool array (N_u + N_r,)
        True for the unlearned models' rows.
    """

    accuracy: float
    tpr_at_1pct: float
    tpr_at_0_1pct: float
    scores: np.ndarray
    labels: np.ndarray


def _check(values: object, name: str, num_examples: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    expected = "n" if num_examples is None else num_examples
    if array.ndim != 2 or (num_examples is not None and array.shape[1] != num_examples):
        raise ConfigError(
            name, f"array of shape {array.shape}", f"a 2-D array (models, {expected})"
        )
    if array.shape[0] < 3:
        raise ConfigError(
            name, f"{array.shape[0]} model(s)", "at least 3 models (2 left after holding one out)"
        )
    if array.shape[1] < 1 or not np.all(np.isfinite(array)):
        raise ConfigError(name, "empty or non-finite confidences", "finite confidences")
    return array


def _fits(confs: np.ndarray, min_std: float) -> tuple[np.ndarray, ...]:
    """Per-example mean and std (ddof = 1) of all N models, and of the N − 1 left after holding
    out each model m (row m of the (N, n) leave-one-out arrays), from deviations d = φ − μ:
    μ₋ₘ = μ − dₘ/(N − 1) and (N − 2) s²₋ₘ = Σ_j d_j² − dₘ² − dₘ²/(N − 1)."""
    n = len(confs)
    mean = confs.mean(axis=0)
    deviations = confs - mean
    squares = (deviations**2).sum(axis=0)
    std = np.maximum(np.sqrt(squares / (n - 1)), min_std)
    loo_mean = mean - deviations / (n - 1)
    loo_squares = np.maximum(squares - deviations**2 * n / (n - 1), 0.0)
    loo_std = np.maximum(np.sqrt(loo_squares / (n - 2)), min_std)
    return mean, std, loo_mean, loo_std


def ulira_scores(
    unlearned: np.ndarray, retrained: np.ndarray, *, min_std: float = MIN_STD
) -> tuple[np.ndarray, np.ndarray]:
    """Λ of every model of both populations on every example, leave one model out.

    Parameters
    ----------
    unlearned, retrained : arrays (N_u, n) and (N_r, n)
        Logit-scaled confidences on the n forget examples; N_u, N_r ≥ 3.
    min_std : float
        Floor of every fitted standard deviation.

    Returns
    -------
    scores : array (N_u + N_r, n)
        Λ = log N(φ; μ_U, σ_U²) − log N(φ; μ_R, σ_R²), the held-out model's own population fitted
        without it; unlearned models' rows first.
    labels : bool array (N_u + N_r,)
        True on the unlearned models' rows.
    """
    unlearned = _check(unlearned, "unlearned")
    retrained = _check(retrained, "retrained", unlearned.shape[1])
    if not (isinstance(min_std, (int, float)) and min_std > 0):
        raise ConfigError("min_std", min_std, "a number > 0")
    mu_u, sd_u, loo_mu_u, loo_sd_u = _fits(unlearned, min_std)
    mu_r, sd_r, loo_mu_r, loo_sd_r = _fits(retrained, min_std)
    on_unlearned = norm.logpdf(unlearned, loo_mu_u, loo_sd_u) - norm.logpdf(unlearned, mu_r, sd_r)
    on_retrained = norm.logpdf(retrained, mu_u, sd_u) - norm.logpdf(retrained, loo_mu_r, loo_sd_r)
    labels = np.r_[np.ones(len(unlearned), bool), np.zeros(len(retrained), bool)]
    return np.concatenate([on_unlearned, on_retrained]), labels


def ulira_summary(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float, float]:
    """(balanced accuracy of Λ > 0, TPR at 1% FPR, TPR at 0.1% FPR) of U-LiRA scores (rows =
    models, labelled by ``labels``); callers bootstrap it over examples (columns)."""
    positives, negatives = scores[labels].ravel(), scores[~labels].ravel()
    accuracy = 0.5 * (np.mean(positives > 0) + np.mean(negatives <= 0))
    return (
        float(accuracy),
        tpr_at_fpr(positives, negatives, 0.01),
        tpr_at_fpr(positives, negatives, 0.001),
    )


def ulira(unlearned: np.ndarray, retrained: np.ndarray, *, min_std: float = MIN_STD) -> ULiraResult:
    """U-LiRA of ``unlearned`` against ``retrained`` confidences (see :func:`ulira_scores`)."""
    scores, labels = ulira_scores(unlearned, retrained, min_std=min_std)
    accuracy, tpr_1, tpr_01 = ulira_summary(scores, labels)
    return ULiraResult(accuracy, tpr_1, tpr_01, scores, labels)
