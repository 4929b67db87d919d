"""FedOSD: Pan, Wang, Li, Zheng, Wang, Tang, Zhao, *Federated Unlearning with Gradient Descent and
Conflict Mitigation* (AAAI 2025, arXiv:2412.20200), Flower-free.

Three parts, each following the authors' code (github.com/zibinpan/FedOSD,
``tfedplat/algorithm/unlearning/{FedOSD,UnlearnAlgorithm}.py``); the paper's body was not readable
here, so where the two could differ the code is followed:

* Unlearning Cross-Entropy (UCE, :func:`unlearning_cross_entropy`): the leaving client *descends*
  ``L_U = -mean_i log(1 - p_{y_i}(x_i) / 2)``. It is 0 at ``p_y = 0`` and below ``log 2`` everywhere,
  so descent drives ``p_y`` to 0 without the unbounded growth of gradient ascent on CE.
* Orthogonal Steepest Descent (:func:`orthogonal_steepest_descent`): the direction nearest to the
  unlearning gradient ``g_u`` among those orthogonal to every remaining client's gradient,
  ``d = g_u - A^T (A A^T)^+ A g_u`` (rows of ``A``: the remaining gradients), rescaled to ``||g_u||``;
  the server steps ``w <- w - lr * d``. To first order no remaining client's loss changes.
* Post-training without reverting (:func:`non_reverting`, :func:`post_training_step`): each
  remaining client's gradient ``g_i`` loses its component along the unlearning displacement
  ``g_a = w - w_0`` (``w_0``: the model before unlearning), is rescaled to ``||g_i||``, and the
  server descends the plain mean of these, so no step brings the model back towards ``w_0``.

Ours (not in the code): a zero projected direction gives a zero step (the code divides by its
zero norm); singular values of ``A`` below ``rtol`` times the largest are treated as zero (the
code thresholds the eigenvalues of ``A A^T`` at an absolute 1e-6); :func:`client_gradient` returns
the exact gradient of the mean loss over the client's data, where the code's clients send the
pseudo-gradient ``(w - w_local) / lr`` of one local epoch of mini-batch SGD
(:func:`pseudo_gradient` computes that one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fedunlearn.errors import ConfigError

Gradient = Mapping[str, torch.Tensor]

#: The code's learning-rate decay per round (its README command for CIFAR-10 also runs R = 200
#: rounds of which UR = 100 unlearn, server lr 4e-4 in unlearning and r_lr 1e-6 in post-training;
#: the run config's fedosd-* keys hold the values this platform uses, docs/baselines.md why).
DEFAULT_LR_DECAY = 0.999


def unlearning_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """UCE, ``-mean_i log(1 - softmax(z_i)_{y_i} / 2)``, in ``[0, log 2)``.

    The code's ``UnLearningCELoss`` (mean reduction). ``log1p`` keeps it exact where ``p_y`` is small.
    """
    if logits.dim() != 2 or labels.dim() != 1 or len(labels) != len(logits):
        raise ConfigError(
            "labels",
            f"logits {tuple(logits.shape)}, labels {tuple(labels.shape)}",
            "logits of shape (n, K) and n integer labels",
        )
    p_y = torch.softmax(logits, dim=1).gather(1, labels.long().unsqueeze(1)).squeeze(1)
    return -torch.log1p(-p_y / 2).mean()


def client_gradient(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str = "ce",
    batch_size: int | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Gradient of the mean ``loss`` over all of ``(x, y)`` at ``model``'s weights, by parameter name.

    ``loss="ce"`` for a remaining client, ``"uce"`` for the leaving one (the code swaps the leaving
    client's criterion for UCE). Batches only bound memory: each batch's mean-loss gradient is
    weighted by its share of the samples, so the result does not depend on ``batch_size``. The
    model is left unchanged (``.grad`` untouched, buffers restored); tensors come back on the CPU.
    """
    if loss not in ("ce", "uce"):
        raise ConfigError("loss", loss, "ce (remaining client) or uce (leaving client)")
    if len(x) == 0 or len(y) != len(x):
        raise ConfigError("x", f"{len(x)} samples, {len(y)} labels", "one label per sample, >= 1")
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError("batch_size", batch_size, "None (all at once) or an integer >= 1")
    loss_fn = unlearning_cross_entropy if loss == "uce" else nn.functional.cross_entropy
    device = torch.device(device)
    model.to(device).train()
    params = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    total = {k: torch.zeros_like(p, dtype=torch.float64) for k, p in params}
    buffers = {k: b.clone() for k, b in model.named_buffers()}  # BatchNorm stats must not move
    step = batch_size or len(x)
    for start in range(0, len(x), step):
        inputs, targets = x[start : start + step].to(device), y[start : start + step].to(device)
        grads = torch.autograd.grad(loss_fn(model(inputs), targets), [p for _, p in params])
        for (k, _), g in zip(params, grads):
            total[k] += g.double() * (len(inputs) / len(x))
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(buffers[k])
    return {k: total[k].to(p.dtype).cpu() for k, p in params}


