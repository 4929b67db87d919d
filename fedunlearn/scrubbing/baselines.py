"""The forgetting baselines of Golatkar, Achille, Soatto, *Eternal Sunshine of the Spotless Net*
(CVPR 2020), Section 5.2, Flower-free.

Each runs on the client that holds the forgotten data D_f, as local training in the style of
:func:`fedunlearn.training.local.train_epochs`: seeded batches, a fresh SGD optimizer per call, the model
changed in place, the last epoch's mean loss returned.

* Negative gradient (:func:`negative_gradient_epochs`): gradient *ascent* on the cross-entropy of
  D_f, each sample's loss clamped at chance level ``log K`` so that a sample already forgotten (its
  loss at or above chance) gives no gradient and the ascent cannot diverge.
* Random labels (:func:`random_label_epochs`): fine-tune on D_f with every label replaced by one of
  the K - 1 other classes, uniformly, redrawn each epoch (:func:`random_labels`).
* Hiding (:func:`hide_class`): re-initialise the forgotten class's row of the final linear layer,
  so the class is hidden from the output while the features stay as they were.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.training.local import train_epochs


def _is_count(value: object, minimum: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def _check_training_arguments(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    num_classes: int,
) -> None:
    if len(x) == 0:
        raise ConfigError("x_forget", "an empty dataset", "at least one sample to forget")
    if len(y) != len(x):
        raise ConfigError("y_forget", f"{len(y)} labels", f"one label per sample ({len(x)})")
    if not _is_count(epochs, 1):
        raise ConfigError("epochs", epochs, "an integer >= 1")
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError("lr", lr, "a finite number > 0")
    if not _is_count(batch_size, 1):
        raise ConfigError("batch_size", batch_size, "an integer >= 1")
    if not _is_count(num_classes, 2):
        raise ConfigError("num_classes", num_classes, "an integer >= 2")
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.dim() != 1:
        raise ConfigError("y_forget", f"dtype {y.dtype}, shape {tuple(y.shape)}", "integer labels")
    if int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise ConfigError(
            "y_forget", f"labels in [{int(y.min())}, {int(y.max())}]", f"in [0, {num_classes})"
        )


def chance_clamped_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Per-sample ``min(CE_i, log K)``: the negative-gradient baseline's objective (Section 5.2).

    Where ``CE_i >= log K`` (the sample is at or past chance level) the value is the constant
    ``log K`` and its gradient is exactly zero.
    """
    losses = nn.functional.cross_entropy(logits, targets, reduction="none")
    bound = math.log(num_classes)
    return torch.where(losses < bound, losses, torch.full_like(losses, bound))


def negative_gradient_epochs(
    model: nn.Module,
    x_forget: torch.Tensor,
    y_forget: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    num_classes: int,
    momentum: float = 0.0,
    device: torch.device | str = "cpu",
) -> float:
    """Negative-gradient baseline (Section 5.2): SGD ascent on D_f's loss clamped at chance.

    Maximises ``mean_i min(CE_i, log K)`` over batches of ``(x_forget, y_forget)``, so samples
    already at chance-level loss contribute no gradient; once every sample is there the weights
    stop moving. Trains ``model`` in place; returns the mean clamped loss of the last epoch.
    """
    _check_training_arguments(
        x_forget, y_forget, epochs=epochs, lr=lr, batch_size=batch_size, num_classes=num_classes
    )
    ascent = train_epochs(
        model,
        x_forget,
        y_forget,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        momentum=momentum,
        device=device,
        loss_fn=lambda logits, targets: (
            -chance_clamped_cross_entropy(logits, targets, num_classes).mean()
        ),
    )
    return -ascent


def random_labels(
    y: torch.Tensor, num_classes: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """For each label, one of the ``num_classes - 1`` *other* classes, uniformly (never ``y_i``)."""
    if not _is_count(num_classes, 2):
        raise ConfigError("num_classes", num_classes, "an integer >= 2")
    offsets = torch.randint(1, num_classes, tuple(y.shape), generator=generator)
    return (y.cpu() + offsets) % num_classes


def random_label_epochs(
    model: nn.Module,
    x_forget: torch.Tensor,
    y_forget: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    num_classes: int,
    momentum: float = 0.0,
    device: torch.device | str = "cpu",
) -> float:
    """Random-label baseline (Section 5.2): fine-tune on D_f with wrong labels.

    Every epoch draws fresh labels with :func:`random_labels` (uniform among the K - 1 classes
    other than the true one) from the seeded generator, then runs SGD on the cross-entropy of
    ``(x_forget, random labels)``. Trains ``model`` in place; returns the last epoch's mean loss
    (on that epoch's random labels).
    """
    _check_training_arguments(
        x_forget, y_forget, epochs=epochs, lr=lr, batch_size=batch_size, num_classes=num_classes
    )
    return train_epochs(
        model,
        x_forget,
        y_forget,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        momentum=momentum,
        device=device,
        relabel=lambda generator: random_labels(y_forget, num_classes, generator),
    )


def final_linear(model: nn.Module) -> nn.Linear:
    """The model's output layer: ``model.head`` when it is an ``nn.Linear``, else the last one."""
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        return head
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ConfigError("model", type(model).__name__, "a model with a final nn.Linear layer")
    return linears[-1]


@torch.no_grad()
def hide_class(model: nn.Module, label: int, *, generator: torch.Generator | None = None) -> None:
    """Hiding baseline (Section 5.2): re-initialise class ``label``'s row of the output layer.

    The row of the final linear layer (and its bias entry) is redrawn in place from nn.Linear's
    default initialisation, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weights and bias alike,
    using ``generator`` (a CPU generator; the default RNG when None). Nothing else changes.
    """
    layer = final_linear(model)
    try:
        index = operator.index(label)
    except TypeError:
        index = None
    if isinstance(label, bool) or index is None or not 0 <= index < layer.out_features:
        raise ConfigError("label", label, f"a class index in [0, {layer.out_features})")
    bound = 1.0 / math.sqrt(layer.in_features) if layer.in_features > 0 else 0.0
    row = torch.empty(layer.in_features, dtype=layer.weight.dtype)
    row.uniform_(-bound, bound, generator=generator)
    layer.weight[index].copy_(row)
    if layer.bias is not None:
        entry = torch.empty((), dtype=layer.bias.dtype).uniform_(-bound, bound, generator=generator)
        layer.bias[index].copy_(entry)
