"""The forgetting score F of the NeurIPS 2023 Machine Unlearning challenge.

Triantafillou, Kairouz, Pedregosa, Hayes et al., "Are we making progress in unlearning? Findings
from the first NeurIPS unlearning competition" (2024), Sec. 3; reference implementation
``metric.py`` of google-deepmind/unlearning_evaluation (``compute_forget_score_from_confs``), whose
math this module re-implements step by step:

1. Per forget example, the logit-scaled confidence under each of N unlearned and N retrained models
   (:func:`challenge_confidence`, the reference's ``compute_logit_scaled_confidence``).
2. The population with the larger median confidence is the *positive* one. Every threshold of two
   decision-rule families is tried (:func:`_single_threshold_rates`,
   :func:`_double_threshold_rates`); each gives (FPR, FNR) and
   ε = max(log(1 − δ − FPR) − log FNR, log(1 − δ − FNR) − log FPR), δ = 1e-5, floored at 0; the
   example's ε is the largest over thresholds, capped at 50 (:func:`per_example_epsilons`).
3. ε falls into buckets of width 0.5 worth 1, 1/2, 1/4, ... points, up to ⌈log(N − 1)⌉; an ε beyond
   scores 0. F is the mean of the points over the forget set (:func:`bucket_scores`), so F = 1 when
   no example is distinguishable and F = 0 when every one is.
4. The final score is F × (retain accuracy U / R) × (test accuracy U / R), accuracies averaged over
   the models (``main.py`` of the same repository; :func:`final_score`).

The reference computes the threshold rates in float32 on a GPU; here they are exact counts in
float64, found by binary search in the sorted confidences rather than by comparing every model with
every threshold. One deliberate departure: where no threshold survives (both populations the same
constant, so every rule has FPR·FNR = 0) the reference stops on an assertion; here that example's
ε is 0, the populations being indistinguishable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import ConfigError

#: δ of the (ε, δ) bound each attack's error rates imply (the reference's ``DELTA``).
DELTA = 1e-5
#: The largest ε an example can get (``EPSILON_CAP``): perfectly separated or degenerate examples.
EPSILON_CAP = 50.0
#: Thresholds per unit of confidence (``NUM_THRESHOLDS_PER_UNIT``).
THRESHOLDS_PER_UNIT = 100
#: How far the double-threshold rule's thresholds reach beyond the peakier population (``buffer``).
DOUBLE_THRESHOLD_BUFFER = 2.0
#: Width of an ε bucket; bucket k (ε in [k/2, (k+1)/2)) is worth 2^-k points.
BUCKET_WIDTH = 0.5
#: Added to both probabilities before the logs of the confidence (the reference's 1e-45).
CONFIDENCE_OFFSET = 1e-45
#: Below this ratio of the two populations' ranges the peakier one is "very peaky" and ε = cap.
PEAKY_RATIO = 0.01


def challenge_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Logit-scaled confidence φ = log(p_y + 1e-45) − log(Σ_{k≠y} p_k + 1e-45), as the challenge
    computes it (``compute_logit_scaled_confidence`` in ``metric.py``, itself LiRA's stable form).

    The reference subtracts each row's largest logit, exponentiates in the logits' own dtype, then
    normalises in float64; so does this function. (The additive 1e-45 saturates φ near ±103.6,
    unlike :func:`fedunlearn.membership.lira.logit_confidence`, whose floor is 1e-300.)

    Parameters
    ----------
    logits : array (..., n, C)
        Raw outputs; leading axes (models) are kept.
    labels : int array (n,)
        True labels in [0, C).

    Returns
    -------
    numpy.ndarray of shape (..., n), float64
    """
    z = np.asarray(logits)
    y = np.asarray(labels)
    if z.ndim < 2 or z.shape[-1] < 2:
        raise ConfigError("logits", f"array of shape {z.shape}", "an array (..., n, C), C >= 2")
    if not np.issubdtype(z.dtype, np.floating):
        z = z.astype(np.float64)
    if not np.all(np.isfinite(z)):
        raise ConfigError("logits", "array with NaN or inf", "finite logits")
    if y.ndim != 1 or len(y) != z.shape[-2] or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError("labels", f"array {y.dtype} {y.shape}", f"{z.shape[-2]} integer labels")
    if len(y) and (y.min() < 0 or y.max() >= z.shape[-1]):
        raise ConfigError("labels", "labels out of range", f"integers in [0, {z.shape[-1]})")
    probs = np.exp(z - z.max(axis=-1, keepdims=True)).astype(np.float64)
    probs /= probs.sum(axis=-1, keepdims=True)
    onehot = np.arange(z.shape[-1]) == y[:, None]
    p_true = np.where(onehot, probs, 0.0).sum(axis=-1)
    p_wrong = np.where(onehot, 0.0, probs).sum(axis=-1)
    return np.log(p_true + CONFIDENCE_OFFSET) - np.log(p_wrong + CONFIDENCE_OFFSET)


