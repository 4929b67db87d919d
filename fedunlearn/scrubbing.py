"""Selective forgetting by scrubbing (Golatkar, Achille, Soatto, *Eternal Sunshine of the Spotless Net*,
CVPR 2020): the math, Flower-free.

* Noisy Newton scrub (eq. 7): ``S(w) = w - B^{-1} grad L_Dr(w) + (lambda sigma_h^2)^{1/4} B^{-1/4} n``,
  ``n ~ N(0, I)``, with ``B`` the Hessian (or Fisher) of the loss on the retained data D_r. The scrubbed
  weights are Gaussian with mean ``w - B^{-1} grad`` and covariance ``sqrt(lambda) sigma_h B^{-1/2}``.
* Fisher forgetting (Section 4): ``S(w) = w + (lambda sigma_h^2)^{1/4} F^{-1/4} n`` with the diagonal
  Fisher F of D_r, labels sampled from the model (eq. 8); the appendix's ``F^{-1/2}`` is ``power=-0.5``.
* Forgetting with D_f only (Section 3.2): at a minimum of L_D, ``grad L_Dr = -grad L_Df`` and
  ``H_Dr = H_D - H_Df``, so a cached ``H_D`` and the forgotten data suffice.
* Information bound (Proposition 2): ``KL(N(w_o, S_o) || N(w_r, S_r))`` in nats between the scrubbed
  original and the scrubbed retrained model.

The linear head's exact Hessian is :func:`softmax_head_sums` (cross-entropy on ``W x``, W of shape
(K, d), flattened row-major).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError

#: Eigenvalues below this (relative to the largest) are clamped before B^{-1/4}, B^{-1/2} (the
#: appendix clamps the Hessian's spectrum; an exactly singular direction would get infinite noise).
EIGEN_FLOOR = 1e-8


def psd_power(matrix: np.ndarray, power: float, *, floor: float = EIGEN_FLOOR) -> np.ndarray:
    """``matrix^power`` for a symmetric positive semi-definite matrix, eigenvalues clamped at
    ``floor * max eigenvalue``."""
    eig, vec = np.linalg.eigh((matrix + matrix.T) / 2)
    top = max(float(eig[-1]), np.finfo(float).tiny)
    eig = np.maximum(eig, floor * top)
    return (vec * eig**power) @ vec.T


@dataclass
class Scrubbed:
    """A scrubbed model: one sample, and the Gaussian it was drawn from (mean, covariance).

    ``covariance`` is a full matrix for the Newton scrub, a vector (its diagonal) for Fisher
    forgetting."""

    weights: np.ndarray
    mean: np.ndarray
    covariance: np.ndarray


def _check_noise(lam: float, sigma_h: float) -> None:
    if not lam >= 0:
        raise ConfigError("lam", lam, "a number >= 0 (the scrub's noise/information trade-off)")
    if not sigma_h >= 0:
        raise ConfigError("sigma_h", sigma_h, "a number >= 0")


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


def diagonal_fisher(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    samples: int | None = 1,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher of ``model`` on ``inputs`` (eq. 8), per parameter tensor, averaged over samples:

        F = E_x E_{y ~ p(y|x)} [ (d log p(y|x) / d w)^2 ]

    with ``samples`` labels drawn from the model per input, or the exact expectation over all labels
    when ``samples`` is None. Per-sample gradients come from ``torch.func`` (vmap of grad).
    """
    from torch.func import functional_call, grad, vmap

    params = {name: p.detach() for name, p in model.named_parameters()}
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def log_prob(p, x, y):
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return torch.log_softmax(out, dim=1)[0].gather(0, y.unsqueeze(0)).squeeze(0)

    per_sample = vmap(grad(log_prob), in_dims=(None, 0, 0))
    fisher = {name: torch.zeros_like(p) for name, p in params.items()}
    model.eval()
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            x = inputs[start : start + batch_size]
            probs = torch.softmax(model(x), dim=1)
            if samples is None:
                pairs = [
                    (torch.full((len(x),), c, dtype=torch.long), probs[:, c])
                    for c in range(probs.shape[1])
                ]
            else:
                pairs = [
                    (
                        torch.multinomial(probs, 1, generator=generator).squeeze(1),
                        torch.full((len(x),), 1.0 / samples),
                    )
                    for _ in range(samples)
                ]
            for labels, weight in pairs:
                grads = per_sample(params, x, labels)
                for name, g in grads.items():
                    shape = (-1,) + (1,) * (g.dim() - 1)
                    fisher[name] += (weight.view(shape) * g.square()).sum(dim=0)
    return {name: f / len(inputs) for name, f in fisher.items()}


def variational_forgetting(
    model: nn.Module,
    retained_loss,
    lam: float,
    *,
    steps: int = 200,
    lr: float = 0.05,
    init_std: float = 1e-3,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Section 4: the diagonal noise covariance Sigma minimising ``E_n[L_Dr(w + n)] - lambda log|Sigma|``.

    ``retained_loss(params)`` returns the loss on (a batch of) D_r for a parameter dict (use
    ``torch.func.functional_call``). Optimised with Adam on ``log sigma^2`` and the reparametrisation
    ``n = sigma * eps``, one noise draw per step. Returns the variances per parameter tensor; draw the
    scrubbed model as ``w + sqrt(variance) * eps``.
    """
    if not lam > 0:
        raise ConfigError("lam", lam, "a number > 0 (the weight of the log-determinant)")
    if steps < 1:
        raise ConfigError("steps", steps, "an integer >= 1")
    weights = {name: p.detach() for name, p in model.named_parameters()}
    log_var = {
        name: torch.full_like(p, 2 * float(np.log(init_std)), requires_grad=True)
        for name, p in weights.items()
    }
    optimizer = torch.optim.Adam(list(log_var.values()), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        noisy = {
            name: w
            + torch.exp(0.5 * log_var[name])
            * torch.randn(w.shape, dtype=w.dtype, device=w.device, generator=generator)
            for name, w in weights.items()
        }
        objective = retained_loss(noisy) - lam * sum(v.sum() for v in log_var.values())
        objective.backward()
        optimizer.step()
    return {name: torch.exp(v.detach()) for name, v in log_var.items()}
