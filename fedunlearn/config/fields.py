"""How a run-config key is declared: a dataclass field whose metadata holds its group, its
constraint, its description and its name in the group view (:func:`key_in`), and the constraints
many keys share. :mod:`fedunlearn.config.parameters` and :mod:`fedunlearn.config.method_parameters`
declare their keys with these; :mod:`fedunlearn.config.table` reads them back row by row."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import field
from typing import Any

from fedunlearn.config.constraints import Constraint, Interval

WHOLE = int
NUMBER = float
POSITIVE = Interval(NUMBER, 0, closed="neither")
AT_LEAST_1 = Interval(WHOLE, 1)
NON_NEGATIVE = Interval(NUMBER, 0.0)


def key_in(group: str) -> Callable[..., Any]:
    """The declaration of a key of ``group``: ``key(default, constraint, description, name=)``
    returns its dataclass field (``name``: its name in the group view, when not the attribute's
    without the group's prefix)."""

    def key(default: Any, constraint: Constraint, description: str, *, name: str = "") -> Any:
        metadata = {"group": group, "constraint": constraint, "description": description}
        return field(default=default, metadata={**metadata, "name": name})

    return key


def lazy_names(module: str, name: str) -> Callable[[], tuple[str, ...]]:
    """Names read from ``module`` when a value is checked (the certified modules need SciPy)."""
    return lambda: getattr(importlib.import_module(module), name)
