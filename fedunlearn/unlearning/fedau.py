"""FedAU: unlearning by a linear operation on an auxiliary head learned during training, Flower-free.

Gu, Zhu, Zhang, Zhao, Han, Fan, Yang, *Unlearning during Learning: An Efficient Federated Machine
Unlearning Method*, IJCAI 2024 (arXiv 2405.15474; code: github.com/Liar-Mask/FedAU, ``main_zgx.py``
and ``experiments/trainer_private.py``). The paper's text was not reachable from here; what follows
is read from the authors' code and their answer in github.com/Liar-Mask/FedAU/issues/2.

**The auxiliary module W_a.** A second linear classifier on the same features phi(x) as the model's
head W (the code's ``classifier_ul`` beside ``classifier``). A client that may ask to forget trains
it on its own data with *auxiliary targets*: the true label for a sample it keeps, a random label
other than the true one for a sample to forget (sample level; client level = every sample of the
client is to be forgotten), or the forgotten class for every sample (class level). Each round the
code starts W_a from ``(1 - gamma) W + gamma W_a^prev`` (client level, ``ul_client_gamma`` = 0.5)
and trains body, W and W_a jointly on ``CE(W phi, y) + CE(W_a phi, y_aux)``; body and W go to
FedAvg as usual, W_a stays, one per client, overwritten every round (never summed over rounds).

**The linear operation** (code's convention; the paper's alpha is 1 - this alpha, per that answer)::

    sample / client level:  W_u = (1 - alpha) W + alpha * mean_{k in targets} W_a^k   (alpha = 0.9)
    class level:            W_u = W - mean_{k in targets} W_a^k

bias alike, every other tensor of the final model unchanged. alpha is a fixed hyper-parameter
(0.9 in every script; 0.6, 0.75, 0.99 tried), not fitted. No client computes at request time.

Ours: :func:`train_auxiliary_head` trains W_a on the *frozen* features of the model the client
just trained (the platform's training replies stay those of plain FedAvg); the authors' joint
training is :func:`fedau_joint_epochs`. Several targets are averaged uniformly, as in the code.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable, Mapping

import torch
from torch import nn

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.scrubbing.baselines import random_labels
from fedunlearn.store.retention import RetentionPolicy, Selection
from fedunlearn.training.local import train_epochs

#: The tensors of one auxiliary head, as the server keeps them.
AUX_KEYS = ("weight", "bias")
OPERATIONS = ("combine", "subtract")


def _check_labels(y: torch.Tensor, num_classes: int, name: str) -> None:
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.dim() != 1:
        raise ConfigError(name, f"dtype {y.dtype}, shape {tuple(y.shape)}", "1-D integer labels")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ConfigError(
            name, f"labels in [{int(y.min())}, {int(y.max())}]", f"in [0, {num_classes})"
        )


def auxiliary_targets(
    y: torch.Tensor,
    num_classes: int,
    forget: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """W_a's targets at sample or client level (code: ``_local_update_ul``, ``ul_samples`` modes).

    ``y`` where ``forget`` is False; where it is True (everywhere when ``forget`` is None: the
    client level), a label drawn uniformly among the ``num_classes - 1`` classes other than ``y``.
    The code draws these labels once, when the data set is built: seed ``generator`` by client
    only (not by round) to keep them fixed across rounds.
    """
    if not (isinstance(num_classes, numbers.Integral) and num_classes >= 2):
        raise ConfigError("num_classes", num_classes, "an integer >= 2")
    _check_labels(y, num_classes, "y")
    if forget is None:
        forget = torch.ones(len(y), dtype=torch.bool)
    if forget.dtype != torch.bool or tuple(forget.shape) != tuple(y.shape):
        raise ConfigError("forget", f"{forget.dtype} {tuple(forget.shape)}", "a bool mask like y")
    wrong = random_labels(y, num_classes, generator)
    return torch.where(forget.cpu(), wrong, y.cpu())


def class_auxiliary_targets(y: torch.Tensor, forget_class: int, num_classes: int) -> torch.Tensor:
    """W_a's targets at class level: ``forget_class`` for every sample (code: ``ul_class``)."""
    if not (isinstance(forget_class, numbers.Integral) and 0 <= forget_class < num_classes):
        raise ConfigError("forget_class", forget_class, f"a class index in [0, {num_classes})")
    return torch.full((len(y),), int(forget_class), dtype=torch.long)


