"""FedEraser's calibrated rounds under client sampling: ``calibration-clients`` (ours).

Liu et al.'s Algorithm 1 has every client in every round; with ``fraction-train`` < 1 a retained
round holds its participants only, and :func:`fedunlearn.unlearning.federaser.federaser`, the paper's
rule read as it is, calibrates it by its remaining participants. A :class:`TopUp` adds remaining
clients that did not take part until ``minimum`` calibrate the round, drawn with the run's seed
(:func:`top_up_clients`). Such a client has no retained U_k^{t_j}, whose norm eq. (2) needs: it
steps by the participants' sample-weighted mean norm per tensor (:func:`borrowed_squares`). A round
with ``minimum`` or more remaining participants, every round when every client trains, is left as
it is; the uncalibrated first step is never topped up.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.training.sampling import round_seed


@dataclass(frozen=True)
class TopUp:
    """``calibration-clients``: each calibrated round is calibrated by at least ``minimum``
    remaining clients, its remaining participants first, then clients of ``pool`` (client ->
    N_k: the remaining clients that may be asked) that did not take part in it, drawn with
    ``seed`` (:func:`top_up_clients`)."""

    minimum: int
    pool: Mapping[int, int]
    seed: int = 0


def top_up_clients(
    participants: Collection[int], pool: Collection[int], minimum: int, seed: int
) -> list[int]:
    """The clients added to a retained round's calibration, sorted: ``minimum`` less the
    participants' count (none when there are enough), drawn uniformly without replacement from
    the clients of ``pool`` that did not take part, by a generator seeded with ``seed`` over them
    sorted; all of them when fewer are left."""
    if minimum < 0:
        raise ConfigError("calibration-clients", minimum, "a whole number >= 0")
    taken = set(participants)
    others = sorted(set(pool) - taken)
    wanted = min(len(others), max(0, minimum - len(taken)))
    if wanted == 0:
        return []
    order = torch.randperm(len(others), generator=torch.Generator().manual_seed(int(seed)))
    return sorted(others[int(i)] for i in order[:wanted])


def borrowed_squares(
    squares: Mapping[int, Mapping[str, float]], num_examples: Mapping[int, int]
) -> dict[str, float]:
    """The step size, per tensor, given to a client calibrating a round it did not take part in
    (ours, :class:`TopUp`): the participants' sample-weighted mean norm,
    (Σ_k N_k ‖U_k[tensor]‖ / Σ_k N_k)², as a squared norm (what eq. 2 reads of a retained U)."""
    if not squares:
        raise ValueError("borrowed_squares: no participant to take the step size from")
    clients = sorted(squares)
    total = sum(num_examples[k] for k in clients)
    keys = squares[clients[0]].keys()
    return {
        key: (sum(num_examples[k] * math.sqrt(squares[k][key]) for k in clients) / total) ** 2
        for key in keys
    }


def top_up_round(
    store, retained, clients: list[int], top_up: TopUp | None, excluded: set[int]
) -> tuple[list[int], set[int]]:
    """A calibrated round's clients with :func:`top_up_clients` added to ``retained`` (their N_k
    and borrowed squares, as if it kept their norms), and the added ones. The participants'
    squares are read from the store, one update at a time."""
    if top_up is None:
        return clients, set()
    pool = {k: n for k, n in top_up.pool.items() if k not in excluded}
    seed = round_seed(top_up.seed, "calibration", retained.round)
    extra = top_up_clients(clients, pool, top_up.minimum, seed)
    if not extra:
        return clients, set()
    squares = {k: retained.squares[k] for k in clients if k not in retained.unread}
    unread = [k for k in clients if k in retained.unread]
    squares.update({k: s for k, _, s in store.iter_updates(retained.round, unread)})
    borrowed = borrowed_squares(squares, retained.num_examples)
    for k in extra:
        retained.num_examples[k] = pool[k]
        retained.squares[k] = dict(borrowed)
    return sorted(set(clients) | set(extra)), set(extra)


def check_order(top_up: TopUp | None, calibration_order: str) -> None:
    """The top-up borrows a per-client step: eq. 2 applied per client (``"client"``) only."""
    if top_up is not None and top_up.minimum > 0 and calibration_order != "client":
        raise ConfigError(
            "calibration-clients", top_up.minimum, "0 with calibration-order = average"
        )
