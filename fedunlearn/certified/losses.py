"""Losses of the certified linear head (Guo et al., *Certified Data Removal*, ICML 2020, Section 3).

A linear model scores a sample ``x`` (a row of ``X``, ``||x|| <= 1``) with ``s = w^T x``; with ``K``
heads (one-vs-rest) the scores are ``S = X W^T``. Each head ``k`` has targets ``t_k`` in ``{-1, +1}``.

* ``logistic``: ``l(s, t) = log(1 + exp(-t s))``. ``|l'| <= 1`` (so ``||grad l|| <= C = 1`` for
  ``||x|| <= 1``) and ``l'' = sigma(s)(1 - sigma(s))`` is ``gamma``-Lipschitz with the paper's
  ``gamma = 1/4`` or the exact constant ``max |l'''| = 1/(6 sqrt 3) ~ 0.0962`` (attained where
  ``sigma(1 - sigma) = 1/6``).
* ``least-squares``: ``l(s, t) = (s - t)^2 / 2``. ``l'' = 1`` is constant (``gamma = 0``): the Newton
  removal step is exact and needs no perturbation (Guo et al., Section 3.1, "linear regression").

Everything here is NumPy and works on whole arrays of scores; the sums the removal algorithm needs
are built from these per-sample derivatives in :mod:`fedunlearn.certified.statistics`.
"""

from __future__ import annotations

import math

import numpy as np

from fedunlearn.errors import ConfigError, FedUnlearnError

LOSSES = ("logistic", "least-squares")

#: Lipschitz constants of the logistic l'': the paper's 1/4 and the exact max |l'''| = 1/(6 sqrt 3).
LOGISTIC_GAMMA = {"paper": 0.25, "exact": 1.0 / (6.0 * math.sqrt(3.0))}

#: Features may exceed unit norm by this much (rounding of a normalisation done in float32).
NORM_TOLERANCE = 1e-6


class FeatureNormError(FedUnlearnError, ValueError):
    """The features given to a certified head are not inside the unit ball (the theory needs it)."""


def check_loss(loss: str) -> str:
    if loss not in LOSSES:
        raise ConfigError("loss", loss, f"one of {', '.join(LOSSES)}")
    return loss


def lipschitz_gamma(loss: str, gamma: str = "exact") -> float:
    """``gamma``, the Lipschitz constant of ``l''`` used by the data-dependent bounds.

    ``gamma`` selects ``"paper"`` (1/4, Guo et al. Corollary 1) or ``"exact"`` (1/(6 sqrt 3)) for
    the logistic loss; least squares has a constant ``l''`` and ``gamma = 0`` either way.
    """
    check_loss(loss)
    if gamma not in LOGISTIC_GAMMA:
        raise ConfigError("gamma", gamma, f"one of {', '.join(LOGISTIC_GAMMA)}")
    return 0.0 if loss == "least-squares" else LOGISTIC_GAMMA[gamma]


def normalize_features(features: np.ndarray, *, center: float | np.ndarray = 0.0) -> np.ndarray:
    """Rows ``(x - center) / ||x - center||`` in float64; rows that are all zero stay zero.

    Guo et al. need ``||x|| <= 1``. The MNIST setting of the paper's code is ``center = 0.5`` on
    pixels in ``[0, 1]``. For a federated body, ``center`` is 0: features are normalised per sample,
    so every client can do it alone.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ConfigError("features", f"array of shape {x.shape}", "a 2-D array (samples, dim)")
    x = x - center
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def check_features(features: np.ndarray, *, name: str = "features") -> np.ndarray:
    """``features`` as a float64 2-D array, refused with a clear error if a row has norm > 1."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ConfigError(name, f"array of shape {x.shape}", "a 2-D array (samples, dim)")
    if not np.all(np.isfinite(x)):
        raise FeatureNormError(f"{name} contain NaN or infinite values")
    if len(x):
        norms = np.linalg.norm(x, axis=1)
        worst = int(np.argmax(norms))
        if norms[worst] > 1.0 + NORM_TOLERANCE:
            raise FeatureNormError(
                f"{name} must have ||x|| <= 1 for the certificate to hold (Guo et al., Sec. 3); "
                f"row {worst} has norm {norms[worst]:.6g}. Normalise them first, e.g. with "
                "fedunlearn.certified.losses.normalize_features"
            )
    return x


