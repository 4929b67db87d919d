"""A registry of named specs, the shape shared by the dataset and model registries
(:mod:`fedunlearn.dataset_spec`, :mod:`fedunlearn.model_spec`): registration order kept, a name
registered once, a ``with`` block for a test's toy, entries that installed packages declare in an
entry point group, and ``spec(value)`` for what a run-config value means: a registered name, an
installed one, or a user's ``module:function`` (a spec made on the spot)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from fedunlearn.errors import ConfigError

#: A registered dataset's or model's name: lower-case letters, digits and '-'.
SPEC_NAME = re.compile(r"[a-z][a-z0-9-]*")
#: A user's own loader or builder: ``package.module:function``.
IMPORT_REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")

Spec = TypeVar("Spec")


def is_import_reference(value: object) -> bool:
    """Whether ``value`` reads ``module:function`` (a user's own loader or model builder)."""
    return isinstance(value, str) and bool(IMPORT_REFERENCE.fullmatch(value))


class SpecRegistry(Generic[Spec]):
    """Name -> spec, in registration order, for the run-config key ``key``.

    Subclasses set ``key`` (the key that names an entry, e.g. ``"dataset"``), ``spec_class``,
    ``reserved`` (names no entry may take) and :meth:`allowed` (what the key accepts)."""

    key: str = ""
    spec_class: Callable[..., Spec]
    reserved: tuple[str, ...] = ()
    #: The description of a spec made on the spot for a user's ``module:function``.
    user_description: str = ""
    #: The entry point group through which an installed package adds entries by name
    #: (``[project.entry-points."fedunlearn.datasets"] waves = "mypkg.data:load"``).
    entry_point_group: str = ""
    #: The facts of an entry an installed package adds (it states none).
    installed_facts: dict[str, Any] = {}

    def __init__(self) -> None:
        self._specs: dict[str, Spec] = {}

    def allowed(self) -> str:
        raise NotImplementedError

    def register(self, name: str, implementation: str | Callable[..., Any], **facts: Any) -> Spec:
        """Add an entry; returns its spec. A taken or reserved name is refused."""
        if not isinstance(name, str) or not SPEC_NAME.fullmatch(name) or name in self.reserved:
            reserved = f", not {', '.join(self.reserved)}" if self.reserved else ""
            allowed = f"lower-case letters, digits and '-', starting with a letter{reserved}"
            raise ConfigError("name", name, allowed)
        if name in self._specs:
            taken = ", ".join(self.names())
            raise ConfigError("name", name, f"a {self.key} name not registered yet ({taken})")
        spec = self.spec_class(name, implementation, **facts)
        self._specs[name] = spec
        return spec

    def unregister(self, name: str) -> Spec:
        """Remove an entry (a test's toy); returns its spec."""
        spec = self[name]
        del self._specs[name]
        return spec

    @contextlib.contextmanager
    def registered(self, name: str, implementation, **facts: Any) -> Iterator[Spec]:
        """Register an entry for the duration of a ``with`` block (tests)."""
        spec = self.register(name, implementation, **facts)
        try:
            yield spec
        finally:
            self._specs.pop(name, None)

    def installed(self) -> dict[str, str]:
        """Entries installed packages declare in :attr:`entry_point_group`: name ->
        ``module:function``, read on each call (a package installed later counts); a name that
        is taken, reserved or malformed, or a value that is no ``module:function``, is left out."""
        if not self.entry_point_group:
            return {}
        from importlib.metadata import entry_points

        return {
            point.name: point.value
            for point in entry_points(group=self.entry_point_group)
            if SPEC_NAME.fullmatch(point.name)
            and point.name not in self._specs
            and point.name not in self.reserved
            and is_import_reference(point.value)
        }

    def names(self) -> tuple[str, ...]:
        return (*self._specs, *self.installed())

    def __contains__(self, name: object) -> bool:
        return name in self._specs or name in self.installed()

    def __iter__(self) -> Iterator[Spec]:
        return iter([*self._specs.values(), *map(self._installed_spec, self.installed())])

    def __getitem__(self, name: str) -> Spec:
        if name in self._specs:
            return self._specs[name]
        if name in self.installed():
            return self._installed_spec(name)
        raise ConfigError(self.key, name, self.allowed())

    def _installed_spec(self, name: str) -> Spec:
        value = self.installed()[name]
        described = f"installed by a package ({value})"
        return self.spec_class(name, value, description=described, **self.installed_facts)

    def spec(self, value: str) -> Spec:
        """The spec ``<key> = value`` means: a registered one, one an installed package declares,
        or a user's ``module:function`` (its facts unknown until it is loaded or built)."""
        if is_import_reference(value):
            return self.spec_class(value, value, description=self.user_description)
        return self[value]

    def user_code(self, value: str) -> str | None:
        """The ``module:function`` to check at launch when ``value`` names user code (a
        reference, or an installed package's entry); None for an entry registered here."""
        if is_import_reference(value):
            return value
        return self.installed().get(value)
