"""What the server retains during training, and the view of it each unlearning method reads.

Every unlearning method needs something different from the training run: FedEraser the clients'
updates every Δt rounds (Liu et al., *FedEraser*, IWQoS 2021, Section IV-B: t_1 = 1,
t_{j+1} = t_j + Δt), FedRecover every round's global model and updates (Cao et al., S&P 2023,
Section 4), Crab only the rounds and clients its selective storage picks (Jiang et al., TIFS 2025),
SIFU every round's global model and a per-client sensitivity bound (Fraboni et al., AISTATS 2024).
A :class:`RetentionPolicy` says, round by round, what one of them keeps; the retaining strategy
asks every policy the run's methods need, stores the union once, and records each policy's own
selection (:class:`RetentionRecord`), so that each method reads exactly what its policy kept
(:class:`HistoryView`) and reports the bytes it alone would have needed.

``retain-mode = norms`` (:data:`RETAIN_MODES`): FedEraser's calibration (eq. 2) reads of an update
U_k^{t_j}, j > 1, only ‖U_k^{t_j}‖ per tensor, so its policy keeps round t_1 whole and afterwards
only those norms (:attr:`Selection.norms`); policies that keep whole updates later have no place in
such a run (:func:`fedunlearn.registry.norms_problem`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fedunlearn.errors import ConfigError, StoreCorruptionError

State = Mapping[str, torch.Tensor]
#: The store metadata keys of the policies' selections and of their states.
RECORD_KEY, STATE_KEY = "retention", "retention-state"
#: The policy FedEraser's schedule is kept under (a need of :data:`fedunlearn.registry.NEEDS`).
INTERVAL = "retained-updates"
#: ``retain-mode``: keep whole updates at every retained round, or whole at t_1 and norms after.
RETAIN_MODES = ("full", "norms")


def is_retained_round(server_round: int, retain_interval: int) -> bool:
    """Whether round ``server_round`` (1-based) is one of t_1 = 1, t_{j+1} = t_j + Δt, with
    Δt = ``retain_interval`` (>= 1)."""
    if retain_interval < 1:
        raise ValueError(f"retain_interval must be a whole number >= 1, got {retain_interval}")
    return server_round >= 1 and (server_round - 1) % retain_interval == 0


@dataclass(frozen=True)
class Selection:
    """What a policy keeps of one round: the global model M^t, these clients' updates, and of
    the clients in ``norms`` only ‖U_k^t‖ per tensor with N_k."""

    keep_global: bool
    clients: frozenset[int]
    norms: frozenset[int] = frozenset()

    @property
    def kept(self) -> frozenset[int]:
        """Every client kept in some form."""
        return self.clients | self.norms

    def keeps_anything(self) -> bool:
        return self.keep_global or bool(self.kept)

    @classmethod
    def merge(cls, selections: Iterable[Selection]) -> Selection | None:
        """What the store keeps of a round for all policies at once (None: nothing): the model if
        any wants it, a whole update where any wants one, the norms where only norms are wanted."""
        chosen = [s for s in selections if s.keeps_anything()]
        if not chosen:
            return None
        clients = frozenset().union(*(s.clients for s in chosen))
        norms = frozenset().union(*(s.norms for s in chosen)) - clients
        return cls(any(s.keep_global for s in chosen), clients, norms)

    @classmethod
    def of(cls, value: Selection | tuple[bool, Collection[int]]) -> Selection:
        """A policy's answer as a :class:`Selection` (a ``(keep_global, clients)`` pair too)."""
        if isinstance(value, Selection):
            return value
        keep_global, clients = value
        clients = frozenset(int(c) for c in clients)
        # An update means nothing without the model it was computed from.
        return cls(bool(keep_global) or bool(clients), clients)


class RetentionPolicy(Protocol):
    """Decides, after each training round, what one method needs kept of it.

    Two optional members: ``wants_start_loss = True`` has the clients report L^t, the training
    loss of the model they received, passed to ``select`` as ``loss`` (Crab's time windows); a
    ``settle()`` method, called after every ``select``, returns the final choice of earlier rounds
    the policy kept provisionally (``{round: clients}``, None for nothing of the round), for a
    policy that chooses rounds after they happened (Crab chooses when a window closes): the
    strategy records it and deletes what no policy keeps any more."""

    def select(
        self,
        server_round: int,
        global_state: State,
        updates: Mapping[int, State],
        num_examples: Mapping[int, int],
    ) -> Selection | tuple[bool, Collection[int]]: ...