def initial_auxiliary_head(
    head: nn.Linear, previous: Mapping[str, torch.Tensor] | None = None, gamma: float = 0.5
) -> dict[str, torch.Tensor]:
    """Where a round's W_a starts: ``(1 - gamma) W + gamma W_a^prev`` (code: client level).

    ``previous`` None (a client's first round) starts from W itself (ours; the code blends in the
    random initial W_a).
    """
    if not (0.0 <= gamma <= 1.0):
        raise ConfigError("gamma", gamma, "a number in [0, 1]")
    own = {"weight": head.weight.detach().cpu().clone(), "bias": head.bias.detach().cpu().clone()}
    if previous is None:
        return own
    _check_aux(previous, own["weight"].shape, "previous")
    return {
        k: (1.0 - gamma) * own[k] + gamma * previous[k].detach().cpu().to(own[k].dtype)
        for k in AUX_KEYS
    }


def _check_aux(aux: Mapping[str, torch.Tensor], shape: torch.Size, name: str) -> None:
    if set(aux) != set(AUX_KEYS):
        raise ConfigError(name, sorted(aux), f"exactly the tensors {AUX_KEYS}")
    if tuple(aux["weight"].shape) != tuple(shape) or tuple(aux["bias"].shape) != (shape[0],):
        raise ConfigError(
            name,
            f"weight {tuple(aux['weight'].shape)}, bias {tuple(aux['bias'].shape)}",
            f"a head of weight {tuple(shape)} and bias ({shape[0]},)",
        )


def _check_training(
    x: torch.Tensor, y_aux: torch.Tensor, epochs: int, lr: float, batch_size: int
) -> None:
    if len(x) == 0:
        raise ConfigError("x", "an empty dataset", "at least one sample")
    if len(y_aux) != len(x):
        raise ConfigError("y_aux", f"{len(y_aux)} labels", f"one per sample ({len(x)})")
    if not (isinstance(epochs, numbers.Integral) and epochs >= 1):
        raise ConfigError("epochs", epochs, "an integer >= 1")
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError("lr", lr, "a finite number > 0")
    if not (isinstance(batch_size, numbers.Integral) and batch_size >= 1):
        raise ConfigError("batch_size", batch_size, "an integer >= 1")


