"""Likelihood-ratio membership inference (LiRA) on a model's softmax outputs.

Carlini, Chien, Nasr, Song, Terzis and Tramèr, "Membership Inference Attacks From First
Principles", IEEE S&P 2022 (arXiv:2112.03570). For a target example (x, y) the attack observes
the target model's logit-scaled confidence φ = log(p_y / (1 − p_y)) and asks how likely that value
is under the distribution of φ seen on reference ("shadow") models trained with (IN) or without
(OUT) the example. Both distributions are fitted per example as Gaussians (Sec. IV, Algorithm 1):

* online:  Λ = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²), the log likelihood ratio;
* offline: Λ = log Pr[Z ≤ φ], Z ~ N(μ_out, σ_out²), the one-sided test of Algorithm 1's offline
  variant (members are expected to have *higher* confidence than the OUT models give them).

With few reference models the paper recommends one variance shared by all examples ("fixed" or
global variance) instead of a per-example one. Here that global variance is the pooled
within-example variance Σ_i (m_i − 1) s_i² / Σ_i (m_i − 1), which is the mean of the per-example
variances when every example has the same number m_i of observations. (The authors' reference code
instead takes the standard deviation of all observations together, which also counts the spread of
the per-example means; the pooled estimate keeps LiRA's per-example calibration intact.)

Convention throughout: a higher score means "more likely a member". Scores are log quantities and
may be very negative; they are meant for ranking and thresholding (ROC, TPR at low FPR).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import norm

from fedunlearn.errors import ConfigError

#: Probabilities are clipped to at least this before taking logs, so that p_y = 1 (or 0) gives
#: a finite confidence of about ±690.8 rather than ±inf. It sits near float64's smallest normal
#: number so that a well-trained model's confident examples (1 - p_y of 1e-15 or less is common on
#: MNIST) keep distinct confidences: a floor of 1e-12 tied one in seven of them.
PROB_FLOOR = 1e-300


def logit_confidence(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Logit-scaled confidence on the true label, φ = log p_y − log Σ_{k≠y} p_k.

    This is the paper's logit scaling φ(p) = log(p / (1 − p)) of the true-label probability
    p = f(x)_y (Carlini et al. 2022, Sec. IV), which makes the per-example confidence distributions
    close to Gaussian. Following the authors' stable form, 1 − p_y is computed as the sum of the
    other classes' probabilities rather than by subtraction, so confidences near 1 keep their
    resolution. Both terms are floored at :data:`PROB_FLOOR` = 1e-300, hence
    |φ| ≤ log(1e300) ≈ 690.8 and p_y = 1 or p_y = 0 stay finite.

    Parameters
    ----------
    probs : array of shape (n, K)
        Softmax outputs of the model, non-negative and each row summing to 1 (within 1e-3).
    labels : array of shape (n,)
        Integer true labels in ``[0, K)``.

    Returns
    -------
    numpy.ndarray of shape (n,), float64
        φ for each example; higher means more confident in the true label.

    Raises
    ------
    ConfigError
        If ``probs`` is not a finite, non-negative (n, K) array of probability rows with K ≥ 2, or
        ``labels`` is not an integer array of n labels in range.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ConfigError("probs", f"array of shape {p.shape}", "a 2-D array (n, K) with K >= 2")
    if not np.all(np.isfinite(p)) or np.any(p < 0.0):
        raise ConfigError("probs", "array with non-finite or negative entries", "probabilities")
    if not np.allclose(p.sum(axis=1), 1.0, atol=1e-3):
        raise ConfigError("probs", "rows not summing to 1", "softmax probabilities (not logits)")
    y = np.asarray(labels)
    if y.ndim != 1 or len(y) != len(p):
        raise ConfigError("labels", f"array of shape {y.shape}", f"a 1-D array of {len(p)} labels")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        raise ConfigError("labels", f"array of dtype {y.dtype}", "integer class labels")
    if len(y) and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ConfigError("labels", "labels out of range", f"integers in [0, {p.shape[1]})")
    p_true = p[np.arange(len(p)), y]
    p_rest = other_classes_mass(p, y)
    return np.log(np.maximum(p_true, PROB_FLOOR)) - np.log(np.maximum(p_rest, PROB_FLOOR))


def other_classes_mass(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``1 - p_y`` of each row, computed as the sum of the other classes' probabilities: when p_y
    is within 1e-16 of 1 the subtraction rounds to 0, the sum keeps its digits. Inputs are assumed
    valid (an (n, K) float array and n labels in range)."""
    rows = np.arange(len(probs))
    others = np.array(probs, dtype=np.float64, copy=True)
    others[rows, labels] = 0.0
    return others.sum(axis=1)