class IntervalRetention:
    """FedEraser's schedule: every client's update at rounds 1, 1+Δt, 1+2Δt, ...; with
    ``mode="norms"``, round t_1 = 1 whole (M^{t_1} and the U_k^{t_1} of the uncalibrated first
    step) and at later retained rounds only each update's norm per tensor (eq. 2's step size)."""

    def __init__(self, retain_interval: int, mode: str = "full") -> None:
        is_retained_round(1, retain_interval)  # validates
        if mode not in RETAIN_MODES:
            raise ConfigError("retain-mode", mode, f"one of {', '.join(RETAIN_MODES)}")
        self.retain_interval = retain_interval
        self.mode = mode

    def select(self, server_round, global_state, updates, num_examples) -> Selection:
        if not is_retained_round(server_round, self.retain_interval):
            return Selection(False, frozenset())
        if self.mode == "norms" and server_round > 1:
            return Selection(False, frozenset(), frozenset(updates))
        return Selection(True, frozenset(updates))


class EveryRound:
    """Every round's global model and, unless ``models_only``, every client's update."""

    def __init__(self, *, models_only: bool = False) -> None:
        self.models_only = models_only

    def select(self, server_round, global_state, updates, num_examples) -> Selection:
        return Selection(True, frozenset() if self.models_only else frozenset(updates))


@dataclass
class RetentionRecord:
    """Per policy, what it selected: ``{policy: {round: clients}}`` (a round listed with no
    clients keeps only its global model). JSON-able through :meth:`to_json`."""

    selections: dict[str, dict[int, tuple[int, ...]]]

    @classmethod
    def empty(cls, policies: Iterable[str]) -> RetentionRecord:
        return cls({name: {} for name in policies})

    def add(self, policy: str, server_round: int, selection: Selection) -> None:
        """Record what ``policy`` kept of ``server_round``: the clients it kept in any form (the
        store says which: a whole update or its norms)."""
        if selection.keeps_anything():
            self.selections[policy][server_round] = tuple(sorted(selection.kept))

    def settle(self, policy: str, server_round: int, clients: Collection[int] | None) -> None:
        """Replace what ``policy`` kept of ``server_round`` by its final choice: ``clients`` with
        the round's model, or (None) nothing of the round."""
        if clients is None:
            self.selections[policy].pop(server_round, None)
        else:
            self.selections[policy][server_round] = tuple(sorted(int(c) for c in clients))

    def union(self, server_round: int) -> Selection | None:
        """Every client some policy kept of ``server_round``, in any form (None: nothing kept)."""
        chosen = [s[server_round] for s in self.selections.values() if server_round in s]
        if not chosen:
            return None
        return Selection(True, frozenset(c for clients in chosen for c in clients))

    def policies(self) -> list[str]:
        return list(self.selections)

    def forget(self, clients: Collection[int]) -> None:
        """Drop ``clients`` from every selection (after their updates were deleted)."""
        for selection in self.selections.values():
            for server_round, kept in selection.items():
                selection[server_round] = tuple(c for c in kept if c not in clients)

    def truncate(self, last_round: int) -> None:
        """Forget the rounds after ``last_round`` (a resumed run redoes them)."""
        for name, selection in self.selections.items():
            self.selections[name] = {r: c for r, c in selection.items() if r <= last_round}

    def unknown(self, store) -> list[str]:
        """One line per round, or client of a round, this record names that ``store`` does not
        hold (empty: the record describes the store)."""
        kept = set(store.rounds())
        problems = []
        for name, selection in self.selections.items():
            for server_round, clients in sorted(selection.items()):
                if server_round not in kept:
                    problems.append(f"retention record {name}: round {server_round} is not stored")
                    continue
                missing = sorted(set(clients) - set(store.clients(server_round)))
                if missing:
                    problems.append(
                        f"retention record {name}: round {server_round} names clients {missing} "
                        "the store does not hold"
                    )
        return problems

    def to_json(self) -> dict[str, Any]:
        return {
            name: {str(r): list(c) for r, c in selection.items()}
            for name, selection in self.selections.items()
        }

    @classmethod
    def from_json(cls, value: object) -> RetentionRecord:
        """The record a store's metadata holds; anything malformed is refused."""
        if not isinstance(value, dict):
            raise ConfigError("retention", type(value).__name__, "a JSON object of policies")
        selections: dict[str, dict[int, tuple[int, ...]]] = {}
        for name, selection in value.items():
            if not isinstance(selection, dict):
                raise ConfigError(f"retention.{name}", selection, "a JSON object of rounds")
            try:
                selections[str(name)] = {
                    int(r): tuple(int(c) for c in clients) for r, clients in selection.items()
                }
            except (TypeError, ValueError):
                raise ConfigError(
                    f"retention.{name}", selection, "round -> list of client ids"
                ) from None
        return cls(selections)