def pseudo_gradient(before: Gradient, after: Gradient, lr: float) -> dict[str, torch.Tensor]:
    """``(w - w_local) / lr``: what the code's clients send after local SGD at rate ``lr``."""
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError("lr", lr, "a finite number > 0")
    return {k: (before[k].detach().cpu() - after[k].detach().cpu()) / lr for k in after}


def _flatten(vector: Gradient | torch.Tensor, keys: Sequence[str], name: str) -> torch.Tensor:
    if isinstance(vector, torch.Tensor):
        return vector.detach().cpu().double().reshape(-1)
    if set(vector) != set(keys):
        raise ConfigError(
            name, sorted(vector), f"the same tensors as the first gradient {list(keys)}"
        )
    return torch.cat([vector[k].detach().cpu().double().reshape(-1) for k in keys])


def _like(
    flat: torch.Tensor, template: Gradient | torch.Tensor
) -> dict[str, torch.Tensor] | torch.Tensor:
    """``flat`` back in ``template``'s form (a 1-D tensor or a dict of shaped tensors)."""
    if isinstance(template, torch.Tensor):
        return flat.to(template.dtype).reshape(template.shape)
    out, offset = {}, 0
    for key, t in template.items():
        out[key] = flat[offset : offset + t.numel()].reshape(t.shape).to(t.dtype)
        offset += t.numel()
    return out


def _keys(vector: Gradient | torch.Tensor) -> list[str]:
    return [] if isinstance(vector, torch.Tensor) else list(vector)


def orthogonal_steepest_descent(
    unlearning_gradient: Gradient | torch.Tensor,
    remaining_gradients: Sequence[Gradient | torch.Tensor],
    *,
    rescale: bool = True,
    rtol: float = 1e-6,
) -> dict[str, torch.Tensor] | torch.Tensor:
    """The OSD direction ``d``; the server steps ``w <- w - lr * d``.

    ``d = g_u - A^T (A A^T)^+ A g_u`` (the code's ``get_nearest_oth_d``): ``g_u`` minus its
    projection on the span of the remaining gradients (rows of ``A``), so ``<d, g_i> = 0`` for
    every remaining ``g_i`` and ``<d, g_u> = ||d||^2 >= 0``: a descent direction for UCE whenever
    ``g_u`` is not in that span, otherwise ``d = 0`` (ours: no step). With ``rescale`` (the code)
    ``d`` is scaled to ``||g_u||``. The basis of the span comes from an SVD of ``A`` in float64,
    keeping singular values above ``rtol`` times the largest, so duplicated or dependent
    gradients are harmless. Returns ``d`` in the form of ``unlearning_gradient``.

    Parameters
    ----------
    unlearning_gradient : the leaving client's UCE gradient ``g_u`` (mean over leaving clients).
    remaining_gradients : the remaining clients' CE gradients, same keys/shape as ``g_u``.
    """
    if not (0 < rtol < 1):
        raise ConfigError("rtol", rtol, "a number in (0, 1)")
    keys = _keys(unlearning_gradient)
    g_u = _flatten(unlearning_gradient, keys, "unlearning_gradient")
    d = g_u.clone()
    if len(remaining_gradients) > 0:
        a = torch.stack([_flatten(g, keys, "remaining_gradients") for g in remaining_gradients])
        if a.shape[1] != g_u.numel():
            raise ConfigError(
                "remaining_gradients", tuple(a.shape), f"rows of {g_u.numel()} entries"
            )
        _, s, vh = torch.linalg.svd(a, full_matrices=False)
        if len(s) > 0 and s[0] > 0:
            basis = vh[s > rtol * s[0]]  # orthonormal rows spanning the remaining gradients
            d = g_u - basis.T @ (basis @ g_u)
    norm_d, norm_u = torch.linalg.vector_norm(d), torch.linalg.vector_norm(g_u)
    if norm_d <= rtol * norm_u or norm_d == 0:
        d = torch.zeros_like(g_u)  # g_u lies in the span: no non-conflicting descent exists
    elif rescale:
        d = d / norm_d * norm_u
    return _like(d, unlearning_gradient)


