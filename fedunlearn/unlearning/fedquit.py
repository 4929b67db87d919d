"""FedQUIT of Mora, Valerio, Bellavista, Passarella, *FedQUIT: On-Device Federated Unlearning via a
Quasi-Competent Virtual Teacher* (arXiv 2408.07587), Flower-free.

The leaving client distils, on its own data D_f, from a *virtual teacher*: the global model w^t it
received, whose output on each forget sample is edited so that the true class is penalised while
the non-true classes keep their relations. The student starts from w^t and is trained to match
that teacher; the result is sent as the client's update, and ordinary FedAvg rounds of the
remaining clients then recover the accuracy lost on the retained data.

Virtual teachers (:func:`virtual_teacher`; ``z`` the global logits of a sample, ``y`` its label):

* ``"min"`` (the paper's default, the authors' ``logit_min``): ``z_y <- min_c z_c``, per sample.
* ``"fixed"``: ``z_y <- value`` for every sample; ``value=0`` is "FedQUIT-logits" of the paper's
  first version (the authors' ``logit``/``logit_v``).
* ``"entropy"`` (the authors' ``logit_d``): ``z_y <- sum_{c != y} q_c z_c`` with ``q`` the softmax
  (at the temperature) over the non-true classes only.
* ``"softmax"`` ("FedQUIT-softmax" of the first version, the authors' ``softmax``): on
  ``p = softmax(z / T)``, the true class gets ``1/K`` and each non-true class gains
  ``(p_y - 1/K) / (K - 1)``, so the sum stays 1 and the non-true ranking is kept.

The teacher is ``softmax(z_virtual / T)``; the loss is the forward KL, teacher to student,
``KL(p_teacher || softmax(z_student / T))`` averaged over the batch (Keras ``KLDivergence(y_true=
teacher, y_pred=student)`` in the authors' code), optionally times ``T^2`` (off by default there).

Ours (not fixed by the paper or code): the teacher is the received model in eval mode, computed
once on D_f before the first step (the authors evaluate the frozen global model with
``training=False`` per batch: the same numbers, without augmentation, which this platform lacks);
in the ``"softmax"`` variant, where ``p_y < 1/K`` makes a non-true entry negative, entries are
clamped at 0 and the row renormalised (the authors' code would feed a negative probability).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from fedunlearn.errors import ConfigError

VARIANTS = ("min", "fixed", "entropy", "softmax")
OPTIMIZERS = ("adam", "sgd")


def _is_count(value: object, minimum: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def _is_positive(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < math.inf


def _check_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.shape[1] < 2:
        raise ConfigError("logits", tuple(logits.shape), "a (batch, K >= 2) tensor")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dim() != 1:
        raise ConfigError(
            "labels", f"dtype {labels.dtype}, shape {tuple(labels.shape)}", "integer labels"
        )
    if len(labels) != len(logits):
        raise ConfigError(
            "labels", f"{len(labels)} labels", f"one per row of logits ({len(logits)})"
        )
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= logits.shape[1]):
        raise ConfigError(
            "labels", f"in [{int(labels.min())}, {int(labels.max())}]", f"in [0, {logits.shape[1]})"
        )


def _check_teacher_options(variant: object, value: object, temperature: object) -> None:
    if variant not in VARIANTS:
        raise ConfigError("variant", variant, f"one of {', '.join(VARIANTS)}")
    if not (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ):
        raise ConfigError("value", value, "a finite number (the true-class logit of 'fixed')")
    if not _is_positive(temperature):
        raise ConfigError("temperature", temperature, "a finite number > 0")


@torch.no_grad()
def virtual_teacher(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    variant: str = "min",
    value: float = 0.0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The quasi-competent virtual teacher's probabilities on D_f (the paper's Section 3, Fig. 1).

    Parameters
    ----------
    logits : the global model's logits ``z`` on the forget samples, shape ``(n, K)``.
    labels : their true classes ``y``, shape ``(n,)``.
    variant : ``"min"``, ``"fixed"``, ``"entropy"`` or ``"softmax"`` (see the module docstring).
    value : the true-class logit ``v`` of the ``"fixed"`` variant (0 gives FedQUIT-logits).
    temperature : ``T`` of the teacher's softmax.

    Returns
    -------
    ``(n, K)`` probabilities: ``softmax(z_virtual / T)`` (or the redistributed softmax).
    """
    _check_labels(logits, labels)
    _check_teacher_options(variant, value, temperature)
    z = logits.detach().float()
    rows = torch.arange(len(z), device=z.device)
    labels = labels.to(z.device)
    true_mask = nn.functional.one_hot(labels, z.shape[1]).bool()
    if variant == "softmax":
        return _redistributed_softmax(z / temperature, rows, labels)
    if variant == "min":
        v = z.min(dim=1).values
    elif variant == "fixed":
        v = torch.full((len(z),), float(value), device=z.device)
    else:  # entropy: the non-true logits' mean under their own softmax
        q = torch.softmax((z / temperature).masked_fill(true_mask, -math.inf), dim=1)
        v = (q * z.masked_fill(true_mask, 0.0)).sum(dim=1)
    z_virtual = z.clone()
    z_virtual[rows, labels] = v
    return torch.softmax(z_virtual / temperature, dim=1)