def check_targets(loss: str, targets: np.ndarray, *, name: str = "targets") -> np.ndarray:
    """``targets`` (n, K) as float64, refused with a :class:`ConfigError` unless the loss's theory holds.

    Logistic: every target exactly -1 or +1. The removal bounds use ``l'' = t^2 sigma(1 - sigma)``
    with ``t^2 = 1`` and ``|l'| <= 1``; with other targets both fail and a certificate would understate
    the residual (labels {0, 1} gave true residuals 200-4000x the bound). Least squares: finite.
    """
    check_loss(loss)
    t = np.asarray(targets)
    if t.dtype == bool or not (np.issubdtype(t.dtype, np.number) and not np.iscomplexobj(t)):
        raise ConfigError(name, f"array of dtype {t.dtype}", "real numbers")
    t = t.astype(np.float64)
    if t.ndim != 2 or t.shape[1] < 1:
        raise ConfigError(name, f"array of shape {t.shape}", "a 2-D array (samples, heads)")
    if loss == "logistic":
        bad = ~((t == 1.0) | (t == -1.0))
        allowed = "exactly -1 or +1 for the logistic loss (use one_vs_rest_targets on labels)"
    else:
        bad = ~np.isfinite(t)
        allowed = "finite numbers for the least-squares loss"
    if np.any(bad):
        rows, cols = np.nonzero(bad)
        found = [float(v) for v in t[rows[:5], cols[:5]]]
        found_text = f"{int(bad.sum())} value(s) such as {found} (first in row {int(rows[0])})"
        raise ConfigError(name, found_text, allowed)
    return t


def one_vs_rest_targets(labels: np.ndarray, classes: np.ndarray | list[int]) -> np.ndarray:
    """Targets ``T`` of shape ``(n, K)`` in ``{-1, +1}``.

    Two classes give one head (``K = 1``): ``+1`` for ``classes[1]``, ``-1`` for ``classes[0]``, as
    in the paper's binary MNIST 3 vs 8. More classes give one head per class (one-vs-rest).
    A label outside ``classes`` is refused.
    """
    labels = np.asarray(labels)
    classes = np.asarray(classes)
    if len(classes) < 2:
        raise ConfigError("classes", classes.tolist(), "at least two classes")
    unknown = ~np.isin(labels, classes)
    if np.any(unknown):
        raise ConfigError(
            "labels", labels[unknown][:5].tolist(), f"labels among classes {classes.tolist()}"
        )
    if len(classes) == 2:
        return np.where(labels == classes[1], 1.0, -1.0)[:, None]
    return np.where(labels[:, None] == classes[None, :], 1.0, -1.0)


def predict_labels(scores: np.ndarray, classes: np.ndarray | list[int]) -> np.ndarray:
    """Labels from head scores ``(n, K)``: the sign for one head, the arg-max for one-vs-rest."""
    classes = np.asarray(classes)
    if scores.shape[1] == 1:
        return np.where(scores[:, 0] > 0, classes[1], classes[0])
    return classes[np.argmax(scores, axis=1)]


def class_probabilities(loss: str, scores: np.ndarray) -> np.ndarray:
    """Class probabilities ``(n, C)`` from head scores ``(n, K)``, for readers of a softmax vector
    (the membership-inference attacks).

    ``logistic``: head k's sigmoid is its estimate of P(class k | x) against the rest; the K
    estimates are normalised to sum to one (one head gives ``[1 - p, p]``). ``least-squares``: the
    softmax of the scores (one head: of ``[-s, s]``). The arg-max equals :func:`predict_labels`'s.
    """
    loss = check_loss(loss)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] < 1:
        raise ConfigError("scores", scores.shape, "a 2-D array (n samples, K heads)")
    if loss == "logistic":
        p = _sigmoid(scores)
        if scores.shape[1] == 1:
            return np.hstack([1.0 - p, p])
        return p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)
    if scores.shape[1] == 1:
        scores = np.hstack([-scores, scores])
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # Stable in both tails: exp never overflows.
    out = np.empty_like(z)
    positive = z >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-z[positive]))
    ez = np.exp(z[~positive])
    out[~positive] = ez / (1.0 + ez)
    return out


def loss_values(loss: str, scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-sample, per-head ``l(s, t)``."""
    if loss == "logistic":
        return np.logaddexp(0.0, -targets * scores)
    return 0.5 * np.square(scores - targets)


def first_derivative(loss: str, scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``dl/ds``; the gradient of ``l(w^T x, t)`` in ``w`` is ``dl/ds * x``."""
    if loss == "logistic":
        return -targets * _sigmoid(-targets * scores)
    return scores - targets


def second_derivative(loss: str, scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``d^2 l / ds^2`` (``t^2 = 1`` for logistic); the Hessian of ``l(w^T x, t)`` is ``l'' x x^T``."""
    if loss == "logistic":
        p = _sigmoid(targets * scores)
        return p * (1.0 - p)
    return np.ones_like(scores)
