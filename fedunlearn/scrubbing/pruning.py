"""Class-level federated unlearning by class-discriminative pruning.

Wang, Guo, Xie and Qi, *Federated Unlearning via Class-Discriminative Pruning* (WWW 2022; arXiv
2110.11794), the unlearning framework's three steps. Equations are numbered as the paper's display
equations appear in that section ((1) is the unlearning objective):

* **local processing** (each client, :func:`class_channel_sums`): the layer's output feature map
  O_l = X_l ⊛ w_l (eq. 2) goes through ReLU and average pooling, A_l = AvgPool(ReLU(O_l)) (eq. 3),
  one value per sample and channel, then averaged per class into A'_l ∈ R^{|U| × C_out}. A client
  sends sums and counts rather than its means, so that the server's average over clients is the
  mean over all their samples (weighting each client by how many samples of a class it holds);
* **server processing** (:func:`global_mean_activations`, :func:`tf_idf`,
  :func:`discriminative_channels`): the global representation A* is scored by TF-IDF, a channel
  being a word and a class a document: TF (eq. 4), IDF (eq. 5), TF-IDF = TF · IDF (eq. 6); the
  forgotten class's highest-scoring channels, a fraction R (``ratio``) of the layer's, are pruned
  (:func:`prune_channels`, the pruned layer of eq. 7);
* **fine-tuning**: ordinary federated training without the forgotten class (the server's part).

Which layer (``prune-layer``, :func:`pruning_layer`): ``features``, the body's last ``Linear``,
whose units after ReLU are the features φ(x) the head reads, or ``last-conv``, the body's last
``Conv2d``, the paper's convolutional channels. The paper's networks (ResNet, VGG) end in deep
convolutions whose channels are class-specific; ours have one or two shallow convolutions before a
fully connected layer, and their channels are not. Measured centrally on a trained digits-cnn
(class 3) and mnist-cnn (class 5, 12,000 samples): pruning 30 % of the last convolution's channels
left 100 % and 86 % of the class recognised (96 % and 87 % after fine-tuning on D_r), while pruning
30 % of the feature units left 0 % in both, the other classes back at 98.8 % and 98.3 % after
fine-tuning (originals 98.5 %, 98.1 %); fine-tuning alone left 100 % and 89 % (3 and 2 epochs).

Pruning zeroes the channel's filter and bias *and* the next layer's input weights for it: the
channel's activation and its every outgoing weight are then 0, so every gradient that reaches them
is 0 too and SGD fine-tuning (with or without weight decay and momentum) keeps the channel pruned,
the masked back-propagation the paper asks for with no mask.

A judge run's stack of models (``members.<i>.`` keys) is refused: the channels are one network's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.training.model_state import State
from fedunlearn.training.stacked import stack_size


@dataclass(frozen=True)
class PruningLayer:
    """The layer whose channels are scored and pruned, and the layer that reads its output.

    Parameters
    ----------
    name : str
        The layer's module path (``"body.3"``); its state keys are ``<name>.weight`` and
        ``<name>.bias``.
    next_name : str
        The module path of the first ``Conv2d`` or ``Linear`` after it (``"body.7"``, ``"head"``).
    channels : int
        C_out^l, its output channels (or units).
    """

    name: str
    next_name: str
    channels: int


#: The layers ``prune-layer`` may name (see the module docstring).
LAYERS = ("features", "last-conv")


def pruning_layer(model: nn.Module, which: str = "features") -> PruningLayer:
    """The layer whose channels are pruned, with the layer after it: ``features``, the body's last
    ``Linear`` (the units of φ(x)); ``last-conv``, the body's last ``Conv2d`` (the features for a
    network without one, e.g. ``adult-mlp``)."""
    if which not in LAYERS:
        raise ConfigError("prune-layer", which, f"one of {', '.join(LAYERS)}")
    body = getattr(model, "body", None)
    if not isinstance(body, nn.Module):
        raise ConfigError("model", type(model).__name__, "a network with a body and a head")
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    in_body = [(n, m) for n, m in layers if n.startswith("body.")]
    convolutions = [(n, m) for n, m in in_body if isinstance(m, nn.Conv2d)]
    linears = [(n, m) for n, m in in_body if isinstance(m, nn.Linear)]
    candidates = (convolutions if which == "last-conv" else []) or linears
    if not candidates:
        raise ConfigError("model", type(model).__name__, "a body with a Linear layer")
    name, layer = candidates[-1]
    following = layers[[n for n, _ in layers].index(name) + 1 :]
    if not following:
        raise ConfigError("model", type(model).__name__, f"a layer that reads {name}'s output")
    channels = layer.out_channels if isinstance(layer, nn.Conv2d) else layer.out_features
    return PruningLayer(name, following[0][0], int(channels))


def _refuse_stack(state: State) -> None:
    if stack_size(state):
        raise ConfigError(
            "judge-models",
            stack_size(state),
            "0: class-discriminative pruning prunes the channels of one network, not of a stack",
        )


# ---------------------------------------------------------------------- local processing (eqs. 2, 3)
@torch.no_grad()
def class_channel_sums(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    *,
    layer: str | None = None,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's per-class sums of A_l = AvgPool(ReLU(O_l)) (eqs. 2-3) over its samples.

    Parameters
    ----------
    model : nn.Module
        The global model (one network).
    x, y : torch.Tensor
        The client's samples and labels in ``[0, num_classes)``.
    num_classes : int
        |U|.
    layer : str, optional
        The module path of the layer (default: :func:`pruning_layer`'s ``features``).
    batch_size : int (default: 256)
        Samples per forward pass.
    device : torch.device or str (default: "cpu")
        Where the forward passes run.

    Returns
    -------
    (sums, counts) : (torch.Tensor, torch.Tensor)
        ``sums[u, j]`` = Σ over the samples of class u of channel j's pooled activation (float64,
        shape ``(num_classes, C_out)``) and ``counts[u]`` = the samples of class u (int64).
    """
    _refuse_stack(model.state_dict())
    y = torch.as_tensor(y).long().reshape(-1)
    if len(x) != len(y):
        raise ConfigError("y", f"{len(y)} labels", f"one label per sample ({len(x)})")
    if len(y) and not (0 <= int(y.min()) and int(y.max()) < num_classes):
        raise ConfigError("y", f"labels in [{int(y.min())}, {int(y.max())}]", f"[0, {num_classes})")
    name = pruning_layer(model).name if layer is None else layer
    module = model.get_submodule(name)
    pooled: list[torch.Tensor] = []
    # The hook keeps only the pooled values: a batch's feature map is never stored.
    handle = module.register_forward_hook(lambda _m, _i, out: pooled.append(_pool(out)))
    was_training = model.training
    model.to(device).eval()
    sums: torch.Tensor | None = None
    try:
        for start in range(0, len(x), batch_size):
            pooled.clear()
            model(x[start : start + batch_size].to(device))
            activation = pooled[0].double().cpu()
            if sums is None:
                sums = torch.zeros(num_classes, activation.shape[1], dtype=torch.float64)
            sums.index_add_(0, y[start : start + batch_size], activation)
    finally:
        handle.remove()
        model.train(was_training)
    if sums is None:  # no sample: the width from the layer itself
        sums = torch.zeros(num_classes, _width(module), dtype=torch.float64)
    return sums, torch.bincount(y, minlength=num_classes).to(torch.int64)


