"""N independent models trained at once: a stack of :class:`BodyHeadNet` members, one vmapped step.

The judge needs N independently trained models per procedure, and N separate Python training loops
pay the interpreter's and the dispatcher's overhead N times on networks this small. A
:class:`ModelStack` keeps its members as ordinary modules (``members.<i>.<param>`` in its state dict, so
FedAvg, retained-update stores and per-tensor norms treat it as one model and still act per member),
and :func:`train_stack_epochs` trains all of them in one vectorised step per batch
(``torch.func.functional_call`` under ``torch.func.vmap`` over parameters stacked along a new first
dimension).

Invariant: member ``i`` ends exactly where :func:`fedunlearn.training.local.train_epochs` would take it
with ``seed=seeds[i]`` (up to floating-point summation order): it sees the same batches (one generator
per member, one ``torch.randperm`` per epoch, the same slicing), and SGD with momentum and weight
decay is elementwise, so one :class:`torch.optim.SGD` over the stacked tensors updates every member as
its own optimizer would. The loss is the sum over members of each member's mean cross-entropy, whose
gradient with respect to member ``i``'s parameters is member ``i``'s own gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed
from fedunlearn.training.local import EvaluationResult
from fedunlearn.training.models import BodyHeadNet, build_dataset_model


def member_seeds(seed: int, n: int) -> list[int]:
    """Independent initialisation seeds for the ``n`` members of a run seeded ``seed``."""
    if n < 1:
        raise ConfigError("judge-models", n, "at least 1 model in a stack")
    return [derive_seed(seed, "judge-model", index) for index in range(n)]


def _refuse_buffers(model: nn.Module) -> None:
    # Buffers (batch-norm statistics) would need their own stacking and in-place update rules under
    # vmap; none of our models has one, so refusing is safer than silently freezing them.
    names = [name for name, _ in model.named_buffers()]
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise ConfigError(
            "model",
            type(model).__name__,
            f"a model without buffers to stack (it has {len(names)}: {shown}); batch-norm "
            "statistics cannot be stacked: use a model without BatchNorm, e.g. resnet18-cifar-gn "
            "(GroupNorm) for resnet18-cifar",
        )


# Layers with a batched formulation over a leading member dimension. On the CPU it measures faster
# than vmap over functional_call (simulations/benchmarks/stack_speed.py): one batched matmul per
# linear layer and one grouped convolution per convolution, with no per-op batching rules.
_ELEMENTWISE_OVER_SAMPLES = (nn.ReLU, nn.MaxPool2d)


def _has_batched_formulation(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Linear):
        return layer.bias is not None
    if isinstance(layer, nn.Conv2d):
        # String padding ("same") and non-zero padding modes go through vmap instead.
        plain = layer.padding_mode == "zeros" and isinstance(layer.padding, tuple)
        return layer.bias is not None and plain
    if isinstance(layer, nn.Flatten):
        return layer.start_dim == 1 and layer.end_dim == -1
    return isinstance(layer, _ELEMENTWISE_OVER_SAMPLES)


def _is_plain_sequential(body: nn.Module) -> bool:
    """Whether ``body`` is a :class:`nn.Sequential` of layers :func:`_stacked_body` handles."""
    return isinstance(body, nn.Sequential) and all(map(_has_batched_formulation, body))


def _stacked_linear(params: dict[str, torch.Tensor], prefix: str, h: torch.Tensor) -> torch.Tensor:
    """``h @ W_i^T + b_i`` for every member ``i`` at once: ``(N, B, in) -> (N, B, out)``."""
    weight, bias = params[prefix + "weight"], params[prefix + "bias"]
    return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))


def _stacked_conv(
    layer: nn.Conv2d, params: dict[str, torch.Tensor], prefix: str, h: torch.Tensor, members: int
) -> torch.Tensor:
    """Member ``i``'s convolution on its batch: the members are the groups of one convolution.

    ``h`` is ``(B, N * C, H, W)``, member ``i``'s channels in the ``i``-th group, and so is the output.
    """
    weight, bias = params[prefix + "weight"], params[prefix + "bias"]
    return nn.functional.conv2d(
        h,
        weight.flatten(0, 1),
        bias.flatten(),
        stride=layer.stride,
        padding=layer.padding,
        dilation=layer.dilation,
        groups=members * layer.groups,
    )


def _stacked_body(
    body: nn.Sequential, params: dict[str, torch.Tensor], h: torch.Tensor
) -> torch.Tensor:
    """Every member's body on its own batch ``h`` of shape ``(N, B, ...)``; returns ``(N, B, F)``.

    Images stay in the grouped layout ``(B, N * C, H, W)`` from the first convolution to the
    flatten, so ReLU and pooling (per channel) run on all members at once without copies.
    """
    members, batch = h.shape[:2]
    if h.dim() == 5:
        h = h.transpose(0, 1).reshape(batch, -1, *h.shape[-2:])
    for index, layer in enumerate(body):
        prefix = f"body.{index}."
        if isinstance(layer, nn.Linear):
            h = _stacked_linear(params, prefix, h)
        elif isinstance(layer, nn.Conv2d):
            h = _stacked_conv(layer, params, prefix, h, members)
        elif isinstance(layer, nn.Flatten):
            h = h.reshape(batch, members, -1).transpose(0, 1) if h.dim() == 4 else h
        else:
            h = layer(h)
    return h


class ModelStack(nn.Module):
    """N models of one architecture, held as ``members`` and evaluated together.

    Parameters
    ----------
    members : sequence of BodyHeadNet
        At least one model; all with the same parameter names and shapes and no buffers.
    """

    def __init__(self, members: Sequence[BodyHeadNet]) -> None:
        super().__init__()
        if len(members) == 0:
            raise ConfigError("members", 0, "at least one model in a stack")
        reference = {name: p.shape for name, p in members[0].named_parameters()}
        for index, member in enumerate(members):
            _refuse_buffers(member)
            shapes = {name: p.shape for name, p in member.named_parameters()}
            if shapes != reference:
                raise ConfigError(
                    f"members[{index}]", type(member).__name__, "the architecture of members[0]"
                )
        self.members = nn.ModuleList(members)
        # A parameter-free copy on the meta device: functional_call runs its code on the stacked
        # tensors. Kept in a tuple so it is not registered as a submodule (nor in the state dict).
        self._skeleton = (copy.deepcopy(members[0]).to("meta"),)

    @property
    def num_members(self) -> int:
        """N, the number of models in the stack."""
        return len(self.members)

    @property
    def parameter_names(self) -> list[str]:
        """The names of one member's parameters, in ``named_parameters`` order."""
        return [name for name, _ in self.members[0].named_parameters()]

    def member_states(self) -> list[dict[str, torch.Tensor]]:
        """Each member's own state dict (copies), in member order."""
        return [
            {name: value.detach().clone() for name, value in member.state_dict().items()}
            for member in self.members
        ]

    def load_member_states(self, states: Sequence[dict[str, torch.Tensor]]) -> None:
        """Load one state dict per member (the inverse of :meth:`member_states`)."""
        if len(states) != self.num_members:
            raise ConfigError(
                "states", f"{len(states)} state dicts", f"one per member ({self.num_members})"
            )
        for member, state in zip(self.members, states, strict=True):
            member.load_state_dict(state)

    def stacked_parameters(self) -> dict[str, torch.Tensor]:
        """Each parameter stacked over members, shape ``(N, *shape)``; differentiable into members."""
        return {
            name: torch.stack([member.get_parameter(name) for member in self.members])
            for name in self.parameter_names
        }

    def stacked_forward(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, *, per_member: bool = False
    ) -> torch.Tensor:
        """Logits ``(N, batch, C)`` of stacked ``params`` on ``x``: one input ``(batch, ...)`` shared
        by every member, or with ``per_member`` one batch per member, ``(N, batch, ...)``."""
        skeleton = self._skeleton[0]
        if _is_plain_sequential(skeleton.body):
            h = x if per_member else x.expand(self.num_members, *x.shape)
            return _stacked_linear(params, "head.", _stacked_body(skeleton.body, params, h))

        def one(member_params: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
            return functional_call(skeleton, member_params, (inputs,))

        return vmap(one, in_dims=(0, 0 if per_member else None))(params, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(N, batch, C)`` of every member on the same input ``x`` of shape ``(batch, ...)``."""
        return self.stacked_forward(self.stacked_parameters(), x)

    @torch.no_grad()
    def logits(
        self, x: torch.Tensor, batch_size: int = 1024, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """Every member's logits on ``x`` without gradients, ``(N, n, C)`` on the CPU."""
        device = torch.device(device)
        self.to(device).eval()
        params = self.stacked_parameters()
        chunks = [
            self.stacked_forward(params, x[start : start + batch_size].to(device)).cpu()
            for start in range(0, len(x), batch_size)
        ]
        if not chunks:
            num_classes = self.members[0].num_classes
            return torch.empty(self.num_members, 0, num_classes)
        return torch.cat(chunks, dim=1)


def build_model_stack(
    model_name: str,
    dataset: str,
    input_shape: Sequence[int],
    num_classes: int,
    seeds: Sequence[int],
) -> ModelStack:
    """A stack whose member ``i`` is ``build_dataset_model(..., seed=seeds[i])``."""
    if len(seeds) == 0:
        raise ConfigError("seeds", list(seeds), "at least one seed (one per member)")
    return ModelStack(
        [
            build_dataset_model(model_name, dataset, input_shape, num_classes, seed=int(seed))
            for seed in seeds
        ]
    )


def _check_training_inputs(stack: ModelStack, x: torch.Tensor, y: torch.Tensor, seeds) -> None:
    if len(x) == 0:
        raise ConfigError("x", "an empty dataset", "at least one training sample")
    if len(y) != len(x):
        raise ConfigError("y", f"{len(y)} labels", f"one label per sample ({len(x)})")
    if len(seeds) != stack.num_members:
        raise ConfigError(
            "seeds", f"{len(seeds)} seeds", f"one per member of the stack ({stack.num_members})"
        )


def _epoch_orders(generators: list[torch.Generator], n: int) -> torch.Tensor:
    """One ``torch.randperm`` per member from its own generator, as ``train_epochs`` draws it."""
    return torch.stack([torch.randperm(n, generator=generator) for generator in generators])


def _copy_back(stack: ModelStack, params: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for index, member in enumerate(stack.members):
            for name, value in params.items():
                member.get_parameter(name).copy_(value[index])


def train_stack_epochs(
    stack: ModelStack,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seeds: Sequence[int],
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    device: torch.device | str = "cpu",
) -> list[float]:
    """Train every member of ``stack`` in place with SGD for ``epochs`` passes over ``(x, y)``.

    Member ``i`` follows :func:`fedunlearn.training.local.train_epochs` with ``seed=seeds[i]``: the
    same batches in the same order and the same SGD update (fresh momentum on every call, as a
    federated client's optimizer). Returns each member's mean training loss over the last epoch.
    """
    _check_training_inputs(stack, x, y, seeds)
    device = torch.device(device)
    stack.to(device).train()
    params = {
        name: value.detach().clone().requires_grad_(True)
        for name, value in stack.stacked_parameters().items()
    }
    optimizer = torch.optim.SGD(
        params.values(), lr=lr, momentum=momentum, weight_decay=weight_decay
    )
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    x, y = x.to(device), y.to(device)
    last_epoch_losses = [float("nan")] * stack.num_members
    for _ in range(epochs):
        orders = _epoch_orders(generators, len(x)).to(device)
        totals = torch.zeros(stack.num_members, dtype=torch.float64, device=device)
        for start in range(0, len(x), batch_size):
            index = orders[:, start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            logits = stack.stacked_forward(params, x[index], per_member=True)
            losses = vmap(nn.functional.cross_entropy)(logits, y[index])
            losses.sum().backward()
            optimizer.step()
            totals += losses.detach().double() * index.shape[1]
        last_epoch_losses = (totals / len(x)).tolist()
    _copy_back(stack, params)
    return last_epoch_losses


@torch.no_grad()
def evaluate_stack(
    stack: ModelStack,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | str = "cpu",
) -> list[EvaluationResult]:
    """Each member's mean cross-entropy and accuracy on ``(x, y)``, as ``evaluate`` reports it."""
    n = len(x)
    if n == 0:
        return [EvaluationResult(float("nan"), float("nan"), 0)] * stack.num_members
    logits = stack.logits(x, batch_size=batch_size, device=device)
    targets = y.cpu().expand(stack.num_members, n)
    loss_sums = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(
        dim=1
    )
    correct = (logits.argmax(dim=2) == targets).sum(dim=1)
    return [
        EvaluationResult(loss / n, hits / n, n)
        for loss, hits in zip(loss_sums.tolist(), correct.tolist(), strict=True)
    ]


def mean_evaluation(results: Sequence[EvaluationResult]) -> EvaluationResult:
    """A stack's evaluation as one line: its members' mean loss and mean accuracy."""
    if not results:
        raise ConfigError("results", "[]", "at least one member's evaluation")
    count = len(results)
    return EvaluationResult(
        sum(r.loss for r in results) / count,
        sum(r.accuracy for r in results) / count,
        results[0].num_examples,
    )


#: The state-dict prefix of a stack's members (``members.<i>.<tensor>``).
MEMBER_PREFIX = "members."


def stack_size(state: dict[str, torch.Tensor]) -> int:
    """How many members a state dict holds: N for a stack's (``members.<i>.…`` keys, i < N, each
    i present), 0 for a single network's. A mix of both kinds of keys is refused."""
    stacked = [key for key in state if key.startswith(MEMBER_PREFIX)]
    if not stacked:
        return 0
    if len(stacked) != len(state):
        raise ConfigError("arrays", "a mix of stacked and plain tensors", "one kind of keys")
    indices = set()
    for key in stacked:
        index = key[len(MEMBER_PREFIX) :].split(".", 1)[0]
        if not index.isdigit():
            raise ConfigError("arrays", key, "members.<index>.<tensor> keys")
        indices.add(int(index))
    if indices != set(range(len(indices))):
        raise ConfigError("arrays", sorted(indices), "member indices 0 .. N-1, each present")
    return len(indices)


def member_groups(state: dict[str, torch.Tensor]) -> list[list[str]] | None:
    """The keys of each member of a stack's state dict, member by member (the independent models
    whose vector math — an L-BFGS pair, a sensitivity norm — must not mix); None for a single
    network's state dict (one model: all its keys)."""
    members = stack_size(state)
    if members == 0:
        return None
    groups: list[list[str]] = [[] for _ in range(members)]
    for key in state:
        groups[int(key[len(MEMBER_PREFIX) :].split(".", 1)[0])].append(key)
    return groups


def member_state(state: dict[str, torch.Tensor], member: int) -> dict[str, torch.Tensor]:
    """Member ``member``'s own state dict (``members.<member>.`` stripped) of a stack's state dict:
    the state a single run with that member's seed holds."""
    members = stack_size(state)
    if not 0 <= member < members:
        raise ConfigError("member", member, f"a member index in [0, {members - 1}]")
    prefix = f"{MEMBER_PREFIX}{member}."
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
