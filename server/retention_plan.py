"""Which retention policies a run needs, and the view of the store each method reads.

Each unlearning method's registry entry names what it needs retained
(:data:`fedunlearn.registry.RETENTION_NEEDS`); the training strategy keeps the union of the
policies of the run's methods (:class:`strategies.retaining_fedavg.RetainingFedAvg`), and a method
reads only its own policy's selection (:class:`fedunlearn.store.retention.HistoryView`). A method
whose need the store did not retain (a later request after the history was rewritten, a run
trained without it) is refused before it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from fedunlearn.errors import ConfigError
from fedunlearn.registry import RETENTION_NEEDS, UNLEARNING
from fedunlearn.store.retention import (
    INTERVAL,
    RECORD_KEY,
    STATE_KEY,
    EveryRound,
    IntervalRetention,
    RetentionPolicy,
    check_retained,
    history,
    retention_record,
)

__all__ = ["check_retained", "history", "retention_record"]

#: The policy of each need: a factory ``f(config) -> RetentionPolicy`` (or ``"module:function"``).
POLICIES: dict[str, Callable | str] = {
    INTERVAL: lambda config: IntervalRetention(config.retain_interval, config.retain_mode),
    "round-history": lambda config: EveryRound(),
    "selected-history": "server.recovery_methods:crab_policy",
    "sensitivity-bounds": "server.recovery_methods:sifu_policy",
}


def retention_needs(methods: Iterable[str]) -> list[str]:
    """The retention needs of ``methods`` (registered unlearning methods), in NEEDS order."""
    needs = {need for name in methods for need in UNLEARNING[name].needs}
    return [need for need in RETENTION_NEEDS if need in needs]


def retention_policies(config) -> dict[str, RetentionPolicy]:
    """The policies the run's ``unlearn-methods`` need (none when ``retain`` is false)."""
    if not config.retain:
        return {}
    return {need: _factory(need)(config) for need in retention_needs(config.methods)}


def _factory(need: str) -> Callable:
    factory = POLICIES.get(need)
    if factory is None:
        raise ConfigError("retention", need, f"a need with a policy: {', '.join(POLICIES)}")
    return _resolve(factory)


def _resolve(function: Callable | str) -> Callable:
    """A callable, or ``"module:function"`` imported now."""
    if isinstance(function, str):
        module, _, name = function.partition(":")
        return getattr(importlib.import_module(module), name)
    return function


#: How a policy's saved state forgets clients: ``f(state, clients) -> state`` (or
#: ``"module:function"``); a policy whose state names clients must have one.
STATE_FORGETTERS: dict[str, Callable | str] = {
    "sensitivity-bounds": "server.recovery_methods:forget_sifu_state",
    "selected-history": "server.recovery_methods:forget_crab_state",
}


def forget_clients(store, clients: Iterable[int]) -> int:
    """Delete ``clients``' retained updates from ``store`` (None: nothing retained), and their
    entries in the retention record and the policies' states: keeping them would keep their
    information. Idempotent; returns the blobs deleted."""
    if store is None:
        return 0
    clients = sorted(set(clients))
    deleted = sum(store.delete_client(client) for client in clients)
    forget_in_record(store, clients)
    return deleted


def forget_in_record(store, clients: Iterable[int]) -> None:
    """Drop ``clients`` from the record and from every policy state that names them (their
    updates were deleted; their per-round numbers go too)."""
    clients = set(clients)
    metadata = store.metadata
    if RECORD_KEY in metadata:
        record = retention_record(store)
        record.forget(clients)
        store.set_metadata(**{RECORD_KEY: record.to_json()})
    states = metadata.get(STATE_KEY, {})
    for saved in states.values():
        for need in list(saved):
            forgetter = STATE_FORGETTERS.get(need)
            if forgetter is not None:
                saved[need] = _resolve(forgetter)(saved[need], clients)
    if states:
        store.set_metadata(**{STATE_KEY: states})