# ------------------------------------------------------------------------- validation helpers


def _check_min_std(min_std: float) -> float:
    value = float(min_std)
    if not (np.isfinite(value) and value > 0.0):
        raise ConfigError("min_std", min_std, "a finite number > 0")
    return value


def _check_target(target_phi: np.ndarray) -> np.ndarray:
    phi = np.asarray(target_phi, dtype=np.float64)
    if phi.ndim != 1:
        raise ConfigError("target_phi", f"array of shape {phi.shape}", "a 1-D array (n,)")
    if not np.all(np.isfinite(phi)):
        raise ConfigError("target_phi", "array with NaN or inf", "finite confidences")
    return phi


def _check_reference(reference: np.ndarray, name: str, n: int) -> np.ndarray:
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[1] != n:
        raise ConfigError(
            name,
            f"array of shape {ref.shape}",
            f"a 2-D array (m, {n}): one row per reference model",
        )
    if ref.shape[0] < 2:
        raise ConfigError(
            name,
            f"{ref.shape[0]} reference model(s)",
            "at least 2 reference models (a Gaussian's variance needs two observations)",
        )
    if not np.all(np.isfinite(ref)):
        raise ConfigError(name, "array with NaN or inf", "finite confidences")
    return ref


# ------------------------------------------------------------------------- Gaussian fits


