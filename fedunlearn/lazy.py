"""Lazy re-exports (PEP 562), written once for every package that re-exports its modules' names.

A package names where each public name lives; nothing is imported until a name is asked for, so a
command that needs one light module (a bad key's one-line error, ``store info`` on a folder without
a store) does not import PyTorch through a package's ``__init__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence


def homes_of(homes: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each public name -> the module (of the package) that defines it."""
    return {name: module for module, names in homes.items() for name in names}


def lazy_getattr(package: str, homes: Mapping[str, Sequence[str]]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: a public name (or one of the modules ``homes``
    names) imported when first asked for; anything else an :class:`AttributeError`."""
    home = homes_of(homes)

    def __getattr__(name: str) -> object:
        module = home.get(name, name)
        if module not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        imported = importlib.import_module(f"{package}.{module}")
        return imported if module == name else getattr(imported, name)

    return __getattr__