class HistoryView:
    """The part of an update store one policy selected: the rounds it kept, and in each round
    only the clients it kept. Read API as :class:`fedunlearn.store.update_store.UpdateStore`'s
    (``rounds``, ``clients``, ``num_examples``, ``read_global``, ``read_update``, ``read_round``,
    ``iter_rounds``), so a method cannot read what its own retention would not have kept."""

    def __init__(self, store, selection: Mapping[int, Collection[int]]) -> None:
        self.store = store
        self.root = store.root
        kept = set(store.rounds())
        self._selection = {
            r: frozenset(clients) & frozenset(store.clients(r))
            for r, clients in sorted(selection.items())
            if r in kept
        }

    def rounds(self) -> list[int]:
        return list(self._selection)

    def clients(self, round: int | None = None) -> list[int]:
        if round is None:
            return sorted(set().union(*self._selection.values()))
        return sorted(self._kept(round))

    def num_examples(self, round: int) -> dict[int, int]:
        counts = self.store.num_examples(round)
        return {c: n for c, n in counts.items() if c in self._kept(round)}

    def read_global(self, round: int) -> dict[str, torch.Tensor]:
        self._kept(round)
        return self.store.read_global(round)

    def read_update(self, round: int, client: int) -> dict[str, torch.Tensor]:
        if client not in self._kept(round):
            raise ConfigError(
                "client",
                client,
                f"a client this method kept in round {round}: {sorted(self._kept(round))}",
            )
        return self.store.read_update(round, client)

    def read_round(self, round: int, clients=None, exclude=()):
        kept = self._kept(round)
        wanted = kept if clients is None else kept & _as_set(clients)
        return self.store.read_round(round, clients=sorted(wanted), exclude=exclude)

    def iter_rounds(self, clients=None, exclude=()) -> Iterator:
        clients = None if clients is None else _as_set(clients)
        exclude = _as_set(exclude)
        for server_round in self.rounds():
            yield self.read_round(server_round, clients=clients, exclude=exclude)

    def total_bytes(self) -> int:
        """Bytes this selection keeps: global models, updates and norms rows."""
        total = 0
        for row in self.store.index().itertuples():
            kept = self._selection.get(int(row.round))
            if kept is not None and (row.kind == "global" or int(row.client) in kept):
                total += int(row.bytes)
        return total

    def _kept(self, round: int) -> frozenset[int]:
        if round not in self._selection:
            raise ConfigError("round", round, f"a round this method kept: {self.rounds()}")
        return self._selection[round]


def _as_set(clients) -> frozenset[int]:
    return frozenset([clients] if isinstance(clients, int) else clients)


# ------------------------------------------------------------------ what a store kept, by need
def retention_record(store) -> RetentionRecord:
    """What each policy kept in ``store``; a store written before policies existed (or a
    rewritten history) holds FedEraser's schedule: every round with every client."""
    recorded = store.metadata.get(RECORD_KEY)
    if recorded is not None:
        return RetentionRecord.from_json(recorded)
    return RetentionRecord({INTERVAL: {r: tuple(store.clients(r)) for r in store.rounds()}})


def history(store, need: str, *, method: str = "") -> HistoryView:
    """The part of ``store`` the policy of ``need`` kept; refused when it kept nothing."""
    record = retention_record(store)
    unknown = [
        line for line in record.unknown(store) if line.startswith(f"retention record {need}:")
    ]
    if unknown:  # refused before any method reads a history other than the recorded one
        raise StoreCorruptionError(f"{store.root}: {'; '.join(unknown)}; restore it from a backup")
    if need not in record.selections or not record.selections[need]:
        kept = [name for name, selection in record.selections.items() if selection]
        raise ConfigError(
            "unlearn-methods",
            method or need,
            f"methods whose retention the run kept ({', '.join(kept) or 'nothing'}); "
            f"{method or 'this method'} needs {need}, retained only when it is among the "
            "unlearn-methods of the training run (a rewritten history keeps the adopted "
            "method's trajectory only)",
        )
    return HistoryView(store, record.selections[need])


def check_retained(store, methods: Iterable[str]) -> None:
    """Refuse, before any method runs (and before a later request's federation starts: the
    preflight reads the store read-only), a method whose retention need ``store`` lacks."""
    from fedunlearn.registry import RETENTION_NEEDS, UNLEARNING, norms_problem

    for name in methods:
        for need in UNLEARNING[name].needs:
            if need in RETENTION_NEEDS:
                if store is None:
                    raise ConfigError(
                        "retain", False, f"true: {name} needs {need} kept during training"
                    )
                history(store, need, method=name)
        problem = norms_problem(UNLEARNING[name])
        if problem and store is not None and store.keeps_norms:
            raise ConfigError(
                "unlearn-methods",
                name,
                f"methods that run on a retain-mode = norms history ({problem}; the store kept "
                "only the norms of the updates after round t_1)",
            )
