"""Poisoning attacks of the recovery scenario: clients malicious during training, removed after it.

FedRecover (Cao et al., S&P 2023) and Crab (Jiang et al., TIFS 2025) recover a global model that
detected malicious clients poisoned. The clients ``attack-clients`` attack as ``attack`` says:

- ``backdoor`` (data poisoning, the BadNets pattern FedRecover and Crab use): ``attack-fraction``
  of each malicious client's samples, drawn from the other classes, carry the trigger of
  :mod:`fedunlearn.data.backdoor` and the label ``attack-target-class``. The default 0.5 follows
  the attacker of FLTrust (Cao et al., NDSS 2021), who adds a triggered copy of each of its
  samples (half its data poisoned; here the triggered samples replace their clean originals, so a client's sample
  count is unchanged). The reference code (Adaptive_Recovery, ``label_inject_mode = Fix``)
  triggers all of them (fraction 1): in a small federation such a client drives the global model
  to answer the target class whatever the input, a collapse rather than a backdoor.
- ``label-flip`` (data poisoning, Fang et al., USENIX Security 2020; Tolpegin et al., ESORICS
  2020): every label y of a malicious client becomes C - 1 - y (the reference code's
  ``Exclusive`` mode); a sample of the middle class of an odd C keeps its label.
- ``scaled-update`` (model poisoning, Bagdasaryan et al., AISTATS 2020; the Scaling attack of
  FLTrust, Cao et al., NDSS 2021): a malicious client trains honestly on its data and replies
  M + λ (M_k − M) instead of M_k (:func:`scaled_update`), so FedAvg moves λ times as far its way;
  FLTrust takes λ = n, the number of clients. It does so in every training message it answers
  (a removed client receives none).

Every party computes the same poisoned partitions from the run configuration
(:func:`fedunlearn.data.federated_data.load_federated_data`): the server to measure, the malicious
client to train on. :func:`poisoning_success_rate` reads the attack's success on the test set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedunlearn.config.choices import ATTACKS
from fedunlearn.data.backdoor import Trigger, triggered_test_set
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:
    from fedunlearn.data.datasets import TensorSplit

#: The attacks that change a malicious client's samples (the others change its replies).
DATA_POISONING_ATTACKS = ("backdoor", "label-flip")
#: Every attack a malicious client can make (``attack`` but ``none``).
POISONING_ATTACKS = tuple(a for a in ATTACKS if a != "none")


def check_attack_name(attack: str) -> None:
    """``attack`` is one of :data:`POISONING_ATTACKS`."""
    if attack not in POISONING_ATTACKS:
        raise ConfigError("attack", attack, f"one of {', '.join(POISONING_ATTACKS)}")


def flipped_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The label-flip map y -> C - 1 - y (Fang et al., 2020)."""
    return num_classes - 1 - y


def flip_labels(
    y: torch.Tensor, *, num_classes: int, fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of ``y`` with ``round(fraction * n)`` labels flipped to C - 1 - y.

    The samples are drawn by a generator seeded with ``seed`` among those whose label changes (all
    but the middle class of an odd C). Returns ``(y', flipped)``, ``flipped`` the sorted indices
    of the changed labels.
    """
    if not 0.0 < fraction <= 1.0:
        raise ConfigError("attack-fraction", fraction, "a fraction in (0, 1]")
    target = flipped_labels(y, num_classes)
    eligible = torch.nonzero(target != y).flatten()
    count = min(round(fraction * len(y)), len(eligible))
    if count == 0:
        raise ConfigError(
            "attack-fraction",
            fraction,
            f"large enough to flip at least one of {len(y)} labels",
        )
    generator = torch.Generator().manual_seed(seed)
    flipped = eligible[torch.randperm(len(eligible), generator=generator)[:count]].sort().values
    poisoned = y.clone()
    poisoned[flipped] = target[flipped]
    return poisoned, flipped


def scaled_update(
    global_state: Mapping[str, torch.Tensor], local_state: Mapping[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """The scaled-update attacker's reply M + λ (M_k − M), its update U_k = M_k − M boosted λ times
    (the model replacement of Bagdasaryan et al., 2020: γ (X − G^t) + G^t with γ = λ).

    Only floating tensors are parameters; integer buffers (BatchNorm's batch counts) are the
    client's own, as an honest reply carries them.
    """
    if set(global_state) != set(local_state):
        raise ConfigError(
            "local_state",
            sorted(local_state),
            f"the keys of the global model {sorted(global_state)}",
        )
    reply = {}
    for name, local in local_state.items():
        if local.is_floating_point():
            start = global_state[name].to(device=local.device, dtype=local.dtype)
            reply[name] = start + scale * (local - start)
        else:
            reply[name] = local.clone()
    return reply


@dataclass(frozen=True, eq=False)
class AttackPlan:
    """Who attacked and how, as every party derives it from the run configuration.

    Attributes
    ----------
    attack : str
        One of :data:`POISONING_ATTACKS`.
    clients : tuple of int
        The malicious clients' partition ids.
    num_classes : int
        C, the dataset's number of classes.
    target_class : int
        ``backdoor``: the label of triggered samples; -1 otherwise.
    scale : float
        ``scaled-update``: λ; 1 otherwise.
    trigger : Trigger or None
        ``backdoor``: the trigger stamped on the poisoned samples.
    poisoned : torch.Tensor
        The poisoned samples' indices into ``splits.train`` (sorted; empty for scaled-update).
    """

    attack: str
    clients: tuple[int, ...]
    num_classes: int
    target_class: int = -1
    scale: float = 1.0
    trigger: Trigger | None = None
    poisoned: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))

    def __post_init__(self) -> None:
        check_attack_name(self.attack)

    def is_malicious(self, partition_id: int) -> bool:
        return partition_id in self.clients

    def attack_test(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The test inputs the attack aims at and the label it wants for each: triggered samples of
        the other classes and ``target_class`` (backdoor); the samples whose label flips and
        C - 1 - y (label-flip); none for scaled-update, which wants no label."""
        if self.attack == "backdoor":
            inputs = triggered_test_set(x, y, trigger=self.trigger, target_class=self.target_class)
            return inputs, torch.full((len(inputs),), self.target_class, dtype=y.dtype)
        if self.attack == "label-flip":
            wanted = flipped_labels(y, self.num_classes)
            changes = wanted != y
            return x[changes], wanted[changes]
        return x[:0], y[:0]


@torch.no_grad()
def poisoning_success_rate(
    model: nn.Module,
    plan: AttackPlan | None,
    test: TensorSplit,
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 1024,
) -> float:
    """The attack's success on ``model``: the share of :meth:`AttackPlan.attack_test`'s inputs
    from the server's test set ``test`` it labels as the attacker wants (the backdoor's attack success
    rate; for label-flip, the share of flipped test labels it predicts). NaN without an attack
    and for scaled-update, whose harm shows in the test accuracy.
    """
    if plan is None or plan.attack not in DATA_POISONING_ATTACKS:
        return float("nan")
    inputs, wanted = plan.attack_test(test.x, test.y)
    if len(inputs) == 0:
        return float("nan")
    model.to(device).eval()
    hits = 0
    for start in range(0, len(inputs), batch_size):
        logits = model(inputs[start : start + batch_size].to(device))
        hits += int((logits.argmax(dim=1).cpu() == wanted[start : start + batch_size]).sum())
    return hits / len(inputs)
