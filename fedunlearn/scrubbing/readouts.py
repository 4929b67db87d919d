"""Readouts of forgetting (Golatkar, Achille, Soatto, *Eternal Sunshine of the Spotless Net*,
CVPR 2020, Section 5.3), Flower-free: the computations; their figures are in
:mod:`fedunlearn.scrubbing.readout_figures`.

How much a scrubbed model still knows about the forgotten data D_f is read out from its behaviour,
compared with a model retrained from scratch on the retained data D_r alone:

* **Error** on D_r, D_f and D_test (:func:`error_rate`): a model that forgot D_f errs on it about
  as often as on D_test, while keeping a low error on D_r.
* **Entropy** of the output distribution (:func:`output_entropy`; drawn by
  :func:`~fedunlearn.scrubbing.readout_figures.plot_entropy_histograms`): a model that forgot D_f
  is as uncertain on D_f as on unseen D_test. Much *higher* entropy on D_f than on D_test gives the
  forgetting away (the *Streisand effect*).
* **Relearn time** (:func:`relearn_time`; drawn by
  :func:`~fedunlearn.scrubbing.readout_figures.plot_relearn_times`): the number of fine-tuning
  steps on the full data D = D_r + D_f needed until the loss on D_f falls below a threshold. Weights
  that still hold information about D_f relearn it faster than a retrained model does.
* **Remaining information vs. error**
  (:func:`~fedunlearn.scrubbing.readout_figures.plot_information_tradeoff`, the paper's Fig. 2):
  the scrub's noise weight lambda trades the bound on the information left about D_f
  (Proposition 2, in nats) against the error on D_f and D_test.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedunlearn.errors import ConfigError

# --------------------------------------------------------------------------- readouts on outputs


def is_integer(value: object) -> bool:
    """A whole number, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_batch_size(batch_size: int) -> None:
    if not (is_integer(batch_size) and batch_size >= 1):
        raise ConfigError("batch_size", batch_size, "an integer >= 1")


@torch.no_grad()
def _logits(model: nn.Module, x: torch.Tensor, device: torch.device, batch_size: int):
    """Yield the model's logits on ``x`` batch by batch, in eval mode; the mode is restored."""
    was_training = model.training
    model.to(device).eval()
    try:
        for start in range(0, len(x), batch_size):
            yield start, model(x[start : start + batch_size].to(device))
    finally:
        model.train(was_training)


def error_rate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 1024,
) -> float:
    """Fraction of ``(x, y)`` that ``model`` misclassifies (Section 5.3, "error" readout).

    The readout is taken on D_r, D_f and D_test: after forgetting, the error on D_f should be close
    to that of a model retrained on D_r alone (roughly its error on D_test).

    Parameters
    ----------
    model : nn.Module
        Classifier returning logits of shape ``(batch, K)``. Its parameters are left unchanged and
        its train/eval mode is restored after the readout.
    x, y : torch.Tensor
        Inputs and integer labels.
    device : str or torch.device, default "cpu"
        Where the forward passes run (the model is moved there).
    batch_size : int, default 1024
        Samples per forward pass.

    Returns
    -------
    float
        ``1 - accuracy``, in [0, 1]; NaN when ``x`` is empty.
    """
    _check_batch_size(batch_size)
    if len(x) != len(y):
        raise ConfigError("y", f"{len(y)} labels", f"one label per input ({len(x)} inputs)")
    if len(x) == 0:
        return float("nan")
    device = torch.device(device)
    wrong = 0
    for start, logits in _logits(model, x, device, batch_size):
        targets = y[start : start + batch_size].to(device)
        wrong += int((logits.argmax(dim=1) != targets).sum().item())
    return wrong / len(x)


