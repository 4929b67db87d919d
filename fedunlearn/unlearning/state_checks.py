"""What a store's header says about its history, checked the way the methods read it: the
retention policies' saved states (Crab's selection, SIFU's sensitivity accumulator) and the
retention record's rounds and clients. ``fedunlearn store verify`` reports each problem; the
methods refuse the same values when they load them (their own loaders raise)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fedunlearn.errors import ConfigError
from fedunlearn.store.retention import RECORD_KEY, STATE_KEY, RetentionRecord
from fedunlearn.unlearning.crab import check_state_format, copy_influence_record
from fedunlearn.unlearning.sifu import SensitivityAccumulator


def _crab_state(state) -> None:
    """Crab's selection as :func:`server.recovery_methods.crab` reads it."""
    check_state_format(state)
    for record in state["influence"].values():
        copy_influence_record(record)


#: How each retention need's saved state is loaded (and refused) by the method that reads it.
STATE_LOADERS: dict[str, Callable[[object], object]] = {
    "selected-history": _crab_state,
    "sensitivity-bounds": SensitivityAccumulator.from_json,
}


def policy_state_problems(metadata: Mapping) -> list[str]:
    """One line per saved policy state its method would refuse (never raises)."""
    problems = []
    states = metadata.get(STATE_KEY, {})
    if not isinstance(states, Mapping):
        return [f"metadata {STATE_KEY}: a JSON object of rounds, not {type(states).__name__}"]
    for saved_round, saved in states.items():
        for need, state in saved.items() if isinstance(saved, Mapping) else [("?", saved)]:
            loader = STATE_LOADERS.get(need)
            if loader is None:
                continue
            try:
                loader(state)
            except (ConfigError, ValueError, TypeError, KeyError, AttributeError) as error:
                problems.append(f"metadata {STATE_KEY}[{saved_round}][{need}]: {error}")
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
