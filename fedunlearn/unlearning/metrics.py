"""How far an unlearned model is from the original and from the model retrained without the targets.

The readouts of Liu et al. (FedEraser, Section V): the prediction difference to the original model
(eq. 4), the angle between last-layer weights and those of the retrained model (their Fig. 4, also
per neuron), and the L2 distance of all parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedunlearn.training.model_state import State


@torch.no_grad()
def prediction_difference(
    model: nn.Module, reference: nn.Module, x: torch.Tensor, *, batch_size: int = 1024
) -> float:
    """Eq. (4): P_diss = (1/N) Σ_i ‖softmax(M(x_i)) − softmax(M_ref(x_i))‖₂ over the N inputs."""
    model.eval()
    reference.eval()
    device_a = next(model.parameters()).device
    device_b = next(reference.parameters()).device
    total = 0.0
    for start in range(0, len(x), batch_size):
        batch = x[start : start + batch_size]
        p = torch.softmax(model(batch.to(device_a)), dim=1).cpu()
        q = torch.softmax(reference(batch.to(device_b)), dim=1).cpu()
        total += float((p - q).norm(dim=1).sum())
    return total / max(1, len(x))


def angle_degrees(a: torch.Tensor, b: torch.Tensor) -> float:
    """Angle between two tensors taken as vectors, in degrees (0 = same direction)."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    norms = float(a.norm() * b.norm())
    if norms == 0.0:
        return float("nan")
    cosine = max(-1.0, min(1.0, float(a @ b) / norms))
    return math.degrees(math.acos(cosine))


def per_neuron_angles(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Angle of each output neuron's weight row of a linear layer (Fig. 4 of Liu et al.)."""
    return [angle_degrees(row_a, row_b) for row_a, row_b in zip(a, b, strict=True)]


def l2_distance(a: State, b: State) -> float:
    """‖a − b‖₂ over all floating tensors of two states as one vector."""
    total = 0.0
    for key, value in a.items():
        if value.dtype.is_floating_point:
            total += float((value.detach().double() - b[key].detach().double()).pow(2).sum())
    return math.sqrt(total)


@torch.no_grad()
def class_accuracies(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, *, batch_size: int = 1024
) -> list[float]:
    """The accuracy of ``model`` on each class's samples of ``(x, y)`` (NaN for a class with no
    sample)."""
    model.eval()
    device = next(model.parameters()).device
    right = torch.zeros(num_classes, dtype=torch.float64)
    seen = torch.zeros(num_classes, dtype=torch.float64)
    for start in range(0, len(x), batch_size):
        labels = y[start : start + batch_size]
        predicted = model(x[start : start + batch_size].to(device)).argmax(dim=1).cpu()
        seen += torch.bincount(labels, minlength=num_classes).double()
        right += torch.bincount(labels[predicted == labels], minlength=num_classes).double()
    return [float(r / s) if s > 0 else math.nan for r, s in zip(right, seen)]


def client_accuracy(classes: list[float], label_counts: list[int] | torch.Tensor) -> float:
    """A client's accuracy: the per-class accuracies (on held-out data) weighted by the client's
    share of each label, the accuracy on held-out data drawn as its own data is (the per-client
    view of FedCCCU, "Federated unlearning in the wild"). Classes the held-out data lacks are
    left out of the weights; NaN when none is left."""
    counts = torch.as_tensor(label_counts, dtype=torch.float64)
    accuracy = torch.as_tensor(classes, dtype=torch.float64)
    known = ~torch.isnan(accuracy) & (counts > 0)
    if not bool(known.any()):
        return math.nan
    return float((accuracy[known] * counts[known]).sum() / counts[known].sum())
