"""Arithmetic on model states (state dicts): the updates U_k^t = M_k^t - M^t of FedEraser.

Floating tensors are combined in float32 or wider; integer buffers (BatchNorm's
``num_batches_tracked``) are differenced exactly, so a state can always be rebuilt as
``base + update``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedunlearn.errors import ConfigError

State = Mapping[str, torch.Tensor]


def _check_same_keys(a: State, b: State, what: str) -> None:
    if a.keys() != b.keys():
        missing, extra = sorted(set(b) - set(a)), sorted(set(a) - set(b))
        raise ValueError(
            f"{what}: the states hold different tensors (missing {missing}, extra {extra})"
        )


def state_difference(a: State, b: State) -> dict[str, torch.Tensor]:
    """``a - b`` key by key; FedEraser's update U_k^t = M_k^t - M^t is ``state_difference(M_k, M)``."""
    _check_same_keys(a, b, "state_difference")
    return {k: a[k].detach().cpu() - b[k].detach().cpu() for k in a}


def state_sum(a: State, b: State) -> dict[str, torch.Tensor]:
    """``a + b`` key by key, keeping each tensor's dtype of ``a``."""
    _check_same_keys(a, b, "state_sum")
    return {k: (a[k].detach().cpu() + b[k].detach().cpu()).to(a[k].dtype) for k in a}


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """sum_k w_k S_k / sum_k w_k (FedAvg's aggregation, weights N_k).

    Integer tensors are averaged in float64 and rounded back, so counters stay integers.
    """
    if len(states) == 0 or len(states) != len(weights):
        raise ValueError(
            f"weighted_average needs as many weights as states (got {len(states)} states, {len(weights)} weights)"
        )
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weighted_average needs a positive total weight (got {total})")
    average = RunningAverage(total)
    for state, weight in zip(states, weights, strict=True):
        average.add(state, weight)
    return average.result()


class RunningAverage:
    """:func:`weighted_average` folded one state at a time: the same float64 operations in the
    same order, so the result is the same bit for bit when the states are added in the same order
    and their weights sum to ``expected_total``. When they do not (a client expected but absent),
    :meth:`result` rescales by ``expected_total`` / the weights added: the same average up to
    rounding. Memory: one float64 copy of a state, whatever the number of states."""

    def __init__(self, expected_total: float) -> None:
        self.total = float(expected_total)
        if not self.total > 0:
            raise ValueError(f"RunningAverage needs a positive total weight (got {self.total})")
        self.added = 0.0
        self.count = 0
        self._sums: dict[str, torch.Tensor] = {}
        self._dtypes: dict[str, torch.dtype] = {}

    def add(self, state: State, weight: float) -> None:
        """Add ``weight`` · ``state`` (the same keys as the first state added)."""
        if self._sums:
            _check_same_keys(state, self._sums, "RunningAverage.add")
        for key, value in state.items():
            if key not in self._sums:
                self._sums[key] = torch.zeros_like(value, dtype=torch.float64, device="cpu")
                self._dtypes[key] = value.dtype
            self._sums[key] += value.detach().cpu().to(torch.float64) * (float(weight) / self.total)
        self.added += float(weight)
        self.count += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The weighted average of the states added (at least one)."""
        if not self.count:
            raise ValueError("RunningAverage: no state was added")
        scale = None if self.added == self.total else self.total / self.added
        out = {}
        for key, value in self._sums.items():
            value = value if scale is None else value * scale
            dtype = self._dtypes[key]
            out[key] = value.to(dtype) if dtype.is_floating_point else value.round().to(dtype)
        return out


def state_norm(state: State) -> float:
    """Euclidean norm of all floating tensors of a state taken as one vector."""
    squares = [
        t.detach().double().pow(2).sum() for t in state.values() if t.dtype.is_floating_point
    ]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def state_sha256(state: State) -> str:
    """SHA-256 of a model state: each tensor's name, then its values as float64 (integers as
    int64), little-endian, C order, in sorted name order. What a ledger names a model by."""
    import hashlib

    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        dtype = torch.float64 if tensor.dtype.is_floating_point else torch.int64
        digest.update(key.encode("utf-8") + b"\0")
        digest.update(
            tensor.to(dtype)
            .numpy()
            .astype(f"<{'f8' if dtype == torch.float64 else 'i8'}")
            .tobytes()
        )
    return digest.hexdigest()


def parameter_groups(
    state: State, groups: Sequence[Sequence[str]] | None = None
) -> list[list[str]]:
    """The lists of state keys a method flattens as one model each (a judge stack's members): ``groups`` checked (floating
    tensors of ``state``, each in at most one group), or one group of every floating tensor."""
    floating = [k for k, t in state.items() if t.dtype.is_floating_point]
    if groups is None:
        if not floating:
            raise ConfigError("groups", sorted(state), "a model with floating tensors")
        return [floating]
    checked: list[list[str]] = []
    seen: set[str] = set()
    for group in groups:
        keys = list(group)
        if not keys:
            raise ConfigError("groups", keys, "non-empty lists of state keys")
        for key in keys:
            if key not in floating:
                raise ConfigError("groups", key, f"a floating tensor of the model: {floating}")
            if key in seen:
                raise ConfigError("groups", key, "each key in at most one group")
            seen.add(key)
        checked.append(keys)
    return checked