def train_auxiliary_head(
    model: nn.Module,
    x: torch.Tensor,
    y_aux: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    previous: Mapping[str, torch.Tensor] | None = None,
    gamma: float = 0.5,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Client side: W_a trained by SGD on ``CE(W_a phi(x), y_aux)`` with phi frozen (ours).

    ``model`` is the BodyHeadNet the client just trained (left unchanged); W_a starts from
    :func:`initial_auxiliary_head` and is trained as :func:`train_epochs` trains (seeded batches,
    fresh optimizer). Returns ``{"weight", "bias"}`` on the CPU: what the reply carries.
    """
    _check_training(x, y_aux, epochs, lr, batch_size)
    head = model.head
    _check_labels(y_aux, head.out_features, "y_aux")
    start = initial_auxiliary_head(head, previous, gamma)
    aux = nn.Linear(head.in_features, head.out_features).to(start["weight"].dtype)
    with torch.no_grad():
        aux.weight.copy_(start["weight"])
        aux.bias.copy_(start["bias"])
        was_training = model.training
        model.to(device).eval()  # features as the deployed model computes them
        features = torch.cat(
            [model.features(x[i : i + 1024].to(device)).cpu() for i in range(0, len(x), 1024)]
        )
        model.train(was_training)
    train_epochs(
        aux,
        features,
        y_aux,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        momentum=momentum,
        weight_decay=weight_decay,
        device=device,
    )
    return {k: getattr(aux, k).detach().cpu().clone() for k in AUX_KEYS}


class _TwoHeads(nn.Module):
    """``[W phi(x), W_a phi(x)]`` side by side (the code's ``*_ul`` models)."""

    def __init__(self, model: nn.Module, aux: nn.Linear) -> None:
        super().__init__()
        self.model, self.aux = model, aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phi = self.model.features(x)
        return torch.cat([self.model.head(phi), self.aux(phi)], dim=1)


def fedau_joint_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    y_aux: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    previous: Mapping[str, torch.Tensor] | None = None,
    gamma: float = 0.5,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    device: torch.device | str = "cpu",
) -> tuple[float, dict[str, torch.Tensor]]:
    """The authors' client update: body, W and W_a on ``CE(W phi, y) + CE(W_a phi, y_aux)``.

    Trains ``model`` in place (its state is the reply for FedAvg) and returns the last epoch's
    mean loss and W_a (CPU). Use in place of the plain local training, not after it.
    """
    _check_training(x, y_aux, epochs, lr, batch_size)
    head = model.head
    k = head.out_features
    _check_labels(y_aux, k, "y_aux")
    start = initial_auxiliary_head(head, previous, gamma)
    aux = nn.Linear(head.in_features, k).to(start["weight"].dtype)
    with torch.no_grad():
        aux.weight.copy_(start["weight"])
        aux.bias.copy_(start["bias"])
    ce = nn.functional.cross_entropy
    loss = train_epochs(
        _TwoHeads(model, aux),
        x,
        torch.stack([y.cpu(), y_aux.cpu()], dim=1),
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        momentum=momentum,
        weight_decay=weight_decay,
        device=device,
        loss_fn=lambda z, t: ce(z[:, :k], t[:, 0]) + ce(z[:, k:], t[:, 1]),
    )
    return loss, {name: getattr(aux, name).detach().cpu().clone() for name in AUX_KEYS}


def keep_auxiliary(
    kept: Mapping[Hashable, Mapping[str, torch.Tensor]],
    replies: Mapping[Hashable, Mapping[str, torch.Tensor]],
) -> dict[Hashable, dict[str, torch.Tensor]]:
    """Server side, each round: a client's latest W_a replaces its previous one (code:
    ``ul_state_dicts[idx] = local_w_ul``); clients without a reply keep theirs."""
    out = {cid: dict(aux) for cid, aux in kept.items()}
    for cid, aux in replies.items():
        # A reply must be a whole head; its shape is checked against the model at request time.
        shape = aux["weight"].shape if "weight" in aux else (0, 0)
        _check_aux(aux, shape, f"replies[{cid!r}]")
        out[cid] = {k: aux[k].detach().cpu().clone() for k in AUX_KEYS}
    return out


def auxiliary_nbytes(aux: Mapping[str, torch.Tensor]) -> int:
    """Bytes of one kept W_a: ``(K d + K) * 4`` in float32."""
    return sum(t.numel() * t.element_size() for t in aux.values())


def fedau_unlearn(
    final_state: Mapping[str, torch.Tensor],
    kept: Mapping[Hashable, Mapping[str, torch.Tensor]],
    targets: Iterable[Hashable],
    *,
    alpha: float = 0.9,
    operation: str = "combine",
    head: str = "head",
) -> dict[str, torch.Tensor]:
    """Server side, at a request: the unlearned state, a linear function of W and the kept W_a.

    ``combine`` (sample / client level): ``W_u = (1 - alpha) W + alpha mean_{k in targets} W_a^k``;
    ``subtract`` (class level): ``W_u = W - mean_k W_a^k`` (``alpha`` unused); biases alike.
    ``head`` names the head's tensors in ``final_state`` (``head.weight``, ``head.bias``). No
    target returns a copy of ``final_state``.
    """
    if operation not in OPERATIONS:
        raise ConfigError("operation", operation, f"one of {', '.join(OPERATIONS)}")
    if not (0.0 <= alpha <= 1.0):
        raise ConfigError("alpha", alpha, "a number in [0, 1]")
    out = {name: tensor.detach().clone() for name, tensor in final_state.items()}
    chosen = list(dict.fromkeys(targets))
    if not chosen:
        return out
    names = {k: f"{head}.{k}" for k in AUX_KEYS}
    if any(name not in out for name in names.values()):
        raise ConfigError("head", head, f"a prefix with {sorted(names.values())} in final_state")
    missing = [cid for cid in chosen if cid not in kept]
    if missing:
        raise ConfigError(
            "targets", missing, f"clients with a kept auxiliary head: {sorted(map(str, kept))}"
        )
    for cid in chosen:
        _check_aux(kept[cid], out[names["weight"]].shape, f"kept[{cid!r}]")
    for key, name in names.items():
        w = out[name]
        mean_aux = sum(kept[cid][key].detach().to(w.device, w.dtype) for cid in chosen) / len(
            chosen
        )
        out[name] = (1.0 - alpha) * w + alpha * mean_aux if operation == "combine" else w - mean_aux
    return out


class AuxiliaryHeads(RetentionPolicy):
    """FedAU's retention: each client's latest auxiliary head W_a, trained after the last training
    round (``wants_auxiliary``) and kept in the policy's state, flat, by partition id; no update
    of any round. One head per client (``(K d + K) * 4`` bytes), forgotten with its client.

    Ours: W_a is asked for after the run's last round only (the authors' code trains it every
    round and overwrites it each time, so only the last one is ever used; with frozen features
    and gamma = 0 the earlier ones do not feed it), and a retraining adopted in place of the
    history asks for it again in its own last round.
    """

    name = "auxiliary-heads"
    keeps_updates = False
    keeps_rounds = False

    def __init__(self, last_round: int, heads: Mapping[int, torch.Tensor] | None = None) -> None:
        self.last_round = int(last_round)
        self.heads = {int(k): v.detach().cpu().float().flatten() for k, v in (heads or {}).items()}

    @classmethod
    def from_config(cls, config) -> AuxiliaryHeads:
        return cls(config.rounds)

    def wants_auxiliary(self, server_round: int) -> bool:
        return server_round == self.last_round

    def observe(self, server_round: int, auxiliary) -> None:
        # each client's latest head replaces its previous one (keep_auxiliary, flat)
        self.heads.update(
            {int(k): v.detach().cpu().float().flatten() for k, v in auxiliary.items()}
        )

    def select(self, server_round, global_state, updates, num_examples, *, loss=None) -> Selection:
        return Selection(False, frozenset())

    def state_dict(self) -> dict:
        heads = {str(k): [float(v) for v in head.tolist()] for k, head in self.heads.items()}
        return {"format": 1, "last_round": self.last_round, "heads": heads}

    def load_state_dict(self, state) -> None:
        restored = self.from_state(state)
        self.last_round, self.heads = restored.last_round, restored.heads

    @classmethod
    def from_state(cls, state) -> AuxiliaryHeads:
        try:
            if state["format"] != 1:
                raise ValueError(f"format {state['format']!r}")
            heads = {
                int(k): torch.tensor(v, dtype=torch.float32) for k, v in state["heads"].items()
            }
            return cls(int(state["last_round"]), heads)
        except (KeyError, TypeError, ValueError) as error:
            raise StoreCorruptionError(
                f"retention state of {cls.name} is malformed: {error}"
            ) from None

    def forget(self, clients) -> None:
        self.heads = {k: v for k, v in self.heads.items() if k not in set(clients)}

    def state_bytes(self) -> int:
        return sum(4 * head.numel() for head in self.heads.values())

    def kept_heads(self, weight_shape: torch.Size) -> dict[int, dict[str, torch.Tensor]]:
        """Each kept head as ``{"weight", "bias"}`` of a head of ``weight_shape`` (K, d)."""
        return {k: split_head(flat, weight_shape) for k, flat in self.heads.items()}


def split_head(flat: torch.Tensor, weight_shape: torch.Size, member: int = 0) -> dict:
    """Member ``member``'s ``{"weight", "bias"}`` of a flat head (weight then bias per member, as
    :func:`clients.objectives.auxiliary_head` reports it); a wrong length is refused."""
    classes, features = int(weight_shape[0]), int(weight_shape[1])
    size = classes * features + classes
    if flat.numel() % size or flat.numel() < (member + 1) * size:
        raise StoreCorruptionError(
            f"an auxiliary head of {flat.numel()} values, not a multiple of {size} covering "
            f"member {member} (a {classes}x{features} head and its bias)"
        )
    part = flat[member * size : (member + 1) * size]
    return {"weight": part[: classes * features].view(classes, features), "bias": part[-classes:]}
