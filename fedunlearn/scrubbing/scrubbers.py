"""Selective forgetting by scrubbing (Golatkar, Achille, Soatto, *Eternal Sunshine of the Spotless Net*,
CVPR 2020): the math, Flower-free. The server (``server/scrubbing/methods.py``) only gathers the clients'
sums and calls these functions.

* Noisy Newton scrub (eq. 7): ``S(w) = w - B^{-1} grad L_Dr(w) + (lambda sigma_h^2)^{1/4} B^{-1/4} n``,
  ``n ~ N(0, I)``, with ``B`` the Hessian (or Fisher) of the loss on the retained data D_r. The scrubbed
  weights are Gaussian with mean ``w - B^{-1} grad`` and covariance ``sqrt(lambda) sigma_h B^{-1/2}``:
  :class:`NewtonScrubber` (one eigendecomposition of B for every lambda). Forgetting with D_f only
  (Section 3.2) is the same scrub with ``grad L_Dr = -grad L_Df`` and ``H_Dr = H_D - H_Df`` (valid
  at a minimum of L_D): :meth:`NewtonScrubber.with_gradient`.
* Fisher forgetting (Section 4): ``S(w) = w + (lambda sigma_h^2)^{1/4} F^{-1/4} n`` with the diagonal
  Fisher F of D_r, labels sampled from the model (eq. 8, :func:`diagonal_fisher`); the appendix's
  ``F^{-1/2}`` is ``power=-0.5``: :func:`fisher_gaussian` (or the authors' released recipe,
  :func:`reference_fisher_gaussian`) and :func:`fisher_sample`.
* Finite-time scrub (eq. 6, Proposition 3): :func:`finite_time_scrub` maps the weights reached by
  gradient flow on L_D for a time t to those reached on L_Dr from the same initialisation.
* Information bound (Proposition 2): ``KL(N(w_o, S_o) || N(w_r, S_r))`` in nats between the scrubbed
  original and the scrubbed retrained model, over a grid of lambda: :func:`kl_over_lambda`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
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
    eig, vec = _clamped_eigh(matrix, floor)
    return (vec * eig**power) @ vec.T


def _clamped_eigh(matrix: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of a symmetric matrix, eigenvalues clamped at ``floor * max``."""
    eig, vec = np.linalg.eigh((matrix + matrix.T) / 2)
    top = max(float(eig[-1]), np.finfo(float).tiny)
    return np.maximum(eig, floor * top), vec


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


