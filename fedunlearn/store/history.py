"""The history a store kept, as each unlearning method reads it, and what forgetting a client
takes from it.

The retaining strategy stores the union of the run's retention policies once and records each
policy's own selection and state (:mod:`fedunlearn.store.retention`). A method reads only what its
own policy kept (:func:`history`, a :class:`HistoryView`); its policy's saved state is restored by
:func:`load_policy`; forgetting clients (:func:`forget_clients`) deletes their blobs and drops them
from the record and from every policy's state, in one call.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping

import torch

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.retention import (
    INTERVAL,
    RECORD_KEY,
    STATE_KEY,
    RetentionPolicy,
    RetentionRecord,
)

Policies = Mapping[str, type[RetentionPolicy]]


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

    def read_round(self, round: int, clients=None, exclude=(), *, blobs: str = "all"):
        kept = self._kept(round)
        wanted = kept if clients is None else kept & _as_set(clients)
        return self.store.read_round(round, clients=sorted(wanted), exclude=exclude, blobs=blobs)

    def iter_updates(self, round: int, clients) -> Iterator:
        return self.store.iter_updates(round, self._kept(round) & _as_set(clients))

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


# ------------------------------------------------------------------ what a store kept, by policy
def retention_record(store) -> RetentionRecord:
    """What each policy kept in ``store``; a store written before policies existed (or a
    rewritten history) holds FedEraser's schedule: every round with every client."""
    recorded = store.metadata.get(RECORD_KEY)
    if recorded is not None:
        return RetentionRecord.from_json(recorded)
    return RetentionRecord({INTERVAL: {r: tuple(store.clients(r)) for r in store.rounds()}})


def history(store, need: str, *, method: str = "") -> HistoryView:
    """The part of ``store`` the policy named ``need`` kept; refused when it kept nothing."""
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
    preflight reads the store read-only), a method whose retention ``store`` lacks."""
    from fedunlearn.registry import UNLEARNING, norms_problem

    for name in methods:
        policy = UNLEARNING[name].policy()
        if policy is not None:
            if store is None:
                raise ConfigError(
                    "retain", False, f"true: {name} needs {policy.name} kept during training"
                )
            if policy.keeps_rounds:
                history(store, policy.name, method=name)
            else:
                load_policy(store, policy, method=name)
        problem = norms_problem(UNLEARNING[name])
        if problem and store is not None and store.keeps_norms:
            raise ConfigError(
                "unlearn-methods",
                name,
                f"methods that run on a retain-mode = norms history ({problem}; the store kept "
                "only the norms of the updates after round t_1)",
            )


def load_policy(store, policy: type[RetentionPolicy], *, method: str = ""):
    """``policy`` as the training run left it: restored from the state saved after its last
    round (refused when the run kept none, or when it is malformed)."""
    states = store.metadata.get(STATE_KEY, {})
    last = max((int(r) for r in states), default=None)
    state = states[str(last)].get(policy.name) if last is not None else None
    if state is None:
        raise ConfigError(
            "unlearn-methods",
            method or policy.name,
            f"a run trained with {method or policy.name} among its methods",
        )
    return policy.from_state(state)


# ------------------------------------------------------------------ forgetting
def forget_clients(store, clients: Iterable[int], policies: Policies) -> int:
    """Delete ``clients``' retained blobs from ``store`` (None: nothing retained) with one vacuum,
    and their entries in the retention record and in every saved policy state (``policies``: the
    policy class of each name, :func:`fedunlearn.registry.retention_policies`): keeping them
    would keep their information. A state no policy of ``policies`` can restore is refused before
    anything is deleted. Idempotent; returns the blobs deleted."""
    if store is None:
        return 0
    clients = sorted({int(c) for c in clients})
    metadata = store.metadata
    states = _forget_in_states(metadata.get(STATE_KEY, {}), clients, policies)
    changed = {STATE_KEY: states} if states else {}
    if RECORD_KEY in metadata:
        record = retention_record(store)
        record.forget(clients)
        changed[RECORD_KEY] = record.to_json()
    if (
        changed
    ):  # first: a crash before the deletion leaves blobs no record names, never the reverse
        store.set_metadata(**changed)
    return store.delete_clients(clients)


def _forget_in_states(states: Mapping, clients: Collection[int], policies: Policies) -> dict:
    """Every saved round's policy states without ``clients``."""
    out = {}
    for saved_round, saved in states.items():
        out[saved_round] = {}
        for name, state in saved.items():
            if name not in policies:
                raise StoreCorruptionError(
                    f"retention state {name!r} (round {saved_round}) belongs to no registered "
                    f"policy ({', '.join(policies) or 'none'}); it may name the clients "
                    f"{list(clients)}, so nothing was forgotten: register its method first"
                )
            out[saved_round][name] = policies[name].forget_in_state(state, clients)
    return out


# ------------------------------------------------------------------ checks (store verify)
def policy_state_problems(metadata: Mapping, policies: Policies) -> list[str]:
    """One line per saved policy state its policy would refuse (never raises)."""
    states = metadata.get(STATE_KEY, {})
    if not isinstance(states, Mapping):
        return [f"metadata {STATE_KEY}: a JSON object of rounds, not {type(states).__name__}"]
    problems = []
    for saved_round, saved in states.items():
        for name, state in saved.items() if isinstance(saved, Mapping) else [("?", saved)]:
            if name not in policies:
                problems.append(f"metadata {STATE_KEY}[{saved_round}][{name}]: no such policy")
                continue
            try:
                policies[name].from_state(state)
            except (
                ConfigError,
                StoreCorruptionError,
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
            ) as error:
                problems.append(f"metadata {STATE_KEY}[{saved_round}][{name}]: {error}")
    return problems


def record_problems(store) -> list[str]:
    """One line per round or client the retention record names that the store does not hold
    (a method would read a history other than the one recorded; never raises)."""
    recorded = store.metadata.get(RECORD_KEY)
    if recorded is None:
        return []
    try:
        record = RetentionRecord.from_json(recorded)
    except ConfigError as error:
        return [f"metadata {RECORD_KEY}: {error}"]
    return record.unknown(store)