def _pool(output: torch.Tensor) -> torch.Tensor:
    """ReLU, then the mean over the spatial positions of each channel (eq. 3's AvgPooling to
    1 x 1); a linear layer's units are already one value per sample."""
    active = torch.relu(output)
    return active.mean(dim=tuple(range(2, active.dim()))) if active.dim() > 2 else active


def _width(module: nn.Module) -> int:
    return int(module.out_channels if isinstance(module, nn.Conv2d) else module.out_features)


# ---------------------------------------------------------------------- server processing (eqs. 4-6)
def global_mean_activations(
    sums: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, list[int]]:
    """A* over the classes some client holds: (``sums[u] / counts[u]`` for those classes, their
    labels). The clients' sums are added first, so A* is the mean over every sample of a class."""
    sums, counts = torch.as_tensor(sums, dtype=torch.float64), torch.as_tensor(counts)
    if sums.dim() != 2 or counts.shape != (sums.shape[0],):
        raise ConfigError(
            "sums", tuple(sums.shape), "a (classes, channels) matrix and counts of shape (classes,)"
        )
    present = [u for u in range(len(counts)) if int(counts[u]) > 0]
    means = sums[present] / counts[present].to(torch.float64).unsqueeze(1)
    return means, present


def tf_idf(mean_activations: torch.Tensor) -> torch.Tensor:
    """The TF-IDF score of every channel j for every class u (eqs. 4-6), shape ``(|U|, C)``.

    * TF^u_j = A*[u, j] / Σ_j' A*[u, j'] (eq. 4): channel j's share of class u's activation (0 for
      a class that activates no channel);
    * IDF_j = log((1 + |U|) / (1 + |{u ∈ U : A*[u, j] >= Avg(A*[u])}|)) (eq. 5), Avg(A*[u]) the
      mean of class u's row over the channels: a channel above average for many classes has an IDF
      near 0, one above average for few classes a large IDF;
    * TF-IDF^u = TF^u · IDF (eq. 6).

    ``mean_activations`` is A* (finite, non-negative: activations after ReLU), one row per class.
    """
    a = torch.as_tensor(mean_activations, dtype=torch.float64)
    if a.dim() != 2 or a.shape[0] < 2 or a.shape[1] < 1:
        raise ConfigError("mean_activations", tuple(a.shape), "a (classes >= 2, channels) matrix")
    if not torch.isfinite(a).all() or (a < 0).any():
        raise ConfigError("mean_activations", "negative or non-finite values", "finite and >= 0")
    totals = a.sum(dim=1, keepdim=True)
    tf = torch.where(totals > 0, a / totals.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    above = (a >= a.mean(dim=1, keepdim=True)).sum(dim=0).to(torch.float64)
    idf = torch.log((1.0 + a.shape[0]) / (1.0 + above))
    return tf * idf.unsqueeze(0)


def pruned_count(channels: int, ratio: float) -> int:
    """How many of ``channels`` a pruning ratio R prunes: ⌈R·C⌉ (at least one), at most C - 1
    (a layer with no channel left would cut the network)."""
    if not (isinstance(ratio, int | float) and 0.0 < float(ratio) < 1.0):
        raise ConfigError("prune-ratio", ratio, "a number in (0, 1)")
    if channels < 2:
        raise ConfigError("channels", channels, "a layer of at least 2 channels")
    # the tolerance keeps 0.1 * 50 = 5.000000000000001 at 5
    return min(max(1, math.ceil(float(ratio) * channels - 1e-9)), channels - 1)


def discriminative_channels(scores: torch.Tensor, forgotten_class: int, ratio: float) -> list[int]:
    """The forgotten class's most discriminative channels: the :func:`pruned_count` channels of
    highest TF-IDF score for it (eq. 6), highest first (a tie goes to the lower index)."""
    scores = torch.as_tensor(scores, dtype=torch.float64)
    if scores.dim() != 2:
        raise ConfigError("scores", tuple(scores.shape), "a (classes, channels) matrix")
    classes, channels = scores.shape
    if isinstance(forgotten_class, bool) or not (
        isinstance(forgotten_class, int) and 0 <= forgotten_class < classes
    ):
        raise ConfigError("forgotten_class", forgotten_class, f"a class in 0..{classes - 1}")
    count = pruned_count(channels, ratio)
    order = torch.argsort(-scores[forgotten_class], stable=True)
    return [int(j) for j in order[:count]]


def select_channels(
    sums: torch.Tensor, counts: torch.Tensor, forgotten_class: int, ratio: float
) -> tuple[list[int], torch.Tensor]:
    """The server's step from the clients' summed statistics to the channels to prune: A* over the
    classes present (:func:`global_mean_activations`), TF-IDF (eqs. 4-6) and the forgotten class's
    top channels. Returns (channels, the forgotten class's scores)."""
    means, present = global_mean_activations(sums, counts)
    if forgotten_class not in present:
        raise ConfigError("scrub-forget", f"class:{forgotten_class}", "a class some client holds")
    scores = tf_idf(means)
    row = present.index(forgotten_class)
    return discriminative_channels(scores, row, ratio), scores[row]


# ---------------------------------------------------------------------- pruning (eq. 7)
def prune_channels(
    state: State, channels: Sequence[int], layer: str, next_layer: str
) -> dict[str, torch.Tensor]:
    """``state`` with ``channels`` of ``layer`` pruned (eq. 7's ŵ_l, kept at full shape): each
    channel's filter and bias zeroed, and the input weights of ``next_layer`` that read it (a
    ``Conv2d``'s input channel, or a ``Linear``'s block of in_features / C columns, the channel's
    flattened positions) zeroed, so the output no longer depends on the channel."""
    _refuse_stack(state)
    weight_key, next_key = f"{layer}.weight", f"{next_layer}.weight"
    for key in (weight_key, next_key):
        if key not in state:
            raise ConfigError("layer", key, "a weight of the model's state")
    width = int(state[weight_key].shape[0])
    chosen = sorted({int(c) for c in channels})
    if any(not 0 <= c < width for c in chosen):
        raise ConfigError("channels", list(channels), f"channel indices in 0..{width - 1}")
    following = state[next_key]
    if following.dim() == 4 and following.shape[1] == width:
        block = 1
    elif following.dim() == 2 and following.shape[1] % width == 0:
        block = following.shape[1] // width
    else:
        raise ConfigError(
            "next_layer",
            next_layer,
            f"a layer reading {width} channels (weight {tuple(following.shape)})",
        )
    out = {k: v.detach().clone() for k, v in state.items()}
    for c in chosen:
        out[weight_key][c] = 0
        if f"{layer}.bias" in out:
            out[f"{layer}.bias"][c] = 0
        out[next_key][:, c * block : (c + 1) * block] = 0
    return out
