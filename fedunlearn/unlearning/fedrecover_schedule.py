"""When FedRecover asks clients for exact updates: its schedule and abnormality fixing's τ.

Cao, Jia, Zhang & Gong, *FedRecover* (IEEE S&P 2023), Sec. IV-C: warm-up (the first T_w rounds),
periodic correction (every T_c-th round after it), final tuning (the last T_f rounds), and
abnormality fixing: an estimate with a coordinate above τ is recomputed exactly, τ = max_t τ_t and
τ_t the smallest value that at most a fraction α of round t's retained update coordinates exceed.
The recovery itself is :mod:`fedunlearn.unlearning.fedrecover`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.training.model_state import State


def _check_count(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return value


@dataclass(frozen=True)
class FedRecoverSchedule:
    """When FedRecover asks clients for exact updates (Cao et al., Sec. IV-C).

    The method section fixes T_w > s and gives T_f = 5 as its example; T_w = 20, T_c = 10, s = 2
    and α = 10⁻³ are our defaults for the others (a run configures them for its length: with
    T rounds, warm-up and final tuning alone cost T_w + T_f of them).

    Parameters
    ----------
    warmup_rounds : int, default 20
        T_w, the first rounds computed exactly; must exceed ``buffer_size`` (the paper's T_w > s).
    correction_period : int, default 10
        T_c: after the warm-up, every T_c-th round is computed exactly (periodic correction).
    final_tuning_rounds : int, default 5
        T_f, the last rounds computed exactly (final tuning; the paper's example value).
    buffer_size : int, default 2
        s, the number of (Δw, Δg) pairs kept per client for L-BFGS.
    abnormality_threshold : float or None, default None
        τ. ``None``: derived from the history with ``tolerance_rate`` (the paper's rule);
        ``math.inf`` turns abnormality fixing off.
    tolerance_rate : float, default 1e-3
        α, the fraction of stored update coordinates allowed above τ_t in each round.
    """

    warmup_rounds: int = 20
    correction_period: int = 10
    final_tuning_rounds: int = 5
    buffer_size: int = 2
    abnormality_threshold: float | None = None
    tolerance_rate: float = 1e-3

    def __post_init__(self) -> None:
        _check_count("fedrecover-buffer", self.buffer_size, 1)
        warmup = _check_count("fedrecover-warmup", self.warmup_rounds, 1)
        if warmup <= self.buffer_size:
            raise ConfigError(
                "fedrecover-warmup",
                warmup,
                f"more rounds than fedrecover-buffer={self.buffer_size} (the paper's T_w > s)",
            )
        _check_count("fedrecover-correction-period", self.correction_period, 1)
        _check_count("fedrecover-final-tuning", self.final_tuning_rounds, 0)
        tau = self.abnormality_threshold
        if tau is not None and (
            isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0
        ):
            raise ConfigError("fedrecover-threshold", tau, "a number > 0 (inf: no fixing) or None")
        alpha = self.tolerance_rate
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < 1:
            raise ConfigError("fedrecover-tolerance", alpha, "a fraction in [0, 1)")

    def is_exact(self, position: int, total: int) -> bool:
        """Whether the ``position``-th of ``total`` recovery rounds (1-based) is computed exactly:
        warm-up, periodic correction or final tuning."""
        if position <= self.warmup_rounds or position > total - self.final_tuning_rounds:
            return True
        return (position - self.warmup_rounds) % self.correction_period == 0


def flat(state: State, keys: Sequence[str]) -> torch.Tensor:
    return torch.cat([state[k].detach().cpu().reshape(-1).double() for k in keys])


def tolerance_threshold(values: torch.Tensor, tolerance_rate: float) -> float:
    """τ_t of Sec. IV-C: the smallest τ that at most ⌊α·n⌋ of the n values exceed in absolute
    value (α = ``tolerance_rate``; α = 0 gives the largest |value|)."""
    magnitudes = values.detach().reshape(-1).abs().double()
    if magnitudes.numel() == 0:
        return 0.0
    allowed = math.floor(tolerance_rate * magnitudes.numel())
    return float(torch.kthvalue(magnitudes, magnitudes.numel() - allowed).values)


@dataclass
class HistoryScales:
    """What one pass over the history gives, per group: τ = max_t τ_t (``thresholds``) and the
    largest norm of any retained update of the remaining clients (``peaks``)."""

    thresholds: list[float]
    peaks: list[float]


def history_scales(
    history, excluded: Collection[int], groups: Sequence[Sequence[str]], tolerance_rate: float
) -> HistoryScales:
    """τ per group (Sec. IV-C: τ_t the smallest value that at most ⌊α·n_t⌋ of the n_t coordinates
    of round t's retained updates exceed, the remaining clients' coordinates pooled; τ = max_t τ_t)
    and the largest update norm per group. Reads every remaining client's update once, never an
    excluded client's; keeps at most ⌊α·n_t⌋ + 1 magnitudes per client and group."""
    excluded = set(excluded)
    scales = HistoryScales([0.0] * len(groups), [0.0] * len(groups))
    for t in history.rounds():
        clients = remaining(history.clients(t), excluded)
        tops: list[list[torch.Tensor]] = [[] for _ in groups]
        sizes = [0] * len(groups)
        for k in clients:
            update = history.read_update(t, k)
            for g, keys in enumerate(groups):
                magnitudes = flat(update, keys).abs()
                sizes[g] = magnitudes.numel()
                scales.peaks[g] = max(scales.peaks[g], float(magnitudes.norm()))
                keep = min(
                    math.floor(tolerance_rate * magnitudes.numel() * len(clients)) + 1,
                    magnitudes.numel(),
                )
                tops[g].append(torch.topk(magnitudes, keep).values)
        for g in range(len(groups) if clients else 0):
            allowed = math.floor(tolerance_rate * sizes[g] * len(clients))
            pooled = torch.cat(tops[g])
            tau_t = float(torch.topk(pooled, allowed + 1).values[-1])
            scales.thresholds[g] = max(scales.thresholds[g], tau_t)
    return scales


def abnormality_thresholds(
    history, excluded: Collection[int], groups: Sequence[Sequence[str]], tolerance_rate: float
) -> list[float]:
    """τ = max_t τ_t per group (Sec. IV-C), over the coordinates of the retained updates of the
    clients that take part in the recovery (:func:`history_scales`)."""
    return history_scales(history, excluded, groups, tolerance_rate).thresholds


def remaining(clients: Collection[int], excluded: set[int]) -> list[int]:
    return sorted(set(clients) - excluded)
