"""Which rounds the server retains: FedEraser's schedule with interval Δt.

Liu et al., *FedEraser* (IWQoS 2021), Section IV-B: the server keeps the clients' updates at rounds
t_1 = 1, t_{j+1} = t_j + Δt, trading storage (1/Δt of the rounds) for the reconstruction's accuracy.
This is the one place the schedule is computed; the run configuration and the retaining strategy
both ask it.
"""

from __future__ import annotations


def is_retained_round(server_round: int, retain_interval: int) -> bool:
    """Whether round ``server_round`` (1-based) is one of t_1 = 1, t_{j+1} = t_j + Δt, with
    Δt = ``retain_interval`` (>= 1)."""
    if retain_interval < 1:
        raise ValueError(f"retain_interval must be a whole number >= 1, got {retain_interval}")
    return server_round >= 1 and (server_round - 1) % retain_interval == 0

