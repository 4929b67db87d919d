"""What a model is to a run: a :class:`ModelSpec` (its builder and the inputs it takes) in a
registry of them.

A run's ``model`` key names a registered model (:mod:`fedunlearn.model_registry`), ``auto`` (the
dataset's own), or a user's builder as ``"module:function"`` (``model = "mypkg.models:build"``),
imported at launch and checked like every key. A builder is called as
``build(input_shape, num_classes)`` and returns either ``(body, feature_dim)`` (the built-in
convention: the package adds the linear head) or a whole :class:`torch.nn.Module` whose linear head
can be found: a :class:`~fedunlearn.training.models.BodyHeadNet`, a module with a ``body`` and a
``head`` that is a :class:`torch.nn.Linear`, or an :class:`torch.nn.Sequential` ending in one
(:func:`fedunlearn.training.models.as_body_head`). The certified head, scrubbing and FedAU act on
that head (``head(body(x))``), so a model without one is refused by name.

This module imports no PyTorch, so the run config can be checked without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fedunlearn.dataset_spec import (
    SPEC_NAME,
    check_signature,
    imported,
    is_import_reference,
)
from fedunlearn.errors import ConfigError

#: ``model = "auto"``: the dataset's own model (its spec's ``default_model``).
AUTO = "auto"


@dataclass(frozen=True)
class ModelSpec:
    """One model.

    Parameters
    ----------
    name : str
        What ``model`` says: a registered name, or a user's ``module:function``.
    builder : str or callable
        ``build(input_shape, num_classes)``, as ``"module:function"`` or the function itself.
    description : str
        One line for ``fedunlearn models`` and the documentation.
    input_rank : int or None
        The rank of the samples it takes (3: ``(C, H, W)`` images, 1: feature vectors); None when
        only running it tells (a user's model).
    """

    name: str
    builder: str | Callable[..., Any]
    description: str = ""
    input_rank: int | None = None

    def resolve(self) -> Callable[..., Any]:
        """The builder as a callable."""
        return self.builder if callable(self.builder) else imported("model", self.builder)


@dataclass
class ModelRegistry:
    """Name -> :class:`ModelSpec`, in registration order (the ``model`` key's choices)."""

    _specs: dict[str, ModelSpec] = field(default_factory=dict)

    def register(self, name: str, builder: str | Callable[..., Any], **facts: Any) -> ModelSpec:
        """Add a model; returns its spec. A name already registered (or ``auto``) is refused."""
        if not isinstance(name, str) or not SPEC_NAME.fullmatch(name) or name == AUTO:
            raise ConfigError(
                "name", name, "lower-case letters, digits and '-', starting with a letter, not auto"
            )
        if name in self._specs:
            raise ConfigError(
                "name", name, f"a model name not registered yet ({', '.join(self.names())})"
            )
        spec = ModelSpec(name, builder, **facts)
        self._specs[name] = spec
        return spec

    @contextlib.contextmanager
    def registered(self, name: str, builder, **facts: Any) -> Iterator[ModelSpec]:
        """Register a model for the duration of a ``with`` block (tests)."""
        spec = self.register(name, builder, **facts)
        try:
            yield spec
        finally:
            self._specs.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(list(self._specs.values()))

    def __getitem__(self, name: str) -> ModelSpec:
        if name not in self._specs:
            raise ConfigError("model", name, allowed_models(self))
        return self._specs[name]

    def spec(self, value: str) -> ModelSpec:
        """The spec ``model = value`` means (``value`` not ``auto``): a registered one, or a
        user's ``module:function``."""
        if is_import_reference(value):
            return ModelSpec(value, value, description="a user's model")
        return self[value]


def allowed_models(registry: ModelRegistry) -> str:
    """What ``model`` accepts, for error messages and the configuration page."""
    return (
        f"auto, one of {', '.join(registry.names())}, or your own builder as 'module:function' "
        "(docs/adding-a-dataset.md)"
    )


def check_builder(reference: str) -> None:
    """A user's ``model = "module:function"`` imports and takes two arguments (the sample shape
    and the number of classes)."""
    check_signature("model", reference, imported("model", reference), 2)