def finite_time_scrub(
    weights: np.ndarray,
    gradient_all: np.ndarray,
    curvature_all: np.ndarray,
    gradient_retained: np.ndarray,
    curvature_retained: np.ndarray,
    lam: float,
    sigma_h: float,
    *,
    time: float,
    lr: float = 1.0,
    max_exponent: float = 30.0,
    rng: np.random.Generator | None = None,
    floor: float = EIGEN_FLOOR,
) -> Scrubbed:
    """The finite-time scrub (eq. 6, Proposition 3) plus eq. 7's noise, on a flat parameter vector.

    Derivation. For quadratic losses ``L_D(w) = (w - w_D)^T A (w - w_D) / 2`` and
    ``L_Dr(w) = (w - w_r)^T B (w - w_r) / 2``, gradient flow with learning rate ``eta`` for a time
    ``t`` from the same initialisation ``w0`` reaches

        w_D(t)  = w_D + exp(-eta A t) (w0 - w_D),
        w_Dr(t) = w_r + exp(-eta B t) (w0 - w_r).

    At ``w = w_D(t)``, ``d = A^{-1} grad L_D(w) = w - w_D`` and
    ``d_r = B^{-1} grad L_Dr(w) = w - w_r``, so ``w0 = w - d + exp(eta A t) d`` and the scrub
    mapping ``w_D(t)`` to ``w_Dr(t)`` is

        S(w) = w - d_r + exp(-eta B t) (d_r - d + exp(eta A t) d).

    At ``t = 0`` it is the identity; as ``t -> inf`` at a trained model (``d -> 0``) it is the
    Newton step ``w - d_r`` of eq. 7. The sample adds eq. 7's noise
    ``(lambda sigma_h^2)^{1/4} B^{-1/4} n`` (covariance ``sqrt(lambda) sigma_h B^{-1/2}``).

    ``gradient_all``/``curvature_all`` are ``grad L_D(w)`` and A (Hessian or Fisher of L_D);
    ``gradient_retained``/``curvature_retained`` are ``grad L_Dr(w)`` and B. The matrix functions
    come from ``eigh`` of the symmetrised A and B, eigenvalues clamped at ``floor * max eigenvalue``
    as in the appendix (before inverting, and before the exponentials). ``exp(eta A t)`` explodes
    on a long run (and ``d`` is then tiny, or only numerically non-zero): the exponent
    ``eta t eig(A)`` is capped at ``max_exponent``, which keeps the computation finite and is exact
    whenever ``eta t eig_max(A) <= max_exponent``. ``time = inf`` gives the ``t -> inf`` limit.
    """
    _check_noise(lam, sigma_h)
    if not time >= 0:
        raise ConfigError("time", time, "a number >= 0 (the training time t of eq. 6)")
    if not (lr > 0 and np.isfinite(lr)):
        raise ConfigError("lr", lr, "a finite number > 0 (the learning rate eta of eq. 6)")
    if not max_exponent > 0:
        raise ConfigError("max_exponent", max_exponent, "a number > 0")
    w = np.asarray(weights, dtype=np.float64).ravel()
    g_all = np.asarray(gradient_all, dtype=np.float64).ravel()
    g_ret = np.asarray(gradient_retained, dtype=np.float64).ravel()
    a = np.asarray(curvature_all, dtype=np.float64)
    b = np.asarray(curvature_retained, dtype=np.float64)
    k = w.size
    for name, value in (("curvature_all", a), ("curvature_retained", b)):
        if value.shape != (k, k):
            raise ConfigError(name, f"shape {value.shape}", f"a ({k}, {k}) matrix like the weights")
    for name, value in (("gradient_all", g_all), ("gradient_retained", g_ret)):
        if value.size != k:
            raise ConfigError(name, f"size {value.size}", f"{k} entries like the weights")
    eig_a, vec_a = _clamped_eigh(a, floor)
    eig_b, vec_b = _clamped_eigh(b, floor)
    coord_a = vec_a.T @ g_all / eig_a  # d in A's eigenbasis
    d = vec_a @ coord_a
    d_r = vec_b @ (vec_b.T @ g_ret / eig_b)
    if time == 0:
        grow, shrink = np.ones_like(eig_a), np.ones_like(eig_b)
    else:
        grow = np.exp(np.minimum(lr * time * eig_a, max_exponent))
        shrink = np.exp(-lr * time * eig_b)
    restart = d_r - d + vec_a @ (grow * coord_a)  # w0 - w_r
    mean = w - d_r + vec_b @ (shrink * (vec_b.T @ restart))
    scale = (lam * sigma_h**2) ** 0.25
    covariance = scale**2 * psd_power(b, -0.5, floor=floor)
    sample = mean
    if scale > 0:
        rng = rng or np.random.default_rng()
        sample = mean + scale * psd_power(b, -0.25, floor=floor) @ rng.normal(size=k)
    return Scrubbed(sample.reshape(np.shape(weights)), mean, covariance)


