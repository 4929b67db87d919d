"""Rapid retraining: a client's local optimiser of Liu, Xu, Yuan, Wang, Li, *The Right to be
Forgotten in Federated Learning: An Efficient Realization with Rapid Retraining* (INFOCOM 2022,
arXiv 2203.07320), design section "Federated Rapid Retraining" (Algorithm 1), Flower-free.

Unlearning is retraining from the initial global model on the remaining data D_k^u of every
client, with FedAvg on the server; only each client's local optimiser changes. The paper starts
from the Newton step ``w_{t+1} = w_t - H^{-1} Delta`` (first-order Taylor expansion of the
gradient around the optimum) and replaces the Hessian by the diagonal empirical Fisher
information matrix (FIM) of the batch,

    Gamma_t = 1/(B - dB) * sum_i  g_i ⊙ g_i,   g_i = grad_w  CE(f_w(x_i), y_i)            (FIM)

(the mean of squared per-sample gradients of the negative log-likelihood, :func:`diagonal_fisher`),
then applies momentum to both the gradient and the FIM to damp the approximation error, with
beta_1 = 0.9, beta_2 = 0.999 (experimental setup). The step (:func:`fisher_step`) is

    m_t = beta_1 m_{t-1} + (1 - beta_1) g_t
    v_t = beta_2 v_{t-1} + (1 - beta_2) Gamma_t ⊙ Gamma_t
    w_{t+1} = w_t - eta * (m_t / (1 - beta_1^t)) / (sqrt(v_t / (1 - beta_2^t)) + lambda)

i.e. a bias-corrected, momentum-averaged ``Gamma^{-1} g`` (the Hessian power is 1) with a damping
``lambda`` added to the curvature. The paper's own text was not reachable here; its equations and
hyper-parameters were read in the summary of github.com/vicw0ng-hk/feul (notebooks/08-liu+22), and
the momentum form is the authors' public code's (github.com/IMoonKeyBoy/The-Right-to-be-Forgotten-
in-Federated-Learning-An-Efficient-Realization-with-Rapid-Retraining, ``utils/ada_hessain.py``:
an AdaHessian, whose curvature slot we fill with the diagonal empirical FIM the paper names, not
the Hutchinson estimate the code computes) and Plato's port's (TL-System/plato,
``examples/unlearning/fedunlearning``: AdaHessian, lr 1e-3, eps 1e-8, betas (0.9, 0.999)).

Ours: where the denominator is exactly 0 (damping 0 and a coordinate whose FIM has always been
0, hence whose gradient has too) the coordinate does not move instead of 0/0 = NaN. The paper's
block-diagonal averaging of the FIM over blocks of size b = 3 is not done (one coordinate each).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedunlearn.errors import ConfigError

#: The paper's setup (eta = 1e-3, beta_1, beta_2) and the authors' optimizer (eps = 1e-8).
DEFAULT_LR = 1e-3
DEFAULT_DAMPING = 1e-8
DEFAULT_MOMENTUM = 0.9
DEFAULT_FISHER_MOMENTUM = 0.999


@dataclass(frozen=True)
class FisherMomentum:
    """One parameter tensor's optimiser state: m_t, v_t and the step count t."""

    exp_avg: torch.Tensor
    exp_fisher_sq: torch.Tensor
    step: int = 0

    @classmethod
    def zeros_like(cls, param: torch.Tensor) -> FisherMomentum:
        """The state before the first step: m_0 = v_0 = 0, t = 0."""
        return cls(torch.zeros_like(param), torch.zeros_like(param), 0)