def _redistributed_softmax(
    scaled: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """FedQUIT-softmax: the true class set to ``1/K``, its excess shared equally by the others."""
    p = torch.softmax(scaled, dim=1)
    k = p.shape[1]
    p_true = p[rows, labels]
    teacher = p + ((p_true - 1.0 / k) / (k - 1)).unsqueeze(1)
    teacher[rows, labels] = 1.0 / k
    # Ours: only when p_y < 1/K can an entry go negative; clamp and renormalise so it stays a
    # distribution (a no-op otherwise, the row already sums to 1).
    teacher = teacher.clamp_min(0.0)
    return teacher / teacher.sum(dim=1, keepdim=True)


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_probs: torch.Tensor,
    temperature: float = 1.0,
    *,
    scale_by_temperature_squared: bool = False,
) -> torch.Tensor:
    """Mean over the batch of ``KL(p_teacher || softmax(z_student / T))`` (the paper's KD loss).

    Parameters
    ----------
    student_logits : the student's logits, shape ``(n, K)``.
    teacher_probs : the virtual teacher's probabilities (:func:`virtual_teacher`), same shape.
    temperature : ``T`` of the student's softmax (use the teacher's).
    scale_by_temperature_squared : multiply by ``T^2`` (Hinton et al.'s gradient scale; off in
        the authors' default).

    Returns
    -------
    A scalar tensor, differentiable in ``student_logits``; terms with ``p_teacher = 0`` count 0.
    """
    if student_logits.shape != teacher_probs.shape or student_logits.dim() != 2:
        raise ConfigError(
            "teacher_probs",
            f"shape {tuple(teacher_probs.shape)}",
            f"the student logits' (n, K) shape {tuple(student_logits.shape)}",
        )
    if not _is_positive(temperature):
        raise ConfigError("temperature", temperature, "a finite number > 0")
    log_student = torch.log_softmax(student_logits / temperature, dim=1)
    target = teacher_probs.to(log_student)
    # xlogy gives 0 * log 0 = 0, so a teacher with zero mass on a class adds nothing there.
    per_sample = (torch.xlogy(target, target) - target * log_student).sum(dim=1)
    loss = per_sample.mean()
    return loss * temperature**2 if scale_by_temperature_squared else loss


@torch.no_grad()
def teacher_targets(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    variant: str = "min",
    value: float = 0.0,
    temperature: float = 1.0,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The virtual teacher (:func:`virtual_teacher`) of ``model`` in eval mode on all of ``(x, y)``.

    Returned on the CPU, one row per sample, so training can slice it with the batch indices.
    """
    model.to(device).eval()
    rows = [
        virtual_teacher(
            model(x[start : start + batch_size].to(device)),
            y[start : start + batch_size].to(device),
            variant=variant,
            value=value,
            temperature=temperature,
        ).cpu()
        for start in range(0, len(x), batch_size)
    ]
    return torch.cat(rows)


def _check_training_arguments(
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: object,
    lr: object,
    batch_size: object,
    optimizer: object,
) -> None:
    if len(x) == 0:
        raise ConfigError("x", "an empty dataset", "at least one sample to forget")
    if len(y) != len(x):
        raise ConfigError("y", f"{len(y)} labels", f"one label per sample ({len(x)})")
    if not _is_count(epochs, 1):
        raise ConfigError("epochs", epochs, "an integer >= 1")
    if not _is_positive(lr):
        raise ConfigError("lr", lr, "a finite number > 0")
    if not _is_count(batch_size, 1):
        raise ConfigError("batch_size", batch_size, "an integer >= 1")
    if optimizer not in OPTIMIZERS:
        raise ConfigError("optimizer", optimizer, f"one of {', '.join(OPTIMIZERS)}")


def fedquit_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    momentum: float = 0.0,
    device: torch.device | str = "cpu",
    temperature: float = 1.0,
    variant: str = "min",
    value: float = 0.0,
    optimizer: str = "adam",
    scale_by_temperature_squared: bool = False,
) -> float:
    """FedQUIT's client step: distil ``model`` on D_f = ``(x, y)`` from its own virtual teacher.

    The teacher is the model as received (eval mode, frozen: :func:`teacher_targets`); the model is
    then trained in place, ``epochs`` passes of seeded batches (the same permutations as
    :func:`fedunlearn.training.local.train_epochs` draws for the seed), minimising
    :func:`distillation_loss`. ``optimizer`` is ``"adam"`` (the authors': Adam, lr 1e-4, 1 epoch,
    batch 32 for ResNet-18) or ``"sgd"`` (with ``momentum``), fresh on each call.

    Returns the mean distillation loss of the last epoch.
    """
    _check_training_arguments(x, y, epochs, lr, batch_size, optimizer)
    device = torch.device(device)
    targets = teacher_targets(
        model, x, y, variant=variant, value=value, temperature=temperature, device=device
    )
    model.to(device).train()
    if optimizer == "adam":
        step = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        step = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed)
    last_epoch_loss = float("nan")
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(x), batch_size):
            index = order[start : start + batch_size]
            step.zero_grad(set_to_none=True)
            loss = distillation_loss(
                model(x[index].to(device)),
                targets[index].to(device),
                temperature,
                scale_by_temperature_squared=scale_by_temperature_squared,
            )
            loss.backward()
            step.step()
            total += loss.item() * len(index)
        last_epoch_loss = total / len(x)
    return last_epoch_loss
