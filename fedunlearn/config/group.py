"""The group view: one group's values by their names in it (``config.certified.lam``), the form a
rule of one group takes (:data:`fedunlearn.config.rules.RULES`) and a direct user of the group's
parameters passes to :func:`fedunlearn.config.rules.validate_group`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class ConfigGroup(Mapping[str, Any]):
    """A read-only view of one group's values by their names in it (``config.certified.lam``).

    :meth:`key` is the name an error reports: the run-config key (``certified-lambda``) for a
    configuration's view, the name itself for a direct user's.
    """

    def __init__(self, name: str, values: Mapping[str, Any], keys: Mapping[str, str] | None = None):
        self.name, self._values, self._keys = name, dict(values), dict(keys or {})

    def key(self, name: str) -> str:
        return self._keys.get(name, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"group {self.name!r} has no {name!r}") from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ConfigGroup({self.name!r}, {self._values!r})"