def _is_count(value: object, minimum: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def _check_rates(lr: float, damping: float, momentum: float, fisher_momentum: float) -> None:
    if not (isinstance(lr, numbers.Real) and math.isfinite(lr) and lr > 0):
        raise ConfigError("lr", lr, "a finite number > 0")
    if not (isinstance(damping, numbers.Real) and math.isfinite(damping) and damping >= 0):
        raise ConfigError("damping", damping, "a finite number >= 0")
    for name, beta in (("momentum", momentum), ("fisher_momentum", fisher_momentum)):
        if not (isinstance(beta, numbers.Real) and 0 <= beta < 1):
            raise ConfigError(name, beta, "a number in [0, 1)")


def _check_data(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
    if len(x) == 0:
        raise ConfigError("x", "an empty dataset", "at least one training sample")
    if len(y) != len(x):
        raise ConfigError("y", f"{len(y)} labels", f"one label per sample ({len(x)})")
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.dim() != 1:
        raise ConfigError("y", f"dtype {y.dtype}, shape {tuple(y.shape)}", "1-D integer labels")
    if not _is_count(batch_size, 1):
        raise ConfigError("batch_size", batch_size, "an integer >= 1")


def _per_sample_gradients(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """g_i = grad_w CE(f_w(x_i), y_i) for every sample of the batch (leading axis i) and the
    per-sample losses, in one vectorised backward pass."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def sample_loss(weights, x_i, y_i):
        logits = functional_call(model, (weights, buffers), (x_i.unsqueeze(0),))
        loss = nn.functional.cross_entropy(logits, y_i.unsqueeze(0))
        return loss, loss

    per_sample = vmap(grad(sample_loss, has_aux=True), in_dims=(None, 0, 0), randomness="different")
    gradients, losses = per_sample(params, inputs, targets)
    return gradients, losses.detach()


def diagonal_fisher(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Diagonal empirical FIM (Section IV, eq. (FIM)): ``mean_i g_i ⊙ g_i`` over ``(x, y)``.

    ``g_i`` is the gradient of sample i's cross-entropy (the negative log-likelihood of its
    observed label) with respect to every trainable parameter, at the model's current weights.
    ``batch_size`` only bounds how many per-sample gradients are held at once: the result is the
    mean over all ``len(x)`` samples whatever it is. Keys are ``model.named_parameters()`` names.
    The model is not changed (its train/eval mode is kept).
    """
    _check_data(x, y, batch_size)
    device = torch.device(device)
    model.to(device)
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters() if p.requires_grad}
    for start in range(0, len(x), batch_size):
        inputs = x[start : start + batch_size].to(device)
        targets = y[start : start + batch_size].to(device)
        gradients, _ = _per_sample_gradients(model, inputs, targets)
        for name, g in gradients.items():
            total[name] += g.square().sum(dim=0)
    return {name: value / len(x) for name, value in total.items()}


@torch.no_grad()
def fisher_step(
    param: torch.Tensor,
    gradient: torch.Tensor,
    fisher: torch.Tensor,
    state: FisherMomentum,
    *,
    lr: float,
    damping: float,
    momentum: float = DEFAULT_MOMENTUM,
    fisher_momentum: float = DEFAULT_FISHER_MOMENTUM,
) -> tuple[torch.Tensor, FisherMomentum]:
    """One FIM-preconditioned momentum step (Algorithm 1's local update; see the module docstring).

    Parameters
    ----------
    param, gradient, fisher : torch.Tensor
        w_t, the batch gradient g_t and the batch's diagonal FIM Gamma_t, all of one shape.
    state : FisherMomentum
        (m_{t-1}, v_{t-1}, t - 1); :meth:`FisherMomentum.zeros_like` before the first step.
    lr, damping : float
        eta and lambda, the damping added to ``sqrt(v_hat)``.
    momentum, fisher_momentum : float
        beta_1 (gradient) and beta_2 (squared FIM).

    Returns
    -------
    (w_{t+1}, (m_t, v_t, t)) as new tensors; the inputs are not modified.
    """
    _check_rates(lr, damping, momentum, fisher_momentum)
    if not (param.shape == gradient.shape == fisher.shape == state.exp_avg.shape):
        raise ConfigError(
            "gradient/fisher",
            f"shapes {tuple(gradient.shape)}, {tuple(fisher.shape)}",
            f"the parameter's shape {tuple(param.shape)}",
        )
    step = state.step + 1
    exp_avg = momentum * state.exp_avg + (1 - momentum) * gradient
    exp_fisher_sq = fisher_momentum * state.exp_fisher_sq + (1 - fisher_momentum) * fisher.square()
    # Adam-style bias corrections: without them the first steps would divide a tenth of the
    # gradient by a 1/sqrt(1000)-shrunk curvature, a 3x oversized first step.
    m_hat = exp_avg / (1 - momentum**step)
    denom = (exp_fisher_sq / (1 - fisher_momentum**step)).sqrt() + damping
    # A zero denominator means no curvature ever seen there (so no gradient either): stay put.
    direction = torch.where(denom > 0, m_hat / denom.clamp_min(torch.finfo(denom.dtype).tiny), 0.0)
    return param - lr * direction, FisherMomentum(exp_avg, exp_fisher_sq, step)


def rapid_retraining_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float = DEFAULT_LR,
    batch_size: int,
    seed: int,
    damping: float = DEFAULT_DAMPING,
    momentum: float = DEFAULT_MOMENTUM,
    fisher_momentum: float = DEFAULT_FISHER_MOMENTUM,
    device: torch.device | str = "cpu",
) -> float:
    """A client's local retraining with the rapid-retraining optimiser (Algorithm 1, client side).

    For ``epochs`` passes over ``(x, y)`` in seeded batches (as
    :func:`fedunlearn.training.local.train_epochs`): per batch, the per-sample cross-entropy
    gradients give both the batch gradient g_t (their mean) and the diagonal FIM Gamma_t (the
    mean of their squares) in one backward pass; every parameter then takes :func:`fisher_step`.
    The optimiser state starts fresh on every call, as a client's does each round in the authors'
    code. Trains ``model`` in place; returns the mean training loss of the last epoch.
    """
    _check_data(x, y, batch_size)
    if not _is_count(epochs, 1):
        raise ConfigError("epochs", epochs, "an integer >= 1")
    _check_rates(lr, damping, momentum, fisher_momentum)
    device = torch.device(device)
    model.to(device).train()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    states = {n: FisherMomentum.zeros_like(p) for n, p in params.items()}
    generator = torch.Generator().manual_seed(seed)
    last_epoch_loss = float("nan")
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(x), batch_size):
            index = order[start : start + batch_size]
            gradients, losses = _per_sample_gradients(
                model, x[index].to(device), y[index].to(device)
            )
            with torch.no_grad():
                for name, param in params.items():
                    g_i = gradients[name]
                    new_param, states[name] = fisher_step(
                        param,
                        g_i.mean(dim=0),
                        g_i.square().mean(dim=0),
                        states[name],
                        lr=lr,
                        damping=damping,
                        momentum=momentum,
                        fisher_momentum=fisher_momentum,
                    )
                    param.copy_(new_param)
            total += losses.sum().item()
        last_epoch_loss = total / len(x)
    return last_epoch_loss
