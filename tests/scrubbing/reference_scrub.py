"""Reference code for the scrubbing tests: the paper's equations written out directly, to
cross-check the implementations in :mod:`fedunlearn.scrubbing.scrubbers` (which factor them for
speed: one eigendecomposition for every lambda, per-tensor Gaussians) and the clients' head sums
(:func:`fedunlearn.certified.curvature.head_sums`). Not used by the platform.
"""

from __future__ import annotations

import numpy as np

from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.scrubbers import EIGEN_FLOOR, Scrubbed, _check_noise, psd_power


def newton_scrub(
    weights: np.ndarray,
    gradient: np.ndarray,
    curvature: np.ndarray,
    lam: float,
    sigma_h: float,
    *,
    rng: np.random.Generator | None = None,
    floor: float = EIGEN_FLOOR,
) -> Scrubbed:
    """Eq. 7 on a flat parameter vector: ``w - B^{-1} g + (lambda sigma_h^2)^{1/4} B^{-1/4} n``.

    ``gradient`` is ``grad L_Dr(w)``, ``curvature`` the matrix B (Hessian or Fisher of L_Dr). With
    ``lam = 0`` or ``sigma_h = 0`` the scrub is the deterministic Newton step.
    """
    _check_noise(lam, sigma_h)
    w = np.asarray(weights, dtype=np.float64).ravel()
    g = np.asarray(gradient, dtype=np.float64).ravel()
    b = np.asarray(curvature, dtype=np.float64)
    if b.shape != (w.size, w.size) or g.size != w.size:
        raise ConfigError(
            "curvature", f"shape {b.shape}", f"a ({w.size}, {w.size}) matrix matching the weights"
        )
    mean = w - np.linalg.solve(b, g)
    scale = (lam * sigma_h**2) ** 0.25
    covariance = scale**2 * psd_power(b, -0.5, floor=floor)
    sample = mean
    if scale > 0:
        rng = rng or np.random.default_rng()
        sample = mean + scale * psd_power(b, -0.25, floor=floor) @ rng.normal(size=w.size)
    return Scrubbed(sample.reshape(np.shape(weights)), mean, covariance)



def forget_only_curvature(
    hessian_all: np.ndarray, hessian_forget: np.ndarray, gradient_forget: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Section 3.2: ``(B, grad L_Dr) = (H_D - H_Df, -grad L_Df)``, valid at a minimum of L_D."""
    return hessian_all - hessian_forget, -np.asarray(gradient_forget)



def fisher_forgetting(
    weights: np.ndarray,
    fisher_diagonal: np.ndarray,
    lam: float,
    sigma_h: float,
    *,
    power: float = -0.25,
    rng: np.random.Generator | None = None,
    floor: float = EIGEN_FLOOR,
) -> Scrubbed:
    """``w + (lambda sigma_h^2)^{1/4} F^{power} n`` with a diagonal Fisher (power -1/4, or the
    appendix's -1/2); the covariance returned is its diagonal."""
    _check_noise(lam, sigma_h)
    if power not in (-0.25, -0.5):
        raise ConfigError("power", power, "-0.25 (eq. 8) or -0.5 (the appendix's variant)")
    w = np.asarray(weights, dtype=np.float64)
    f = np.asarray(fisher_diagonal, dtype=np.float64)
    if f.shape != w.shape or np.any(f < 0):
        raise ConfigError("fisher_diagonal", f"shape {f.shape}", f"non-negative, shape {w.shape}")
    f = np.maximum(f, floor * max(float(f.max(initial=0.0)), np.finfo(float).tiny))
    std = (lam * sigma_h**2) ** 0.25 * f**power
    rng = rng or np.random.default_rng()
    return Scrubbed(w + std * rng.normal(size=w.shape), w.copy(), std**2)



def gaussian_kl(mean0: np.ndarray, cov0: np.ndarray, mean1: np.ndarray, cov1: np.ndarray) -> float:
    """``KL(N(mean0, cov0) || N(mean1, cov1))`` in nats; covariances full (k x k) or diagonal (k,)."""
    m0, m1 = np.ravel(mean0), np.ravel(mean1)
    diff = m1 - m0
    k = m0.size
    if np.ndim(cov0) == 1 and np.ndim(cov1) == 1:
        c0, c1 = np.ravel(cov0), np.ravel(cov1)
        return float(
            0.5 * (np.sum(c0 / c1) + np.sum(diff**2 / c1) - k + np.sum(np.log(c1) - np.log(c0)))
        )
    c0 = np.diag(cov0) if np.ndim(cov0) == 1 else np.asarray(cov0)
    c1 = np.diag(cov1) if np.ndim(cov1) == 1 else np.asarray(cov1)
    l1 = np.linalg.cholesky(c1)
    solved = np.linalg.solve(l1, c0)
    trace = float(np.trace(np.linalg.solve(l1.T, solved)))
    y = np.linalg.solve(l1, diff)
    logdet1 = 2 * np.sum(np.log(np.diag(l1)))
    logdet0 = np.linalg.slogdet(c0)[1]
    return float(0.5 * (trace + y @ y - k + logdet1 - logdet0))



def softmax_head_sums(
    features: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Cross-entropy of the linear head ``softmax(W x)`` summed over samples: loss, gradient (K*d,)
    and exact Hessian (K*d, K*d), parameters flattened row-major (class k's row first).

    ``H = sum_i (diag(p_i) - p_i p_i^T) (x) x_i x_i^T``; for a linear head it equals the Fisher.
    """
    x = np.asarray(features, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    scores = x @ w.T
    scores -= scores.max(axis=1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=1, keepdims=True)
    n, k = p.shape
    onehot = np.zeros_like(p)
    onehot[np.arange(n), np.asarray(labels)] = 1.0
    loss = float(-np.sum(np.log(np.maximum(p[np.arange(n), labels], 1e-300))))
    gradient = ((p - onehot).T @ x).ravel()
    d = x.shape[1]
    hessian = np.zeros((k, d, k, d))
    for a in range(k):
        for b in range(a, k):
            weight = p[:, a] * ((a == b) - p[:, b])
            block = (x * weight[:, None]).T @ x
            hessian[a, :, b, :] = block
            hessian[b, :, a, :] = block.T
    return loss, gradient, hessian.reshape(k * d, k * d)