def kl_over_lambda(
    mean0: np.ndarray,
    base_cov0: np.ndarray,
    mean1: np.ndarray,
    base_cov1: np.ndarray,
    lams,
    sigma_h: float,
) -> np.ndarray:
    """Proposition 2's bound ``KL(N(m0, s C0) || N(m1, s C1))`` (nats) for each lambda in ``lams``.

    Eq. 7's noise ``(lambda sigma_h^2)^{1/4} B^{-1/4} n`` has covariance ``s C`` with
    ``s = sqrt(lambda) sigma_h`` and ``C = B^{-1/2}`` (a full matrix), or, for Fisher forgetting,
    the diagonal ``C = F^{2 power}`` (a vector). Then

        KL = [tr(C1^{-1} C0) + (m1 - m0)^T C1^{-1} (m1 - m0) / s - k + log|C1| - log|C0|] / 2,

    so only the Mahalanobis term depends on lambda: the rest is computed once (one Cholesky of C1,
    or one pass over the diagonals) and the whole grid costs no more than one :func:`gaussian_kl`.
    The result has the shape of ``lams``; every lambda must be > 0 (and ``sigma_h`` > 0).
    """
    grid = np.asarray(lams, dtype=np.float64)
    if grid.size == 0 or not np.all(grid > 0):
        raise ConfigError("lams", lams, "one or more numbers > 0 (the noise levels lambda)")
    if not (sigma_h > 0 and np.isfinite(sigma_h)):
        raise ConfigError("sigma_h", sigma_h, "a finite number > 0")
    m0, m1 = np.ravel(mean0).astype(np.float64), np.ravel(mean1).astype(np.float64)
    k = m0.size
    if m1.size != k:
        raise ConfigError("mean1", f"size {m1.size}", f"{k} entries like mean0")
    diff = m1 - m0
    c0 = np.asarray(base_cov0, dtype=np.float64)
    c1 = np.asarray(base_cov1, dtype=np.float64)
    for name, value in (("base_cov0", c0), ("base_cov1", c1)):
        if value.shape not in ((k,), (k, k)):
            raise ConfigError(name, f"shape {value.shape}", f"({k},) (diagonal) or ({k}, {k})")
    if c0.ndim == 1 and c1.ndim == 1:
        if np.any(c0 <= 0) or np.any(c1 <= 0):
            raise ConfigError("base_cov0/base_cov1", "a non-positive variance", "variances > 0")
        fixed = np.sum(c0 / c1) - k + np.sum(np.log(c1) - np.log(c0))
        mahalanobis = float(np.sum(diff**2 / c1))
    else:
        c0 = np.diag(c0) if c0.ndim == 1 else c0
        c1 = np.diag(c1) if c1.ndim == 1 else c1
        try:
            l1 = np.linalg.cholesky(c1)
        except np.linalg.LinAlgError as error:
            raise ConfigError("base_cov1", "a matrix", "symmetric positive definite") from error
        sign0, logdet0 = np.linalg.slogdet(c0)
        if sign0 <= 0:
            raise ConfigError("base_cov0", "a matrix", "symmetric positive definite")
        trace = float(np.trace(np.linalg.solve(l1.T, np.linalg.solve(l1, c0))))
        y = np.linalg.solve(l1, diff)
        fixed = trace - k + 2 * np.sum(np.log(np.diag(l1))) - logdet0
        mahalanobis = float(y @ y)
    return 0.5 * (fixed + mahalanobis / (np.sqrt(grid) * sigma_h))


class NewtonScrubber:
    """Eq. 7 with one eigendecomposition of B, for many noise levels lambda.

    ``mean = w - B^{-1} g`` and the base covariance ``B^{-1/2}`` (the covariance is
    ``sqrt(lambda) sigma_h B^{-1/2}``) are fixed by (w, g, B); :meth:`sample` draws the scrubbed
    weights for any lambda. Eigenvalues are clamped at ``floor * max`` as in :func:`psd_power`.
    """

    def __init__(
        self,
        weights: np.ndarray,
        gradient: np.ndarray,
        curvature: np.ndarray,
        *,
        floor: float = EIGEN_FLOOR,
    ) -> None:
        w = np.asarray(weights, dtype=np.float64)
        g = np.asarray(gradient, dtype=np.float64).ravel()
        b = np.asarray(curvature, dtype=np.float64)
        if b.shape != (w.size, w.size) or g.size != w.size:
            raise ConfigError(
                "curvature",
                f"shape {b.shape}",
                f"a ({w.size}, {w.size}) matrix matching the weights",
            )
        self.shape = w.shape
        self.eigenvalues, vec = _clamped_eigh(b, floor)
        self.eigenvectors = vec
        self.mean = (w.ravel() - vec @ ((vec.T @ g) / self.eigenvalues)).reshape(self.shape)

    def with_gradient(self, weights: np.ndarray, gradient: np.ndarray) -> NewtonScrubber:
        """The scrub of (``weights``, ``gradient``) with the same B, reusing its eigendecomposition
        (e.g. Section 3.2's ``-grad L_Df`` beside ``grad L_Dr``: the curvature is the same)."""
        w = np.asarray(weights, dtype=np.float64)
        g = np.asarray(gradient, dtype=np.float64).ravel()
        if w.size != self.eigenvalues.size or g.size != w.size:
            raise ConfigError(
                "gradient", f"shape {np.shape(gradient)}", f"{self.eigenvalues.size} entries"
            )
        other = copy.copy(self)
        other.shape = w.shape
        vec = self.eigenvectors
        other.mean = (w.ravel() - vec @ ((vec.T @ g) / self.eigenvalues)).reshape(w.shape)
        return other

    def base_covariance(self) -> np.ndarray:
        """``B^{-1/2}``: the covariance at ``sqrt(lambda) sigma_h = 1``."""
        return (self.eigenvectors * self.eigenvalues**-0.5) @ self.eigenvectors.T

    def sample(self, lam: float, sigma_h: float, rng: np.random.Generator) -> np.ndarray:
        """``mean + (lambda sigma_h^2)^{1/4} B^{-1/4} n``, n ~ N(0, I)."""
        _check_noise(lam, sigma_h)
        vec = self.eigenvectors
        noise = vec @ (self.eigenvalues**-0.25 * (vec.T @ rng.normal(size=vec.shape[0])))
        return self.mean + (lam * sigma_h**2) ** 0.25 * noise.reshape(self.shape)


