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
from fedunlearn.registry import RETENTION_NEEDS, UNLEARNING, norms_problem
from fedunlearn.store.retention import (
    EveryRound,
    HistoryView,
    IntervalRetention,
    RetentionPolicy,
    RetentionRecord,
)
from strategies.retaining_fedavg import INTERVAL, RECORD_KEY, STATE_KEY

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
    """Refuse, before any method runs, a method whose retention need ``store`` lacks."""
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


#: How a policy's saved state forgets clients: ``f(state, clients) -> state`` (or
#: ``"module:function"``); a policy whose state names clients must have one.
STATE_FORGETTERS: dict[str, Callable | str] = {
    "sensitivity-bounds": "server.recovery_methods:forget_sifu_state",
    "selected-history": "server.recovery_methods:forget_crab_state",
}


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
