"""Percentile bootstrap intervals for the judge's statistics (Efron and Tibshirani, "An
Introduction to the Bootstrap", 1993, Ch. 13).

A statistic is recomputed on ``resamples`` resamples drawn with replacement along the first axis of
its data (examples or models); the interval is the (1 − level)/2 and (1 + level)/2 quantiles of the
recomputed values. Two-sample statistics (an AUC of members against non-members) resample each
sample separately, so each keeps its size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import ConfigError


@dataclass(frozen=True)
class Estimate:
    """A statistic and its bootstrap interval [low, high] (NaN when not measured)."""

    value: float
    low: float
    high: float

    @classmethod
    def missing(cls) -> Estimate:
        """Not measured in this run (e.g. no backdoor planted)."""
        return cls(math.nan, math.nan, math.nan)

    def scaled(self, factor: float) -> Estimate:
        """The estimate times a fixed factor (an interval of F carried to the final score)."""
        return Estimate(self.value * factor, self.low * factor, self.high * factor)


def _check_options(resamples: int, level: float) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise ConfigError("resamples", resamples, "an integer >= 1")
    if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
        raise ConfigError("level", level, "a number in (0, 1)")


def _check_sample(values: object, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim < 1 or len(array) < 2:
        raise ConfigError(name, f"array of shape {array.shape}", "at least 2 entries on axis 0")
    return array


def _interval(value: float, replicates: np.ndarray, level: float) -> Estimate:
    finite = replicates[np.isfinite(replicates)]
    if not np.isfinite(value) or finite.size == 0:
        return Estimate(float(value), math.nan, math.nan)
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(float(value), float(low), float(high))


def bootstrap_interval(
    values: object,
    statistic: Callable[[np.ndarray], float],
    *,
    resamples: int = 1000,
    level: float = 0.95,
    rng: np.random.Generator,
) -> Estimate:
    """``statistic(values)`` with its percentile bootstrap interval over axis 0 of ``values``.

    Parameters
    ----------
    values : array (n, ...)
        The data; rows (examples or models) are resampled with replacement, n ≥ 2.
    statistic : callable
        Maps an array shaped like ``values`` to a float.
    resamples : int
        Number of bootstrap resamples B (default 1000).
    level : float
        Coverage of the interval (default 0.95).
    rng : numpy.random.Generator
        Source of the resamples (seeded by the caller, so intervals are reproducible).
    """
    _check_options(resamples, level)
    array = _check_sample(values, "values")
    indices = rng.integers(0, len(array), size=(resamples, len(array)))
    replicates = np.array([statistic(array[rows]) for rows in indices], dtype=np.float64)
    return _interval(statistic(array), replicates, level)


def bootstrap_two_samples(
    first: object,
    second: object,
    statistic: Callable[[np.ndarray, np.ndarray], float],
    *,
    resamples: int = 1000,
    level: float = 0.95,
    rng: np.random.Generator,
) -> Estimate:
    """``statistic(first, second)`` with its percentile interval, the two samples resampled
    separately along axis 0 (members and non-members of an AUC; unpaired).

    Parameters are as for :func:`bootstrap_interval`; each sample needs at least 2 rows.
    """
    _check_options(resamples, level)
    a = _check_sample(first, "first")
    b = _check_sample(second, "second")
    rows_a = rng.integers(0, len(a), size=(resamples, len(a)))
    rows_b = rng.integers(0, len(b), size=(resamples, len(b)))
    replicates = np.array([statistic(a[i], b[j]) for i, j in zip(rows_a, rows_b)], dtype=np.float64)
    return _interval(statistic(a, b), replicates, level)


def mean_interval(
    values: object, *, resamples: int = 1000, level: float = 0.95, rng: np.random.Generator
) -> Estimate:
    """The mean of a 1-D sample (per-example points, per-model accuracies) with its interval;
    resampled means are computed at once rather than one call per resample."""
    _check_options(resamples, level)
    array = np.asarray(_check_sample(values, "values"), dtype=np.float64)
    if array.ndim != 1 or not np.all(np.isfinite(array)):
        raise ConfigError("values", f"array of shape {array.shape}", "a 1-D array of finite values")
    indices = rng.integers(0, len(array), size=(resamples, len(array)))
    return _interval(float(array.mean()), array[indices].mean(axis=1), level)


def roc_bootstrap(
    members: object,
    nonmembers: object,
    *,
    fpr: float = 0.001,
    resamples: int = 1000,
    level: float = 0.95,
    rng: np.random.Generator,
) -> tuple[Estimate, Estimate]:
    """AUC and TPR at ``fpr`` of the pooled scores, each with its percentile interval, the rows
    (examples; columns are models) of ``members`` and ``nonmembers`` resampled separately.

    The same statistics as :func:`fedunlearn.membership.metrics.roc_auc` and ``tpr_at_fpr`` on the
    resampled arrays (ties count 1/2; "member iff score >= t"), computed without building them: the
    scores are sorted once, and a resample weighs each score by how often its row was drawn. One
    resample then costs two weighted counts and a cumulative sum over the distinct scores, which
    keeps a population set of 10,000 examples x N models affordable.
    """
    _check_options(resamples, level)
    m = np.asarray(_check_sample(members, "members"), dtype=np.float64)
    z = np.asarray(_check_sample(nonmembers, "nonmembers"), dtype=np.float64)
    m, z = m.reshape(len(m), -1), z.reshape(len(z), -1)
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(z))):
        raise ConfigError("members", "scores with NaN or inf", "finite scores")
    _, inverse = np.unique(np.concatenate([m.ravel(), z.ravel()]), return_inverse=True)
    groups = (inverse[: m.size], inverse[m.size :], int(inverse.max()) + 1)

    def statistics(member_rows: np.ndarray, nonmember_rows: np.ndarray) -> tuple[float, float]:
        return _weighted_roc(
            groups, np.repeat(member_rows, m.shape[1]), np.repeat(nonmember_rows, z.shape[1]), fpr
        )

    replicates = np.array(
        [statistics(_row_counts(len(m), rng), _row_counts(len(z), rng)) for _ in range(resamples)]
    )
    value = statistics(np.ones(len(m)), np.ones(len(z)))
    return (
        _interval(value[0], replicates[:, 0], level),
        _interval(value[1], replicates[:, 1], level),
    )


def _row_counts(n: int, rng: np.random.Generator) -> np.ndarray:
    """How often each of n rows is drawn in one resample with replacement."""
    return np.bincount(rng.integers(0, n, size=n), minlength=n).astype(np.float64)


def _weighted_roc(groups, member_weights, nonmember_weights, fpr: float) -> tuple[float, float]:
    """AUC and TPR at ``fpr`` of weighted scores, given each score's rank among the distinct
    values (``groups``: member ranks, non-member ranks, number of distinct values)."""
    member_ranks, nonmember_ranks, distinct = groups
    wm = np.bincount(member_ranks, weights=member_weights, minlength=distinct)
    wz = np.bincount(nonmember_ranks, weights=nonmember_weights, minlength=distinct)
    total_m, total_z = wm.sum(), wz.sum()
    below_z = np.cumsum(wz) - wz
    auc = float((wm * (below_z + 0.5 * wz)).sum() / (total_m * total_z))
    true_positives = total_m - (np.cumsum(wm) - wm)  # members scoring >= each distinct value
    false_positives = total_z - below_z
    feasible = false_positives <= math.floor(fpr * total_z + 1e-9)
    tpr = float(true_positives[feasible].max()) / total_m if feasible.any() else 0.0
    return auc, tpr
