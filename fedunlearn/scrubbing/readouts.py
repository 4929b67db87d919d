"""Readouts of forgetting (Golatkar, Achille, Soatto, *Eternal Sunshine of the Spotless Net*,
CVPR 2020, Section 5.3), Flower-free.

How much a scrubbed model still knows about the forgotten data D_f is read out from its behaviour,
compared with a model retrained from scratch on the retained data D_r alone:

* **Error** on D_r, D_f and D_test (:func:`error_rate`): a model that forgot D_f errs on it about
  as often as on D_test, while keeping a low error on D_r.
* **Entropy** of the output distribution (:func:`output_entropy`, :func:`plot_entropy_histograms`):
  a model that forgot D_f is as uncertain on D_f as on unseen D_test. Much *higher* entropy on D_f
  than on D_test gives the forgetting away (the *Streisand effect*).
* **Relearn time** (:func:`relearn_time`, :func:`plot_relearn_times`): the number of fine-tuning
  steps on the full data D = D_r + D_f needed until the loss on D_f falls below a threshold. Weights
  that still hold information about D_f relearn it faster than a retrained model does.
* **Remaining information vs. error** (:func:`plot_information_tradeoff`, the paper's Fig. 2): the
  scrub's noise weight lambda trades the bound on the information left about D_f (Proposition 2,
  in nats) against the error on D_f and D_test.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.plots import (
    caption,
    display_name,
    legend_outside,
    method_colour,
    save_figure,
    spread_labels,
)

#: The lowest entropy (nats) the log axis may reach; lower ones (and 0) are drawn at the axis'
#: floor, and a method whose median is there is labelled so.
ENTROPY_FLOOR = 1e-6
#: The white box behind a λ label: readable where it crosses a line.
LABEL_BOX = {"boxstyle": "round,pad=0.05", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
#: The splits' colours (D_r, D_f, D_test in that order): not any method's colour.
SPLIT_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#dadaeb", "#fdd0a2")


# --------------------------------------------------------------------------- readouts on outputs


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_batch_size(batch_size: int) -> None:
    if not (_is_integer(batch_size) and batch_size >= 1):
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
    if not (_is_real(threshold) and threshold > 0 and math.isfinite(threshold)):
        raise ConfigError("threshold", threshold, "a finite loss level > 0 (nats)")
    if not (_is_integer(check_every) and check_every >= 1):
        raise ConfigError("check_every", check_every, "an integer >= 1 (SGD steps)")
    if not (_is_real(max_epochs) and max_epochs > 0 and math.isfinite(max_epochs)):
        raise ConfigError("max_epochs", max_epochs, "a finite number of epochs > 0")
    if not (_is_real(lr) and lr > 0):
        raise ConfigError("lr", lr, "a learning rate > 0")
    if not (_is_real(momentum) and 0 <= momentum < 1):
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


# ---------------------------------------------------------------------------------- plots


def d_f_caption(forget: str | None = None) -> str:
    """The caption line that says what D_f, D_r and D_test are (``forget``: which data D_f is,
    e.g. "class:3 (137 samples)")."""
    what = f" ({forget})" if forget else ""
    return (
        f"D_f: the data to forget{what}; D_r: the retained training data; "
        "D_test: held-out test data."
    )


def entropy_figure(
    entropies: Mapping[str, Mapping[str, np.ndarray]],
    *,
    num_classes: int | None = None,
    forget: str | None = None,
):
    """Output entropy per split and method in one panel (Section 5.3): a box per (method, split),
    quartiles and median, whiskers at the 5th and 95th percentiles, on a log axis (the entropies
    of confident predictions span decades near 0, where histograms show only spikes).

    Parameters
    ----------
    entropies : mapping
        ``{method: {split: entropies}}``, splits typically ``"D_r"``, ``"D_f"``, ``"D_test"``
        (from :func:`output_entropy`). Empty arrays and non-finite values are skipped.
    num_classes : int, optional
        K; a dotted line marks log K, the entropy of the uniform prediction.
    forget : str, optional
        Which data D_f is, for the caption.
    """
    if not entropies:
        raise ConfigError("entropies", dict(entropies), "at least one method's entropies")
    if num_classes is not None and not (_is_integer(num_classes) and num_classes >= 2):
        raise ConfigError("num_classes", num_classes, "an integer >= 2, or None")
    cleaned = _finite_entropies(entropies)
    split_names = list(dict.fromkeys(s for splits in entropies.values() for s in splits))
    colours = {split: SPLIT_COLOURS[i % len(SPLIT_COLOURS)] for i, split in enumerate(split_names)}
    fig, ax = plt.subplots(figsize=(max(7.0, 0.85 * len(cleaned) + 2.5), 4.6))
    width = 0.8 / max(len(split_names), 1)
    floor = _entropy_floor(cleaned)
    for i, split in enumerate(split_names):
        offset = (i - (len(split_names) - 1) / 2) * width
        _entropy_boxes(ax, cleaned, split, (offset, width * 0.9), colours[split], floor)
    _floor_labels(ax, cleaned, floor)
    handles = [Patch(facecolor=colours[s], edgecolor="black", label=s) for s in split_names]
    if num_classes is not None:
        uniform = ax.axhline(
            math.log(num_classes),
            color="black",
            linestyle=":",
            linewidth=1,
            label=f"uniform prediction (log {num_classes})",
        )
        handles.append(uniform)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, (math.log(num_classes) if num_classes else 3.0) * 2)
    ax.set_xticks(range(len(cleaned)), list(cleaned), rotation=30, ha="right")
    ax.set_ylabel(f"entropy of the softmax output\n(nats, log axis; below {floor:g} drawn at it)")
    ax.grid(axis="y", alpha=0.3, which="both")
    legend_outside(ax, handles=handles)
    ax.set_title(
        "Output entropy (Golatkar et al. 2020, Sec. 5.3): a model that forgot D_f is as uncertain\n"
        "on D_f as on D_test; much higher entropy on D_f gives the forgetting away (Streisand)",
        fontsize=10,
    )
    caption(
        fig,
        d_f_caption(forget) + " Boxes: quartiles and median; whiskers: 5th to 95th percentile.",
    )
    return fig


def _entropy_floor(cleaned: Mapping[str, Mapping[str, np.ndarray]]) -> float:
    """The log axis' lowest entropy: a power of ten under every split's 5th percentile (so that
    every box shows, a near-certain model's too), 1e-4 at most, :data:`ENTROPY_FLOOR` at least
    (a saturated softmax's entropies of 1e-15 would squeeze every other box into a line)."""
    lows = [np.percentile(v, 5) for splits in cleaned.values() for v in splits.values()]
    lows = [low for low in lows if low > 0]
    low = min(lows, default=1e-4)
    return max(ENTROPY_FLOOR, min(1e-4, 10.0 ** math.floor(math.log10(low))))


def _entropy_boxes(ax, cleaned, split: str, place, colour, floor: float) -> None:
    """One split's box in every method's group (a method without that split gets none), at
    ``place`` = (offset from the group's centre, width)."""
    offset, width = place
    positions, data = [], []
    for index, splits in enumerate(cleaned.values()):
        if split in splits:
            positions.append(index + offset)
            data.append(np.maximum(splits[split], floor))
    if not data:
        return
    boxes = ax.boxplot(
        data,
        positions=positions,
        widths=width,
        whis=(5, 95),
        showfliers=False,
        patch_artist=True,
        manage_ticks=False,
        medianprops={"color": "black"},
    )
    for box in boxes["boxes"]:
        box.set_facecolor(colour)


def _floor_labels(ax, cleaned, floor: float) -> None:
    """Above a method whose boxes are squashed on the axis' floor, one label saying which."""
    for index, splits in enumerate(cleaned.values()):
        low = [split for split, values in splits.items() if np.median(values) <= floor]
        if low:
            which = "" if len(low) == len(splits) else f"{', '.join(low)}: "
            ax.annotate(
                f"{which}median\n≤ {floor:g}",
                (index, floor),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                va="bottom",
                fontsize=7,
                zorder=5,
                bbox=LABEL_BOX,  # over the whiskers
            )


def plot_entropy_histograms(
    entropies: Mapping[str, Mapping[str, np.ndarray]],
    path: str | Path,
    *,
    num_classes: int | None = None,
    forget: str | None = None,
) -> Path:
    """:func:`entropy_figure`, saved to ``path`` (the name is the figure's first form, one
    histogram per method; the boxes now share one panel). Returns ``path``."""
    fig = entropy_figure(entropies, num_classes=num_classes, forget=forget)
    return save_figure(fig, Path(path))


def _finite_entropies(
    entropies: Mapping[str, Mapping[str, np.ndarray]],
) -> dict[str, dict[str, np.ndarray]]:
    """``{method: {split: values}}`` with non-finite values and empty splits left out."""
    cleaned: dict[str, dict[str, np.ndarray]] = {}
    for method, splits in entropies.items():
        cleaned[method] = {}
        for split, values in splits.items():
            values = np.asarray(values, dtype=np.float64).ravel()
            values = values[np.isfinite(values)]
            if values.size:
                cleaned[method][split] = values
    return cleaned


def _check_columns(frame: pd.DataFrame, required: tuple[str, ...]) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ConfigError(
            "frame",
            f"columns {list(frame.columns)} (missing {missing})",
            f"a DataFrame with columns {list(required)}",
        )


def relearn_figure(frame: pd.DataFrame, *, forget: str | None = None):
    """Relearn time per method, in epochs, as vertical bars in each method's colour (Section 5.3).

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per method, columns ``method`` and ``relearn_epochs`` (NaN/None when the threshold
        was not reached), optionally ``relearn_budget_epochs`` (the budget, where a method that did
        not reach the threshold is drawn hatched and labelled "not reached"; without it the
        largest value in the plot stands in) and ``relearn_reached`` (bool). A dashed line marks
        the ``retrain`` row, the reference every forgetting method should match.
    forget : str, optional
        Which data D_f is, for the caption.

    A method that relearned at once (0 epochs: it kept D_f) is an outlined bar of height 0 with
    its "0", drawn above the axis (the y axis starts a little below 0), as is the retrain line.
    """
    _check_columns(frame, ("method", "relearn_epochs"))
    methods = [str(m) for m in frame["method"]]
    lengths, reached = _relearn_lengths(frame)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(methods) + 2.5), 4.4))
    top = max(float(lengths.max()) if lengths.size else 1.0, 1e-12)
    for position, method, length, hit in zip(range(len(methods)), methods, lengths, reached):
        colour = method_colour(method)
        if hit:  # the outline keeps a bar of height 0 (relearned at once) visible
            ax.bar(position, length, 0.7, color=colour, edgecolor=colour, linewidth=2)
            label = f"{length:.2g}" if length else "0"
        else:
            ax.bar(position, length, 0.7, color="white", edgecolor=colour, hatch="//")
            label = f"not reached\n(> {length:.2g})"
        ax.annotate(
            label,
            (position, length),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    if "retrain" in methods:
        reference = lengths[methods.index("retrain")]
        ax.axhline(
            reference,
            color=method_colour("retrain"),
            linestyle="--",
            linewidth=1.2,
            label=f"retrain (reference): {reference:.2g} epochs",
        )
    handles, _ = ax.get_legend_handles_labels()
    if not reached.all():
        handles.append(
            Patch(facecolor="white", edgecolor="tab:gray", hatch="//", label="not reached: budget")
        )
    if handles:
        legend_outside(ax, handles=handles)
    ax.set_xticks(range(len(methods)), [display_name(m) for m in methods], rotation=30, ha="right")
    ax.set_ylim(-0.04 * top, 1.3 * top)  # below 0: a zero bar and a retrain line at 0 show
    ax.set_ylabel("epochs of fine-tuning on D = D_r + D_f\nuntil D_f's loss is relearned")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(
        "Relearn time (Golatkar et al. 2020, Sec. 5.3): faster than retrain\n"
        "means information about D_f is still in the weights",
        fontsize=10,
    )
    caption(fig, d_f_caption(forget))
    return fig


def _relearn_lengths(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's bar height (its relearn time, or the budget when it was not reached) and
    whether it was reached."""
    values = pd.to_numeric(frame["relearn_epochs"], errors="coerce").to_numpy(dtype=float)
    reached = np.isfinite(values)
    if "relearn_reached" in frame.columns:
        reached &= frame["relearn_reached"].fillna(False).astype(bool).to_numpy()
    if "relearn_budget_epochs" in frame.columns:
        budgets = pd.to_numeric(frame["relearn_budget_epochs"], errors="coerce").to_numpy(float)
    else:
        budgets = np.full(len(frame), np.nan)
    known = np.concatenate([values[reached], budgets[np.isfinite(budgets)]])
    fallback = float(known.max()) if known.size and known.max() > 0 else 1.0
    budgets = np.where(np.isfinite(budgets), budgets, fallback)
    return np.where(reached, values, budgets), reached


def plot_relearn_times(frame: pd.DataFrame, path: str | Path, *, forget: str | None = None) -> Path:
    """:func:`relearn_figure`, saved to ``path``; returns ``path``."""
    return save_figure(relearn_figure(frame, forget=forget), Path(path))


def information_tradeoff_figure(frame: pd.DataFrame, *, forget: str | None = None):
    """Remaining information about D_f vs. error, per method and lambda (the paper's Fig. 2).

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per (method, lambda): columns ``method``, ``lam``, ``information_nats`` (the
        Proposition 2 bound, nats), ``error_forget`` and ``error_test`` (fractions in [0, 1],
        plotted in percent). Rows with a non-positive or NaN information bound cannot be drawn
        on the log axis and are dropped.
    forget : str, optional
        Which data D_f is, for the caption.

    Each point is labelled with its λ; labels that would overlap are moved apart.
    """
    _check_columns(frame, ("method", "lam", "information_nats", "error_forget", "error_test"))
    data = frame.copy()
    data["information_nats"] = pd.to_numeric(data["information_nats"], errors="coerce")
    data = data[np.isfinite(data["information_nats"]) & (data["information_nats"] > 0)]

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharex=True)
    panels = (("error_forget", "error on D_f (%)"), ("error_test", "error on D_test (%)"))
    labels = {ax: [] for ax in axes}
    for ax, (column, label) in zip(axes, panels):
        for method, rows in data.groupby("method", sort=False):
            labels[ax] += _tradeoff_line(ax, str(method), rows, column)
        if data.empty:
            ax.text(
                0.5,
                0.5,
                "no positive, finite information bound to plot",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        else:
            ax.set_xscale("log")
            ax.margins(x=0.1, y=0.15)  # room for the lambda labels
        ax.set_xlabel("information left about D_f, upper bound (nats)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    legend_outside(axes[1])
    fig.suptitle(
        "Forgetting trade-off (Golatkar et al. 2020, Fig. 2): more noise (larger λ) leaves\n"
        "less information about D_f, at the price of more error; points labelled with λ",
        fontsize=10,
    )
    caption(fig, d_f_caption(forget))
    fig.tight_layout()
    for ax in axes:
        spread_labels(ax, labels[ax])
    return fig


def _tradeoff_line(ax, method: str, rows: pd.DataFrame, column: str) -> list:
    """One method's line of λ points in its colour; returns its λ labels."""
    rows = rows.sort_values("information_nats")
    errors = pd.to_numeric(rows[column], errors="coerce") * 100.0
    colour = method_colour(method)
    ax.plot(rows["information_nats"], errors, marker="o", color=colour, label=display_name(method))
    text = tuple(0.7 * c for c in to_rgb(colour))  # darker: a light line colour reads as text too
    return [
        ax.annotate(
            f"{lam:.0e}".replace("e-0", "e-") if _is_real(lam) else str(lam),
            (x, y),
            textcoords="offset points",
            xytext=(0, 5),
            ha="center",
            fontsize=7,
            color=text,
            zorder=5,
            bbox=LABEL_BOX,
        )
        for x, y, lam in zip(rows["information_nats"], errors, rows["lam"])
        if np.isfinite(y)
    ]


def plot_information_tradeoff(
    frame: pd.DataFrame, path: str | Path, *, forget: str | None = None
) -> Path:
    """:func:`information_tradeoff_figure`, saved to ``path``; returns ``path``."""
    return save_figure(information_tradeoff_figure(frame, forget=forget), Path(path))
