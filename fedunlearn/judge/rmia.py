"""Offline RMIA, the relative membership inference attack.

Zarifzadeh, Liu, Lee and Shokri, "Low-Cost High-Power Membership Inference Attacks", ICML 2024,
Sec. 3 (eq. 3-4) and App. B.2.1 (offline scaling); reference implementation ``run_rmia`` and
``get_out_ref_signals`` in ``modules/mia/attacks/rmia.py`` of privacytrustlab/ml_privacy_meter. With
``p(x | θ)`` the target model's softmax probability of x's true label:

* Pr(x) ≈ ((1 + a) / 2) · mean_OUT p(x | θ') + (1 − a) / 2, the mean over OUT reference models θ'
  scaled up to stand in for (P_IN + P_OUT) / 2 when no IN model exists (offline, a = 0.3 the
  reference's default; it tunes a on a paired model when memberships are known, the judge's setting
  has none);
* LR(x, z) = (p(x | θ) / Pr(x)) / (p(z | θ) / Pr(z)) for population samples z (non-members);
* Score(x) = fraction of z with LR(x, z) > γ, γ = 1 (the code's strict ``>``).

A higher score means "more likely a member". Offline LiRA for comparison is
:func:`fedunlearn.membership.lira.lira_offline`.
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax

from fedunlearn.errors import ConfigError
from fedunlearn.membership.metrics import roc_auc, tpr_at_fpr

#: The offline scaling a of the reference (``offline_a``'s default in ml_privacy_meter).
OFFLINE_A = 0.3
#: γ: how much more likely x must be than z, relative to the population (the reference's 1).
GAMMA = 1.0


def true_label_probability(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Softmax probability of the true label, p(x | θ), of (..., n, C) logits and n labels: the
    signal RMIA reads (``get_softmax`` of ml_privacy_meter)."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if z.ndim < 2 or z.shape[-2] != len(y) or not np.all(np.isfinite(z)):
        raise ConfigError("logits", f"array of shape {z.shape}", f"finite (..., {len(y)}, C)")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError("labels", f"array {y.dtype} {y.shape}", "a 1-D integer array")
    probs = softmax(z, axis=-1)
    return (probs * (np.arange(probs.shape[-1]) == y[:, None])).sum(axis=-1)


def _probabilities(values: object, name: str, ndim: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != ndim or array.shape[-1] < 1:
        shape = "(n,)" if ndim == 1 else "(models, n)"
        raise ConfigError(name, f"array of shape {array.shape}", f"a non-empty array {shape}")
    if not np.all((array >= 0) & (array <= 1)):  # also refuses NaN
        raise ConfigError(name, "values outside [0, 1] or NaN", "probabilities")
    return array


def _relative_likelihood(target: np.ndarray, reference: np.ndarray, offline_a: float) -> np.ndarray:
    """p(x | θ) / Pr(x) with Pr(x) the offline-scaled mean over the OUT reference models."""
    pr_x = (1 + offline_a) / 2 * reference.mean(axis=0) + (1 - offline_a) / 2
    return target / pr_x


def rmia_scores(
    target_x: np.ndarray,
    target_z: np.ndarray,
    reference_x: np.ndarray,
    reference_z: np.ndarray,
    *,
    offline_a: float = OFFLINE_A,
    gamma: float = GAMMA,
    x_in_z: bool = False,
) -> np.ndarray:
    """RMIA score of every candidate x (``run_rmia`` with OUT reference models only).

    Parameters
    ----------
    target_x, target_z : arrays (n_x,), (n_z,)
        The target model's true-label probabilities on the candidates and on the population data.
    reference_x, reference_z : arrays (m, n_x), (m, n_z)
        The same under m ≥ 1 reference models that trained on neither.
    offline_a : float
        The offline scaling a in [0, 1).
    gamma : float
        γ ≥ 1 (the score counts z with LR(x, z) > γ).
    x_in_z : bool
        The candidates *are* the population samples (scoring non-members drawn from z): each x is
        then compared with the other n_z − 1 samples only.

    Returns
    -------
    numpy.ndarray (n_x,)
        Fractions in [0, 1].
    """
    tx, tz = _probabilities(target_x, "target_x", 1), _probabilities(target_z, "target_z", 1)
    rx = _probabilities(reference_x, "reference_x", 2)
    rz = _probabilities(reference_z, "reference_z", 2)
    if rx.shape != (rx.shape[0], len(tx)) or rz.shape != (rx.shape[0], len(tz)):
        raise ConfigError(
            "reference_x", f"shapes {rx.shape}, {rz.shape}", f"(m, {len(tx)}) and (m, {len(tz)})"
        )
    if not (isinstance(offline_a, (int, float)) and 0.0 <= offline_a < 1.0):
        raise ConfigError("offline_a", offline_a, "a number in [0, 1)")
    if not (isinstance(gamma, (int, float)) and gamma >= 1.0):
        raise ConfigError("gamma", gamma, "a number >= 1")
    if x_in_z and len(tx) != len(tz):
        raise ConfigError("x_in_z", x_in_z, "False unless the candidates are the population")
    ratio_x = _relative_likelihood(tx, rx, offline_a)
    ratio_z = np.sort(_relative_likelihood(tz, rz, offline_a))
    # LR(x, z) > γ  <=>  ratio_z < ratio_x / γ: a count by binary search instead of n_x · n_z pairs.
    # A candidate compared with itself has LR = 1, never > γ, so x_in_z only changes the divisor.
    counts = np.searchsorted(ratio_z, ratio_x / gamma, side="left")
    return counts / (len(tz) - 1 if x_in_z else len(tz))


def rmia_member_scores(
    target_forget: np.ndarray,
    target_population: np.ndarray,
    reference_forget: np.ndarray,
    reference_population: np.ndarray,
    *,
    offline_a: float = OFFLINE_A,
) -> tuple[np.ndarray, np.ndarray]:
    """RMIA scores of the forget set (members) and of the population data (non-members, each
    compared with the rest of the population), one row per target model.

    Parameters
    ----------
    target_forget, target_population : arrays (T, n_f), (T, n_p)
        True-label probabilities under each of T target models.
    reference_forget, reference_population : arrays (m, n_f), (m, n_p)
        The same under m OUT reference models (shared by every target).

    Returns
    -------
    members, nonmembers : arrays (n_f, T), (n_p, T)
        Scores with examples first (the bootstrap resamples examples).
    """
    forget = _probabilities(target_forget, "target_forget", 2)
    population = _probabilities(target_population, "target_population", 2)
    if len(forget) != len(population):
        raise ConfigError("target_population", population.shape, f"{len(forget)} target models")
    members = [
        rmia_scores(fx, pz, reference_forget, reference_population, offline_a=offline_a)
        for fx, pz in zip(forget, population)
    ]
    nonmembers = [
        rmia_scores(
            pz, pz, reference_population, reference_population, offline_a=offline_a, x_in_z=True
        )
        for pz in population
    ]
    return np.array(members).T, np.array(nonmembers).T


def attack_summary(members: np.ndarray, nonmembers: np.ndarray) -> tuple[float, float]:
    """(AUC, TPR at 0.1% FPR) of pooled member and non-member scores (any shapes)."""
    m, n = np.ravel(members), np.ravel(nonmembers)
    return roc_auc(m, n), tpr_at_fpr(m, n, 0.001)
