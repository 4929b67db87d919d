"""The constraints table read row by row: every key of :class:`~fedunlearn.config.parameters.RunParameters`
with its group, name in the group view, type, default, constraint and description; and values
checked against it."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedunlearn.config.constraints import Constraint, Interval
from fedunlearn.config.parameters import _PREFIXES, GROUPS, RunParameters
from fedunlearn.errors import ConfigError


@dataclass(frozen=True)
class Parameter:
    """One row of the table: a run-config key and what it allows."""

    key: str
    attribute: str
    group: str
    name: str
    kind: type
    default: Any
    constraint: Constraint
    description: str


@functools.cache
def parameter_table() -> tuple[Parameter, ...]:
    """Every key, in the table's order: group by group in the order of
    :data:`~fedunlearn.config.parameters.GROUPS`, each group's keys in their declaration order
    (:class:`RunParameters`' core keys before the single methods')."""
    rows = []
    order = list(GROUPS)
    for item in sorted(fields(RunParameters), key=lambda item: order.index(item.metadata["group"])):
        meta = item.metadata
        prefix = _PREFIXES.get(meta["group"], "")
        name = meta["name"] or item.name.removeprefix(prefix)
        rows.append(
            Parameter(
                key=item.name.replace("_", "-"),
                attribute=item.name,
                group=meta["group"],
                name=name,
                kind=type(item.default),
                default=item.default,
                constraint=meta["constraint"],
                description=meta["description"],
            )
        )
    return tuple(rows)


def parameter_constraints(group: str | None = None, *, by: str = "key") -> dict[str, Constraint]:
    """``{key: constraint}`` (``by="key"``) or ``{name in the group view: constraint}``
    (``by="name"``) of one group or of all."""
    return {
        getattr(row, by): row.constraint
        for row in parameter_table()
        if group is None or row.group == group
    }


def validated_parameters(values: Mapping[str, object]) -> dict[str, object]:
    """The values of run-config keys checked against the constraints table (numbers as numbers:
    a bool or a string is refused)."""
    constraints = parameter_constraints()
    out = {}
    for key, value in values.items():
        constraint = constraints[key]
        if isinstance(constraint, Interval):
            whole = constraint.kind is int
            numeric = isinstance(value, int if whole else (int, float))
            if isinstance(value, bool) or not numeric:
                raise ConfigError(key, value, constraint.allowed)
            value = value if whole else float(value)
        constraint.check(key, value)
        out[key] = value
    return out