def _fit_gaussians(
    observations: np.ndarray, *, global_variance: bool, min_std: float, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example mean and standard deviation from (m, n) observations, NaN = not observed.

    Per-example variances use ddof = 1. The pooled variance Σ_i (m_i − 1) s_i² / Σ_i (m_i − 1)
    runs over the examples with m_i ≥ 2 observations; it is used for every example when
    ``global_variance`` and otherwise for the examples with m_i < 2. Examples with m_i = 0 get a
    NaN mean. The standard deviation is floored at ``min_std``.
    """
    counts = np.sum(~np.isnan(observations), axis=0)
    sums = np.nansum(observations, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    squared = np.nansum((observations - means) ** 2, axis=0)  # Σ over observed models
    enough = counts >= 2
    if not np.any(enough):
        raise ConfigError(
            name,
            "no example observed under 2 or more reference models",
            "at least 2 reference models per example for at least one example",
        )
    pooled_variance = squared[enough].sum() / (counts[enough] - 1).sum()
    if global_variance:
        variance = np.full(observations.shape[1], pooled_variance)
    else:
        variance = np.where(enough, squared / np.maximum(counts - 1, 1), pooled_variance)
    return means, np.maximum(np.sqrt(variance), min_std)


def _offline_scores(phi: np.ndarray, mu_out: np.ndarray, sigma_out: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return norm.logcdf(phi, loc=mu_out, scale=sigma_out)


def _online_scores(
    phi: np.ndarray,
    mu_in: np.ndarray,
    sigma_in: np.ndarray,
    mu_out: np.ndarray,
    sigma_out: np.ndarray,
) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return norm.logpdf(phi, loc=mu_in, scale=sigma_in) - norm.logpdf(
            phi, loc=mu_out, scale=sigma_out
        )


# ------------------------------------------------------------------------- public attacks


def lira_offline(
    target_phi: np.ndarray,
    reference_out_phi: np.ndarray,
    *,
    global_variance: bool = True,
    min_std: float = 1e-3,
) -> np.ndarray:
    """Offline LiRA: Λ_i = log Pr[Z ≤ φ_i] with Z ~ N(μ_out,i, σ_out,i²).

    Carlini et al. 2022, Algorithm 1, offline variant (only OUT reference models are needed, so
    they can be trained once before the targets are known). For each example i a Gaussian is fitted
    to its confidences under the m reference models trained *without* it, and the target model's
    confidence is scored by the one-sided test Λ = 1 − Pr[Z > φ], taken here in log space with
    :func:`scipy.stats.norm.logcdf` so that very confident members keep distinct scores.

    Parameters
    ----------
    target_phi : array of shape (n,)
        Confidences φ (see :func:`logit_confidence`) of the attacked model on the n examples.
    reference_out_phi : array of shape (m, n), m ≥ 2
        Row j holds reference model j's confidences on the n examples, none of which it trained on.
    global_variance : bool, default True
        Use one variance for all examples, the pooled within-example variance (the mean of the
        per-example variances); recommended by the paper when m is small. If False each example
        uses its own sample variance (ddof = 1).
    min_std : float, default 1e-3
        Floor on σ_out so that an example with constant reference confidences does not give ±inf.

    Returns
    -------
    numpy.ndarray of shape (n,)
        Log-probability scores in (−inf, 0]; higher means more likely a member.

    Raises
    ------
    ConfigError
        On a shape mismatch, fewer than 2 reference models, NaN/inf values, or ``min_std`` ≤ 0.
    """
    std_floor = _check_min_std(min_std)
    phi = _check_target(target_phi)
    out = _check_reference(reference_out_phi, "reference_out_phi", len(phi))
    mu_out, sigma_out = _fit_gaussians(
        out, global_variance=global_variance, min_std=std_floor, name="reference_out_phi"
    )
    return _offline_scores(phi, mu_out, sigma_out)


def lira_online(
    target_phi: np.ndarray,
    reference_in_phi: np.ndarray,
    reference_out_phi: np.ndarray,
    *,
    global_variance: bool = True,
    min_std: float = 1e-3,
) -> np.ndarray:
    """Online LiRA: Λ_i = log N(φ_i; μ_in,i, σ_in,i²) − log N(φ_i; μ_out,i, σ_out,i²).

    Carlini et al. 2022, Algorithm 1: the log of the likelihood ratio between the IN and OUT
    Gaussians fitted to each example's confidences under reference models trained with it (IN) and
    without it (OUT). IN and OUT variances are estimated separately (each pooled over examples
    when ``global_variance``).

    Parameters
    ----------
    target_phi : array of shape (n,)
        Confidences φ of the attacked model on the n examples.
    reference_in_phi : array of shape (m_in, n), m_in ≥ 2
        Row j: confidences of IN reference model j, which trained on every one of the n examples.
    reference_out_phi : array of shape (m_out, n), m_out ≥ 2
        Row j: confidences of OUT reference model j, which trained on none of the n examples.
    global_variance : bool, default True
        Pool the variances over examples (see :func:`lira_offline`).
    min_std : float, default 1e-3
        Floor on σ_in and σ_out.

    Returns
    -------
    numpy.ndarray of shape (n,)
        Log likelihood ratios; higher means more likely a member.

    Raises
    ------
    ConfigError
        On a shape mismatch, fewer than 2 IN or OUT models, NaN/inf values, or ``min_std`` ≤ 0.
    """
    std_floor = _check_min_std(min_std)
    phi = _check_target(target_phi)
    ref_in = _check_reference(reference_in_phi, "reference_in_phi", len(phi))
    ref_out = _check_reference(reference_out_phi, "reference_out_phi", len(phi))
    mu_in, sigma_in = _fit_gaussians(
        ref_in, global_variance=global_variance, min_std=std_floor, name="reference_in_phi"
    )
    mu_out, sigma_out = _fit_gaussians(
        ref_out, global_variance=global_variance, min_std=std_floor, name="reference_out_phi"
    )
    return _online_scores(phi, mu_in, sigma_in, mu_out, sigma_out)


# ------------------------------------------------------------------------- accumulation


@dataclass
class LiraReference:
    """Reference-model confidences on n target examples, collected one reference model at a time.

    In the usual LiRA setup (Carlini et al. 2022, Sec. IV and Algorithm 1) each reference model
    trains on a random half of the candidate examples, so every example ends up with a variable
    number of IN and OUT observations. :meth:`add_model` records one model's φ row, split by its
    ``in_mask``; :meth:`scores` fits the per-example Gaussians with NaN-aware statistics.

    Attributes
    ----------
    n_examples : int or None
        Number of target examples; taken from the first row added when None.
    in_rows, out_rows : list of numpy.ndarray
        One (n,) row per added model, NaN where that model's observation belongs to the other side.
    """

    n_examples: int | None = None
    in_rows: list[np.ndarray] = field(default_factory=list, repr=False)
    out_rows: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def n_models(self) -> int:
        """Number of reference models added."""
        return len(self.out_rows)

    @property
    def in_phi(self) -> np.ndarray:
        """(n_models, n) IN confidences, NaN where the model did not train on the example."""
        return self._stack(self.in_rows)

    @property
    def out_phi(self) -> np.ndarray:
        """(n_models, n) OUT confidences, NaN where the model trained on the example."""
        return self._stack(self.out_rows)

    def in_counts(self) -> np.ndarray:
        """Number of IN observations of each example."""
        return np.sum(~np.isnan(self.in_phi), axis=0)

    def out_counts(self) -> np.ndarray:
        """Number of OUT observations of each example."""
        return np.sum(~np.isnan(self.out_phi), axis=0)

    def _stack(self, rows: list[np.ndarray]) -> np.ndarray:
        if rows:
            return np.vstack(rows)
        return np.empty((0, self.n_examples or 0))

    def add_model(self, phi_row: np.ndarray, in_mask: np.ndarray | None = None) -> None:
        """Record one reference model's confidences on the n target examples.

        Parameters
        ----------
        phi_row : array of shape (n,)
            The reference model's φ on each target example (finite).
        in_mask : bool array of shape (n,), optional
            True where the reference model trained on the example (an IN observation); those
            entries go to :attr:`in_phi`, the rest to :attr:`out_phi`. None means the model trained
            on none of them (all OUT), as for the offline attack.

        Raises
        ------
        ConfigError
            If ``phi_row`` is not a finite (n,) array or ``in_mask`` not a boolean (n,) array.
        """
        row = np.asarray(phi_row, dtype=np.float64)
        expected = self.n_examples if self.n_examples is not None else "n"
        if row.ndim != 1 or (self.n_examples is not None and len(row) != self.n_examples):
            raise ConfigError("phi_row", f"array of shape {row.shape}", f"shape ({expected},)")
        if not np.all(np.isfinite(row)):
            raise ConfigError("phi_row", "array with NaN or inf", "finite confidences")
        if in_mask is None:
            mask = np.zeros(len(row), dtype=bool)
        else:
            mask = np.asarray(in_mask)
            if mask.dtype != np.bool_ or mask.shape != row.shape:
                raise ConfigError(
                    "in_mask",
                    f"array of dtype {mask.dtype} and shape {mask.shape}",
                    f"a boolean array of shape {row.shape}",
                )
        self.n_examples = len(row)
        self.in_rows.append(np.where(mask, row, np.nan))
        self.out_rows.append(np.where(mask, np.nan, row))

    def scores(
        self,
        target_phi: np.ndarray,
        online: bool = False,
        *,
        global_variance: bool = True,
        min_std: float = 1e-3,
    ) -> np.ndarray:
        """LiRA scores of the attacked model's confidences against the collected references.

        Same tests as :func:`lira_offline` (``online=False``) and :func:`lira_online`
        (``online=True``), with per-example means over however many observations each example has.
        Variances: the pooled within-example variance Σ_i (m_i − 1) s_i² / Σ_i (m_i − 1) over the
        examples with m_i ≥ 2 observations (IN and OUT pooled separately) is used for every example
        when ``global_variance``; otherwise each example with m_i ≥ 2 uses its own sample variance
        and an example with m_i = 1 falls back to the pooled one. An example with no OUT
        observation (or, online, no IN observation) has no fitted Gaussian: its score is NaN.
        When every example has the same m ≥ 2 observations this equals the direct functions.

        Parameters
        ----------
        target_phi : array of shape (n,)
            Confidences φ of the attacked model.
        online : bool, default False
            Likelihood ratio of IN vs OUT (True) or the one-sided offline test (False).
        global_variance, min_std
            As in :func:`lira_offline`.

        Returns
        -------
        numpy.ndarray of shape (n,)
            Scores, higher = more likely a member; NaN where the needed observations are missing.

        Raises
        ------
        ConfigError
            If no model was added, ``target_phi`` does not match, ``min_std`` ≤ 0, or no example
            has 2 or more OUT (online: also IN) observations to estimate a variance from.
        """
        std_floor = _check_min_std(min_std)
        if self.n_models == 0:
            raise ConfigError("reference", "no reference models", "add_model() at least twice")
        phi = _check_target(target_phi)
        if len(phi) != self.n_examples:
            raise ConfigError(
                "target_phi", f"array of shape {phi.shape}", f"shape ({self.n_examples},)"
            )
        mu_out, sigma_out = _fit_gaussians(
            self.out_phi, global_variance=global_variance, min_std=std_floor, name="out_phi"
        )
        if not online:
            return _offline_scores(phi, mu_out, sigma_out)
        mu_in, sigma_in = _fit_gaussians(
            self.in_phi, global_variance=global_variance, min_std=std_floor, name="in_phi"
        )
        return _online_scores(phi, mu_in, sigma_in, mu_out, sigma_out)
