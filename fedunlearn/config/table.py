"""The constraints table read row by row: every key with its group, name in the group view, type,
default, constraint and description, from two declarations: the keys every run reads (the fields
of :class:`~fedunlearn.config.parameters.RunParameters`) and each registered method's own
(``MethodSpec.keys`` in :mod:`fedunlearn.registry`, :class:`~fedunlearn.config.fields.MethodKey`);
and values checked against it."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedunlearn.config.constraints import Constraint, Interval
from fedunlearn.config.fields import MethodKey
from fedunlearn.config.parameters import _PREFIXES, GROUPS, RunParameters
from fedunlearn.errors import ConfigError
from fedunlearn.registry import SCRUBBING, UNLEARNING

#: The registries whose entries may declare keys, each into its own group (``Registry.group``).
KEYED_REGISTRIES = (UNLEARNING, SCRUBBING)


@dataclass(frozen=True)
class Parameter:
    """One row of the table: a run-config key and what it allows; ``method`` names the registered
    method that declares it (None: a key every run reads)."""

    key: str
    attribute: str
    group: str
    name: str
    kind: type
    default: Any
    constraint: Constraint
    description: str
    method: str | None = None


def parameter_table() -> tuple[Parameter, ...]:
    """Every key, in the table's order: group by group in the order of
    :data:`~fedunlearn.config.parameters.GROUPS`; in a group, the keys every run reads in their
    declaration order, then the registered methods' own in registration order (a method
    registered later, e.g. by a test, is listed, validated and read like a built-in one)."""
    return _table(_method_keys())


def method_parameters() -> tuple[Parameter, ...]:
    """The rows the registered methods declare (``MethodSpec.keys``), in the table's order."""
    return tuple(row for row in parameter_table() if row.method is not None)


def _method_keys() -> tuple[tuple[str, str, MethodKey], ...]:
    """``(group, method, key)`` of every key a registered method declares."""
    return tuple(
        (registry.group, method, item)
        for registry in KEYED_REGISTRIES
        for method, item in registry.keys()
    )


@functools.cache
def _core_rows() -> tuple[Parameter, ...]:
    """The keys every run reads: :class:`RunParameters`' fields."""
    rows = []
    for item in fields(RunParameters):
        meta = item.metadata
        if "group" not in meta:
            continue
        prefix = _PREFIXES.get(meta["group"], "")
        rows.append(
            Parameter(
                key=item.name.replace("_", "-"),
                attribute=item.name,
                group=meta["group"],
                name=meta["name"] or item.name.removeprefix(prefix),
                kind=type(item.default),
                default=item.default,
                constraint=meta["constraint"],
                description=meta["description"],
            )
        )
    return tuple(rows)


def _method_row(group: str, method: str, item: MethodKey) -> Parameter:
    """A method's key as a row of its registry's group."""
    return Parameter(
        key=item.key,
        attribute=item.attribute,
        group=group,
        name=item.attribute.removeprefix(_PREFIXES.get(group, "")),
        kind=item.kind,
        default=item.default,
        constraint=item.constraint,
        description=item.description,
        method=method,
    )


@functools.cache
def _table(method_keys: tuple[tuple[str, str, MethodKey], ...]) -> tuple[Parameter, ...]:
    """The rows, the core's and ``method_keys``', group by group; a key declared twice (by a
    method and the core, or by two registries' methods) is refused, naming both."""
    rows = [*_core_rows(), *(_method_row(*item) for item in method_keys)]
    owners: dict[str, str] = {}
    for row in rows:
        owner = row.method or "the keys every run reads"
        if owners.setdefault(row.key, owner) != owner:
            raise ConfigError("keys", row.key, f"a key {owners[row.key]} does not declare")
    order = list(GROUPS)
    return tuple(sorted(rows, key=lambda row: order.index(row.group)))


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