def non_reverting(
    gradient: Gradient | torch.Tensor,
    displacement: Gradient | torch.Tensor,
    *,
    only_if_conflicting: bool = False,
    rescale: bool = True,
) -> dict[str, torch.Tensor] | torch.Tensor:
    """A post-training gradient with its component along the unlearning displacement removed.

    ``g - (<g, g_a> / ||g_a||^2) g_a``, rescaled to ``||g||`` (the code's post-training stage),
    where ``g_a = w - w_0`` is the current model minus the model before unlearning and the step
    is ``w <- w - lr * g``. The step is then orthogonal to ``g_a``, so ``||w - w_0||`` cannot
    shrink: the model never moves back towards ``w_0``. The code always projects;
    ``only_if_conflicting`` (ours) projects only where ``<g, g_a> > 0``, i.e. where the step
    ``-g`` would move towards ``w_0``, and leaves other gradients unchanged. A zero displacement
    (nothing unlearned yet) leaves ``g`` unchanged; a projection to zero gives zero (ours).
    """
    keys = _keys(gradient)
    g = _flatten(gradient, keys, "gradient")
    g_a = _flatten(displacement, keys, "displacement")
    if g_a.numel() != g.numel():
        raise ConfigError("displacement", g_a.numel(), f"{g.numel()} entries, like gradient")
    norm_a2 = g_a @ g_a
    inner = g @ g_a
    if norm_a2 == 0 or (only_if_conflicting and inner <= 0):
        return _like(g, gradient)
    projected = g - inner / norm_a2 * g_a
    norm_p, norm_g = torch.linalg.vector_norm(projected), torch.linalg.vector_norm(g)
    if rescale and norm_p > 1e-12 * norm_g:
        projected = projected / norm_p * norm_g
    elif rescale:
        projected = torch.zeros_like(g)  # g is parallel to g_a: nothing safe is left of it
    return _like(projected, gradient)


def _step(state: Gradient, direction: Gradient, lr: float) -> dict[str, torch.Tensor]:
    """``w - lr * d`` on the keys of ``direction``; other tensors (buffers) are copied."""
    if not (lr >= 0 and math.isfinite(lr)):
        raise ConfigError("lr", lr, "a finite number >= 0")
    missing = sorted(set(direction) - set(state))
    if missing:
        raise ConfigError("direction", missing, "names of tensors in the model state")
    out = {k: v.detach().cpu().clone() for k, v in state.items()}
    for k, d in direction.items():
        out[k] = (out[k].double() - lr * d.detach().cpu().double()).to(out[k].dtype)
    return out


def _mean(gradients: Sequence[Gradient], name: str) -> dict[str, torch.Tensor]:
    if len(gradients) == 0:
        raise ConfigError(name, "no gradients", "at least one client's gradient")
    return {
        k: sum(g[k].detach().cpu().double() for g in gradients) / len(gradients)
        for k in gradients[0]
    }


def unlearning_step(
    state: Gradient,
    unlearning_gradients: Sequence[Gradient],
    remaining_gradients: Sequence[Gradient],
    lr: float,
) -> dict[str, torch.Tensor]:
    """One server unlearning round: ``w <- w - lr * d`` with ``d`` the OSD direction (rescaled to
    ``||g_u||``) of the plain mean ``g_u`` of the leaving clients' UCE gradients (the code's
    ``train_a_round`` before the recovery stage; the server SGD has no momentum)."""
    g_u = _mean(unlearning_gradients, "unlearning_gradients")
    return _step(state, orthogonal_steepest_descent(g_u, list(remaining_gradients)), lr)


def post_training_step(
    state: Gradient,
    original_state: Gradient,
    remaining_gradients: Sequence[Gradient],
    lr: float,
    *,
    only_if_conflicting: bool = False,
) -> dict[str, torch.Tensor]:
    """One post-training round: each remaining gradient goes through :func:`non_reverting` with
    ``g_a = state - original_state`` (``original_state``: the model before unlearning), then
    ``w <- w - lr * mean_i g_i`` (plain mean, as in the code)."""
    keys = list(remaining_gradients[0]) if remaining_gradients else []
    g_a = {
        k: state[k].detach().cpu().double() - original_state[k].detach().cpu().double()
        for k in keys
    }
    projected = [
        non_reverting(g, g_a, only_if_conflicting=only_if_conflicting) for g in remaining_gradients
    ]
    return _step(state, _mean(projected, "remaining_gradients"), lr)


def learning_rate(round_index: int, initial_lr: float, decay: float = DEFAULT_LR_DECAY) -> float:
    """``initial_lr * decay ** round_index``: the code's schedule (``adjust_learning_rate``), with
    the round counted from the start of unlearning and ``initial_lr`` the unlearning lr, then
    ``r_lr`` in post-training (the count is not reset)."""
    if not (isinstance(round_index, int) and round_index >= 0):
        raise ConfigError("round_index", round_index, "an integer >= 0")
    if not (0 < decay <= 1):
        raise ConfigError("decay", decay, "a number in (0, 1]")
    return initial_lr * decay**round_index