def _fraction_in(sorted_confs: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Fraction of the (sorted) confidences c with left ≤ c ≤ right, per threshold pair."""
    inside = np.searchsorted(sorted_confs, right, "right") - np.searchsorted(sorted_confs, left)
    return inside / len(sorted_confs)


def _double_threshold_rates(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, ...]:
    """(TPR, FNR, FPR, TNR) of "positive iff left ≤ φ ≤ right" (``_get_double_threshold_rates``).

    The peakier population (the smaller range; on a tie, the first) becomes the positive one. The
    right thresholds run in steps of 1/100 over [min + w − 2, max + 2] of that population, w being
    the smaller range; for each, 400 left thresholds over [right − w − 2, right − w + 2].
    """
    pos_range, neg_range = np.ptp(pos), np.ptp(neg)
    width = min(pos_range, neg_range)
    if pos_range >= neg_range:
        pos, neg = neg, pos
    buffer = DOUBLE_THRESHOLD_BUFFER
    low, high = pos.min() + width - buffer, pos.max() + buffer
    right = np.linspace(low, high, int(np.ceil((high - low) * THRESHOLDS_PER_UNIT)))
    num_left = int(np.ceil(2 * buffer * THRESHOLDS_PER_UNIT))
    left = np.linspace(right - width - buffer, right - width + buffer, num_left, axis=1).ravel()
    right = np.repeat(right, num_left)
    tpr = _fraction_in(np.sort(pos), left, right)
    fpr = _fraction_in(np.sort(neg), left, right)
    return tpr, 1.0 - tpr, fpr, 1.0 - fpr


def _single_threshold_rates(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, ...]:
    """(TPR, FNR, FPR, TNR) of "positive iff φ ≥ t" (``_get_single_threshold_rates``): t in steps of
    1/100 over the range of both populations together (none when they are one value)."""
    both = np.concatenate([pos, neg])
    low, high = both.min(), both.max()
    thresholds = np.linspace(low, high, int(np.ceil((high - low) * THRESHOLDS_PER_UNIT)))
    below_pos = np.searchsorted(np.sort(pos), thresholds) / len(pos)
    below_neg = np.searchsorted(np.sort(neg), thresholds) / len(neg)
    return 1.0 - below_pos, below_pos, 1.0 - below_neg, below_neg


def _threshold_epsilons(tpr, fnr, fpr, tnr, delta: float) -> np.ndarray:
    """ε of every threshold, NaN where the reference discards it (``_get_epsilons``).

    Perfect separation (FPR = FNR = 0, TPR = TNR = 1) gives +inf; a threshold with exactly one of
    FPR, FNR zero is discarded (too few samples to tell); otherwise
    ε = max(log(1 − δ − FPR) − log FNR, log(1 − δ − FNR) − log FPR) floored at 0, a NaN term
    (1 − δ − rate < 0) being ignored and two NaN terms discarding the threshold.
    """
    perfect = (fpr + fnr == 0) & (tpr + tnr == 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.log(1 - delta - fpr) - np.log(fnr)
        second = np.log(1 - delta - fnr) - np.log(fpr)
        epsilon = np.clip(np.fmax(first, second), 0, None)
    epsilon[~perfect & (fpr * fnr == 0)] = np.nan
    epsilon[perfect] = np.inf
    return epsilon


def _example_epsilon(pos: np.ndarray, neg: np.ndarray, delta: float) -> float:
    """One forget example's ε from the positive and negative populations' confidences."""
    pos_range, neg_range = np.ptp(pos), np.ptp(neg)
    largest, smallest = max(pos_range, neg_range), min(pos_range, neg_range)
    # A population far peakier than the other: the reference returns the cap outright, the
    # threshold search not being sensitive enough to see it in every case.
    if largest > 0 and smallest / largest < PEAKY_RATIO:
        return EPSILON_CAP
    rates = [
        np.concatenate(pair)
        for pair in zip(_double_threshold_rates(pos, neg), _single_threshold_rates(pos, neg))
    ]
    epsilon = _threshold_epsilons(*rates, delta)
    kept = epsilon[~np.isnan(epsilon)]
    return float(min(kept.max(), EPSILON_CAP)) if kept.size else 0.0


def _check_confidences(values: object, name: str, num_examples: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or (num_examples is not None and array.shape[1] != num_examples):
        examples = "n" if num_examples is None else num_examples
        raise ConfigError(
            name, f"array of shape {array.shape}", f"a 2-D array (models, {examples})"
        )
    if array.shape[0] < 2:
        raise ConfigError(name, f"{array.shape[0]} model(s)", "at least 2 models")
    if array.shape[1] < 1:
        raise ConfigError(name, "no examples", "at least one example")
    if not np.all(np.isfinite(array)):
        raise ConfigError(name, "array with NaN or inf", "finite confidences")
    return array


def per_example_epsilons(
    unlearned: np.ndarray, retrained: np.ndarray, *, delta: float = DELTA
) -> np.ndarray:
    """ε of every forget example, from the best single- and double-threshold attack between the
    unlearned and the retrained models' confidences (``_get_epsilons`` after
    ``compute_forget_score_from_confs``'s choice of the positive class: the larger median).

    Parameters
    ----------
    unlearned : array (N_u, n)
        Logit-scaled confidences of the n forget examples under N_u ≥ 2 unlearned models.
    retrained : array (N_r, n)
        The same under N_r ≥ 2 retrained models.
    delta : float
        δ of the bound (default 1e-5).

    Returns
    -------
    numpy.ndarray (n,)
        ε in [0, 50] per example.
    """
    unlearned = _check_confidences(unlearned, "unlearned")
    retrained = _check_confidences(retrained, "retrained", unlearned.shape[1])
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise ConfigError("delta", delta, "a number in [0, 1)")
    retrain_is_positive = np.median(retrained, axis=0) > np.median(unlearned, axis=0)
    epsilons = np.empty(unlearned.shape[1])
    for i, retrain_positive in enumerate(retrain_is_positive):
        pos, neg = (retrained, unlearned) if retrain_positive else (unlearned, retrained)
        epsilons[i] = _example_epsilon(pos[:, i], neg[:, i], float(delta))
    return np.clip(epsilons, 0.0, EPSILON_CAP)


def bucket_scores(epsilons: np.ndarray, num_models: int) -> np.ndarray:
    """Points per example: 2^-k for ε in bucket k = ⌊ε / 0.5⌋ when k < 2⌈log(N − 1)⌉, else 0.

    ``num_models`` is N, the number of *unlearned* models (the reference's ``num_models``); the
    highest bucket end ⌈log(N − 1)⌉ is its estimate of the largest ε N models can show.
    """
    if isinstance(num_models, bool) or not isinstance(num_models, (int, np.integer)):
        raise ConfigError("num_models", num_models, "an integer >= 2")
    if num_models < 2:
        raise ConfigError("num_models", num_models, "an integer >= 2")
    eps = np.asarray(epsilons, dtype=np.float64)
    if eps.ndim != 1 or np.any(np.isnan(eps)):
        raise ConfigError("epsilons", f"array of shape {eps.shape}", "a 1-D array without NaN")
    max_epsilon = np.ceil(np.log(num_models - 1))
    num_buckets = int(round(max_epsilon / BUCKET_WIDTH))
    bucket = np.floor(eps / BUCKET_WIDTH)
    return np.where(bucket < num_buckets, BUCKET_WIDTH**bucket, 0.0)


@dataclass(frozen=True)
class ForgettingScore:
    """The challenge's forgetting score of one population against the retrained one.

    Attributes
    ----------
    epsilons : array (n,)
        Per-example ε (:func:`per_example_epsilons`).
    scores : array (n,)
        Per-example points (:func:`bucket_scores`); their mean is F.
    f : float
        The forgetting score F in [0, 1].
    """

    epsilons: np.ndarray
    scores: np.ndarray
    f: float


def forgetting_score(
    unlearned: np.ndarray, retrained: np.ndarray, *, delta: float = DELTA
) -> ForgettingScore:
    """F of ``unlearned`` (N_u, n) against ``retrained`` (N_r, n) logit-scaled confidences on the
    forget set (``compute_forget_score_from_confs``): per-example ε, bucket points, their mean."""
    epsilons = per_example_epsilons(unlearned, retrained, delta=delta)
    scores = bucket_scores(epsilons, int(np.shape(unlearned)[0]))
    return ForgettingScore(epsilons=epsilons, scores=scores, f=float(scores.mean()))


def final_score(
    f: float,
    unlearned_retain_accuracy: np.ndarray,
    retrained_retain_accuracy: np.ndarray,
    unlearned_test_accuracy: np.ndarray,
    retrained_test_accuracy: np.ndarray,
) -> float:
    """The challenge's final score F × (mean retain accuracy U / R) × (mean test accuracy U / R)
    (``main.py`` of google-deepmind/unlearning_evaluation): forgetting scaled by kept utility."""
    means = {}
    for name, values in (
        ("unlearned_retain_accuracy", unlearned_retain_accuracy),
        ("retrained_retain_accuracy", retrained_retain_accuracy),
        ("unlearned_test_accuracy", unlearned_test_accuracy),
        ("retrained_test_accuracy", retrained_test_accuracy),
    ):
        array = np.asarray(values, dtype=np.float64).ravel()
        if array.size == 0 or not np.all(np.isfinite(array)):
            raise ConfigError(name, values, "a non-empty array of finite accuracies")
        means[name] = array.mean()
    for name in ("retrained_retain_accuracy", "retrained_test_accuracy"):
        if means[name] <= 0:
            raise ConfigError(name, means[name], "a mean accuracy > 0 (it divides)")
    retain_ratio = means["unlearned_retain_accuracy"] / means["retrained_retain_accuracy"]
    test_ratio = means["unlearned_test_accuracy"] / means["retrained_test_accuracy"]
    return float(f) * retain_ratio * test_ratio
