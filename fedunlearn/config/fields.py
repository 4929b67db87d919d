"""How a run-config key is declared: a key every run reads is a dataclass field of
:class:`fedunlearn.config.parameters.RunParameters` whose metadata holds its group, its
constraint, its description and its name in the group view (:func:`key_in`); a key of one method
is a :class:`MethodKey` on the method's registry entry (``MethodSpec.keys`` in
:mod:`fedunlearn.registry`). Also the constraints many keys share. :mod:`fedunlearn.config.table`
reads both back row by row."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedunlearn.config.constraints import Constraint, Interval
from fedunlearn.errors import ConfigError

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


#: A run-config key's spelling: lower case, words joined by ``-`` (its attribute has ``_``).
KEY_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
#: The types a run-config value takes (what :func:`fedunlearn.config.constraints.coerce` converts to).
KINDS = (bool, int, float, str)


@dataclass(frozen=True)
class MethodKey:
    """A run-config key that belongs to one registered method, declared on its registry entry
    (``MethodSpec.keys``) and read as ``config.<key with _ for ->`` like any other key.

    Parameters
    ----------
    key : str
        Its name in the run config, e.g. ``"crab-window"`` (:data:`KEY_NAME`).
    default : bool, int, float or str
        Its value when the run config does not set it; its type is the key's type.
    constraint : Constraint
        What it allows (:mod:`fedunlearn.config.constraints`); bad input is refused naming the
        key, the value and ``constraint.allowed``.
    description : str
        What it means, for ``docs/configuration.md``.
    """

    key: str
    default: Any
    constraint: Constraint
    description: str

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not KEY_NAME.fullmatch(self.key):
            raise ConfigError(
                "keys", self.key, "lower-case words joined by '-', e.g. 'crab-window'"
            )
        if type(self.default) not in KINDS:
            raise ConfigError(self.key, self.default, "a default of type bool, int, float or str")
        if not isinstance(self.constraint, Constraint) or not self.description:
            raise ConfigError(self.key, self.constraint, "a Constraint and a description")

    @property
    def attribute(self) -> str:
        """Its name as a configuration attribute (``crab_window``)."""
        return self.key.replace("-", "_")

    @property
    def kind(self) -> type:
        """Its type: the default's."""
        return type(self.default)
