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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedunlearn.dataset_spec import check_signature, imported
from fedunlearn.spec_registry import SpecRegistry

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


class ModelRegistry(SpecRegistry[ModelSpec]):
    """Name -> :class:`ModelSpec`, in registration order (the ``model`` key's choices; ``auto``
    is no entry's name)."""

    key, spec_class, reserved, user_description = "model", ModelSpec, (AUTO,), "a user's model"
    entry_point_group = "fedunlearn.models"

    def allowed(self) -> str:
        return allowed_models(self)


def allowed_models(registry: ModelRegistry) -> str:
    """What ``model`` accepts, for error messages and the configuration page."""
    return (
        f"auto, one of {', '.join(registry.names())}, or your own builder as 'module:function' "
        "(docs/adding-a-dataset.md)"
    )


def check_builder(reference: str, value: str | None = None) -> None:
    """A user's builder (``reference``: ``module:function``) imports and takes two arguments (the
    sample shape and the number of classes); errors name ``model = value``."""
    check_signature("model", value or reference, imported("model", reference), 2)