def output_entropy(
    model: nn.Module,
    x: torch.Tensor,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 1024,
) -> np.ndarray:
    """Per-sample entropy, in nats, of ``softmax(model(x))`` (Section 5.3, entropy readout).

    ``H(p) = -sum_k p_k log p_k`` lies in ``[0, log K]``: 0 for a one-hot prediction, ``log K`` for
    the uniform one. A model that forgot D_f has entropies on D_f distributed like on D_test; much
    higher entropy on D_f reveals that it was forgotten (the Streisand effect).

    Returns
    -------
    np.ndarray
        float64 array of shape ``(len(x),)``; empty for empty ``x``.
    """
    _check_batch_size(batch_size)
    out = np.empty(len(x), dtype=np.float64)
    if len(x) == 0:
        return out
    for start, logits in _logits(model, x, torch.device(device), batch_size):
        log_p = torch.log_softmax(logits.double(), dim=1)
        # p log p -> 0 as p -> 0: a log-probability of -inf (0 * -inf = NaN) contributes 0.
        terms = torch.where(log_p > -math.inf, log_p.exp() * log_p, torch.zeros_like(log_p))
        entropy = -terms.sum(dim=1)
        out[start : start + len(entropy)] = entropy.clamp_min(0.0).cpu().numpy()
    return out


# ---------------------------------------------------------------------------- relearn time


@dataclass
class RelearnResult:
    """Outcome of :func:`relearn_time` (Section 5.3, "relearn time").

    Attributes
    ----------
    steps : int or None
        First SGD step count at which the mean cross-entropy on D_f was ``<= threshold``; None if
        it never was within the budget. Only checked steps count (0, ``check_every``, ...).
    epochs : float or None
        ``steps`` divided by the steps per epoch on D; None when not reached.
    reached : bool
        Whether the threshold was reached within the budget.
    curve : list of (int, float)
        ``(step, mean cross-entropy on D_f)`` at every check, step 0 first.
    threshold : float
        The loss threshold on D_f.
    steps_per_epoch : int
        ``ceil(len(D) / batch_size)``.
    budget_steps : int
        Most SGD steps allowed: ``floor(max_epochs * steps_per_epoch)``.
    """

    steps: int | None
    epochs: float | None
    reached: bool
    curve: list[tuple[int, float]] = field(default_factory=list)
    threshold: float = float("nan")
    steps_per_epoch: int = 0
    budget_steps: int = 0

    @property
    def budget_epochs(self) -> float:
        """The budget in epochs, ``budget_steps / steps_per_epoch``."""
        if self.steps_per_epoch == 0:
            return float("nan")
        return self.budget_steps / self.steps_per_epoch


@torch.no_grad()
def _mean_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, batch_size: int
) -> float:
    total = 0.0
    for start, logits in _logits(model, x, device, batch_size):
        targets = y[start : start + batch_size].to(device)
        total += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
    return total / len(x)