def reference_fisher_variance(
    fisher: Mapping[str, np.ndarray],
    *,
    head: tuple[str, ...] = ("head.weight", "head.bias"),
    forget_class: int | None = None,
    max_variance: float = 1e3,
    head_max_variance: float = 1e2,
    boost: float = 10.0,
    per_neuron: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Fisher forgetting as the authors' released code does it: the base variance (at ``alpha = 1``)
    and which parameters have their mean reset to 0, per tensor.

    ``alpha * var`` is the noise variance, ``alpha = sqrt(lambda) sigma_h`` (std
    ``(lambda sigma_h^2)^{1/4} F^{-1/2}``, the appendix's variant). Beyond eq. 8, the reference code
    (i) caps ``1/F`` at ``max_variance`` (``head_max_variance`` on the last layer), (ii) averages
    the variance over each output unit (``per_neuron``: one variance per row of a weight tensor),
    (iii) multiplies the variance of the last layer and of 1-D tensors (biases, norms) by ``boost``
    and (iv), to forget a class, resets that class's last-layer row to the prior mean 0: D_r carries
    no information on it, so the scrub draws it afresh. The reference fixes that row's variance at
    1e-4; here it is 1 (scaled by alpha like every other entry) so that the covariance stays
    ``sqrt(lambda) sigma_h`` times a fixed base, as Proposition 2's lambda grid needs.
    """
    base, reset = {}, {}
    for name, f in fisher.items():
        f = np.asarray(f, dtype=np.float64)
        in_head = name in head
        var = np.minimum(1.0 / (f + 1e-8), head_max_variance if in_head else max_variance)
        if per_neuron and var.ndim > 1:
            var = np.broadcast_to(
                var.mean(axis=tuple(range(1, var.ndim)), keepdims=True), var.shape
            )
            var = var.copy()
        mask = np.zeros(var.shape, dtype=bool)
        if in_head and forget_class is not None:
            if not 0 <= forget_class < var.shape[0]:
                raise ConfigError("forget_class", forget_class, f"a class in 0..{var.shape[0] - 1}")
            mask[forget_class] = True
            var[forget_class] = 1.0
        if in_head or var.ndim == 1:
            var = var * boost
        base[name], reset[name] = var, mask
    return base, reset


def fisher_gaussian(
    weights: Mapping[str, np.ndarray],
    fisher: Mapping[str, np.ndarray],
    *,
    power: float,
    floor: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Fisher forgetting's Gaussian (eq. 8), per parameter tensor: mean ``w`` and base variance
    ``F^{2 power}`` (the variance at ``sqrt(lambda) sigma_h = 1``; power -1/4, or the appendix's
    -1/2). F is floored at ``floor`` (at least 1e-30): a parameter D_r does not use would get
    infinite noise."""
    if power not in (-0.25, -0.5):
        raise ConfigError("power", power, "-0.25 (eq. 8) or -0.5 (the appendix's variant)")
    mean = {name: np.asarray(weights[name], dtype=np.float64) for name in fisher}
    floor = max(floor, 1e-30)
    return mean, {name: np.maximum(f, floor) ** (2 * power) for name, f in fisher.items()}


def reference_fisher_gaussian(
    weights: Mapping[str, np.ndarray],
    fisher: Mapping[str, np.ndarray],
    *,
    forget_class: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The authors' released recipe (:func:`reference_fisher_variance`) as mean and base variance:
    a forgotten class's last-layer row has its mean reset to the prior mean 0."""
    mean = {name: np.asarray(weights[name], dtype=np.float64) for name in fisher}
    base, reset = reference_fisher_variance(fisher, forget_class=forget_class)
    return {name: np.where(reset[name], 0.0, mean[name]) for name in mean}, base


def fisher_sample(
    mean: Mapping[str, np.ndarray],
    base: Mapping[str, np.ndarray],
    lam: float,
    sigma_h: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """One scrubbed model of Fisher forgetting: ``mean + (sqrt(lambda) sigma_h base)^{1/2} n``,
    ``n ~ N(0, I)``, drawn tensor by tensor in ``mean``'s order."""
    _check_noise(lam, sigma_h)
    scale = np.sqrt(np.sqrt(lam) * sigma_h)
    return {
        name: m + scale * np.sqrt(base[name]) * rng.normal(size=m.shape) for name, m in mean.items()
    }
