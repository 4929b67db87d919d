"""Local training and evaluation loops on tensors (plain PyTorch, no data loaders).

A client's data is small enough to live in memory as tensors, so batches are sliced from a
permutation drawn from a seeded generator: the same seed gives the same batches on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedunlearn.errors import ConfigError


def resolve_device(device: str = "auto") -> torch.device:
    """``cuda`` when asked for or (with ``auto``) when available, otherwise ``cpu``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cuda needs a visible CUDA GPU; use auto or cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", device, "one of auto, cpu, cuda")
    return torch.device(device)


@dataclass(frozen=True)
class EvaluationResult:
    """Mean cross-entropy loss and accuracy over ``num_examples`` samples."""

    loss: float
    accuracy: float
    num_examples: int


def train_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    device: torch.device | str = "cpu",
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    relabel: Callable[[torch.Generator], torch.Tensor] | None = None,
    proximal_mu: float = 0.0,
) -> float:
    """Train ``model`` in place with SGD for ``epochs`` passes over ``(x, y)``.

    Returns the mean training loss over the last epoch. The optimizer (and its momentum) starts
    fresh on every call, as a federated client's does each round. ``loss_fn(logits, targets)`` is
    the batch loss minimised (default: mean cross-entropy); ``relabel(generator)``, when given,
    draws each epoch's labels (before that epoch's shuffle) in place of ``y``. ``proximal_mu`` > 0
    adds FedProx's proximal term (mu/2)||w - w^t||^2 to every batch's loss (Li et al. 2020, eq. 2),
    w^t being the weights the call started from (the global model received).
    """
    if len(x) == 0:
        raise ConfigError("x", "an empty dataset", "at least one training sample")
    device = torch.device(device)
    model.to(device).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
    )
    loss_fn = proximal(loss_fn or nn.CrossEntropyLoss(), model, proximal_mu)
    generator = torch.Generator().manual_seed(seed)
    last_epoch_loss = float("nan")
    for _ in range(epochs):
        labels = y if relabel is None else relabel(generator)
        order = torch.randperm(len(x), generator=generator)
        total, count = 0.0, 0
        for start in range(0, len(x), batch_size):
            index = order[start : start + batch_size]
            inputs, targets = x[index].to(device), labels[index].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(index)
            count += len(index)
        last_epoch_loss = total / count
    return last_epoch_loss


def proximal(loss_fn: Callable, model: nn.Module, mu: float) -> Callable:
    """``loss_fn`` plus FedProx's (mu/2)||w - w^t||^2 (Li et al. 2020, eq. 2), w^t = ``model``'s
    weights now; ``loss_fn`` itself when mu = 0."""
    if mu < 0 or not math.isfinite(mu):
        raise ConfigError("proximal_mu", mu, "a finite number >= 0")
    if mu == 0:
        return loss_fn
    anchor = [p.detach().clone() for p in model.parameters()]

    def with_term(logits, targets):
        distance = sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))
        return loss_fn(logits, targets) + 0.5 * mu * distance

    return with_term


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
) -> EvaluationResult:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)``."""
    device = torch.device(device)
    model.to(device).eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        inputs = x[start : start + batch_size].to(device)
        targets = y[start : start + batch_size].to(device)
        logits = model(inputs)
        loss_sum += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        correct += (logits.argmax(dim=1) == targets).sum().item()
    n = len(x)
    if n == 0:
        return EvaluationResult(float("nan"), float("nan"), 0)
    return EvaluationResult(loss_sum / n, correct / n, n)