def relearn_time(
    model: nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_forget: torch.Tensor,
    y_forget: torch.Tensor,
    *,
    threshold: float,
    lr: float = 0.01,
    momentum: float = 0.9,
    batch_size: int = 64,
    max_epochs: float = 1.0,
    check_every: int = 10,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> RelearnResult:
    """Golatkar et al.'s relearn time (Section 5.3): SGD steps until the loss on D_f is relearned.

    A deep copy of ``model`` is fine-tuned with SGD on the full training data D = D_r + D_f
    (``x_train, y_train``, which must include D_f). The mean cross-entropy on D_f is measured at
    step 0 and after every ``check_every`` steps (and once more at the end of the budget); the
    relearn time is the first checked step at which it is ``<= threshold``. A scrubbed model that
    still holds information about D_f relearns it in fewer steps than a model retrained on D_r.

    Parameters
    ----------
    model : nn.Module
        Classifier returning logits; never modified (a deep copy is trained).
    x_train, y_train : torch.Tensor
        The full training data D, including D_f.
    x_forget, y_forget : torch.Tensor
        The forgotten data D_f, on which the loss is measured. Must be non-empty.
    threshold : float
        Loss level (mean cross-entropy on D_f, nats) counted as relearned; > 0. The paper uses the
        loss the original model had on D_f.
    lr, momentum : float
        SGD hyper-parameters of the fine-tuning.
    batch_size : int, default 64
        Mini-batch size; an epoch is ``ceil(len(D) / batch_size)`` steps, the last batch smaller.
    max_epochs : float, default 1.0
        Budget in epochs, possibly fractional: at most ``floor(max_epochs * steps_per_epoch)``
        steps.
    check_every : int, default 10
        Steps between two measurements of the loss on D_f.
    seed : int, default 0
        Seeds the shuffling of D (a ``torch.Generator``), reshuffled every epoch.
    device : str or torch.device, default "cpu"
        Where the copy is trained.

    Returns
    -------
    RelearnResult
    """
    _check_relearn_inputs(
        (x_train, y_train), (x_forget, y_forget), threshold, lr, momentum, batch_size, max_epochs,
        check_every,
    )
    device = torch.device(device)
    student = copy.deepcopy(model).to(device)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    # The tiny slack keeps e.g. 0.3 * 10 from flooring to 2 through rounding error.
    budget = int(math.floor(max_epochs * steps_per_epoch + 1e-9))
    optimizer = torch.optim.SGD(student.parameters(), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed)
    steps, curve = _fine_tune_until_relearned(
        student, optimizer, (x_train, y_train), (x_forget, y_forget), generator, device,
        threshold=threshold, batch_size=batch_size, budget=budget, check_every=check_every,
    )
    return RelearnResult(
        steps=steps,
        epochs=None if steps is None else steps / steps_per_epoch,
        reached=steps is not None,
        curve=curve,
        threshold=float(threshold),
        steps_per_epoch=steps_per_epoch,
        budget_steps=budget,
    )


def _check_relearn_inputs(
    train, forget, threshold, lr, momentum, batch_size, max_epochs, check_every
) -> None:
    """:class:`ConfigError` naming the first argument of :func:`relearn_time` that is not allowed."""
    (x_train, y_train), (x_forget, y_forget) = train, forget
    if not (is_real(threshold) and threshold > 0 and math.isfinite(threshold)):
        raise ConfigError("threshold", threshold, "a finite loss level > 0 (nats)")
    if not (is_integer(check_every) and check_every >= 1):
        raise ConfigError("check_every", check_every, "an integer >= 1 (SGD steps)")
    if not (is_real(max_epochs) and max_epochs > 0 and math.isfinite(max_epochs)):
        raise ConfigError("max_epochs", max_epochs, "a finite number of epochs > 0")
    if not (is_real(lr) and lr > 0):
        raise ConfigError("lr", lr, "a learning rate > 0")
    if not (is_real(momentum) and 0 <= momentum < 1):
        raise ConfigError("momentum", momentum, "a number in [0, 1)")
    _check_batch_size(batch_size)
    if len(x_forget) == 0:
        raise ConfigError("x_forget", "an empty forget set", "at least one sample of D_f")
    if len(x_forget) != len(y_forget):
        raise ConfigError(
            "y_forget", f"{len(y_forget)} labels", f"one label per input ({len(x_forget)} inputs)"
        )
    if len(x_train) == 0:
        raise ConfigError("x_train", "an empty dataset", "the full training data D, D_f included")
    if len(x_train) != len(y_train):
        raise ConfigError(
            "y_train", f"{len(y_train)} labels", f"one label per input ({len(x_train)} inputs)"
        )


def _fine_tune_until_relearned(
    student: nn.Module,
    optimizer: torch.optim.Optimizer,
    train: tuple[torch.Tensor, torch.Tensor],
    forget: tuple[torch.Tensor, torch.Tensor],
    generator: torch.Generator,
    device: torch.device,
    *,
    threshold: float,
    batch_size: int,
    budget: int,
    check_every: int,
) -> tuple[int | None, list[tuple[int, float]]]:
    """SGD on D (reshuffled every epoch) until the mean loss on D_f is ``<= threshold`` at a check:
    the first such checked step (None within ``budget`` steps) and the loss curve on D_f."""
    (x_train, y_train), (x_forget, y_forget) = train, forget
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    curve = [(0, _mean_loss(student, x_forget, y_forget, device, batch_size))]
    if curve[-1][1] <= threshold:
        return 0, curve
    step = 0
    order = torch.empty(0, dtype=torch.long)
    while step < budget:
        position = step % steps_per_epoch
        if position == 0:
            order = torch.randperm(len(x_train), generator=generator)
        index = order[position * batch_size : (position + 1) * batch_size]
        student.train()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(
            student(x_train[index].to(device)), y_train[index].to(device)
        )
        loss.backward()
        optimizer.step()
        step += 1
        if step % check_every == 0 or step == budget:
            curve.append((step, _mean_loss(student, x_forget, y_forget, device, batch_size)))
            if curve[-1][1] <= threshold:
                return step, curve
    return None, curve
