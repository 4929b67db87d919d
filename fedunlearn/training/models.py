"""The federated models: every one is a ``body`` (feature extractor) and a ``head`` (one linear layer).

The built-in bodies (:mod:`fedunlearn.training.architectures`, registered in
:mod:`fedunlearn.model_registry`) follow Table I of Liu et al., *FedEraser* (IWQoS 2021): Adult 2 FC
layers; MNIST and Fashion-MNIST 2 convolutional + 2 fully connected layers; CIFAR-10 2
convolutional, 2 pooling and 2 fully connected layers; plus a small CNN for scikit-learn's 8x8
digits. A user's model comes in as ``model = "module:function"`` and is split at its linear head
(:func:`as_body_head`). The last layer is always ``head`` so that the head plug-ins (certified
removal, scrubbing) can address it by name on features ``phi(x) = body(x)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import ConfigError


class BodyHeadNet(nn.Module):
    """``head(body(x))`` with ``head`` a single :class:`torch.nn.Linear`.

    Parameters
    ----------
    body : nn.Module
        Maps an input batch to features of shape ``(batch, feature_dim)``.
    feature_dim : int
        Width of the features, the head's input size.
    num_classes : int
        The head's output size.
    """

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(feature_dim, num_classes)
        self.feature_dim = feature_dim
        self.num_classes = num_classes

    @classmethod
    def from_parts(cls, body: nn.Module, head: nn.Linear) -> BodyHeadNet:
        """``head(body(x))`` with the given ``head`` (a user's model, split at its linear head)."""
        net = cls.__new__(cls)
        nn.Module.__init__(net)
        net.body, net.head = body, head
        net.feature_dim, net.num_classes = head.in_features, head.out_features
        return net

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """phi(x): the body's output, the input of the linear head."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _check_forward_is_head_of_body(module, body, head, sample_shape, name: str) -> None:
    """The user's ``forward`` equals ``head(body(x))`` (in eval mode, on two random samples): the
    package runs ``head(body(x))``, so another forward would train and certify another model."""
    was_training = module.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            module.eval()
            x = torch.randn((2, *sample_shape))
            same = torch.allclose(module(x), head(body(x)), atol=1e-5)
    except (RuntimeError, ValueError, TypeError) as error:
        raise ConfigError(
            "model", name, f"a model that runs on samples of shape {tuple(sample_shape)} ({error})"
        ) from None
    finally:
        module.train(was_training)
    if not same:
        raise ConfigError(
            "model",
            name,
            "a model whose output is head(body(x)): the linear head must be its last step",
        )


def as_body_head(
    module: Any, num_classes: int, name: str = "model", sample_shape: Sequence[int] | None = None
) -> BodyHeadNet:
    """A builder's result as a :class:`BodyHeadNet` whose ``head`` is one linear layer.

    Accepted: a :class:`BodyHeadNet`; ``(body, feature_dim)`` (the built-in convention, topped with
    a new head); a module with a ``body`` module and a ``head`` :class:`torch.nn.Linear` (its
    ``forward`` must equal ``head(body(x))``, checked on random samples of ``sample_shape`` when
    given);
    or an :class:`torch.nn.Sequential` whose last layer is a :class:`torch.nn.Linear` (the rest is
    the body). Anything else is a :class:`ConfigError` on ``model``: the certified head, scrubbing
    and FedAU act on the linear head, and averaging needs one layout for every party.
    """
    if isinstance(module, BodyHeadNet):
        return module
    if isinstance(module, tuple) and len(module) == 2 and isinstance(module[0], nn.Module):
        body, feature_dim = module
        return BodyHeadNet(body, int(feature_dim), num_classes)
    if not isinstance(module, nn.Module):
        raise ConfigError(
            "model",
            name,
            f"a builder returning a torch.nn.Module; it returned {type(module).__name__}",
        )
    body, head = getattr(module, "body", None), getattr(module, "head", None)
    if isinstance(body, nn.Module) and isinstance(head, nn.Linear):
        if sample_shape is not None:
            _check_forward_is_head_of_body(module, body, head, sample_shape, name)
        return BodyHeadNet.from_parts(body, head)
    if isinstance(module, nn.Sequential) and len(module) > 1 and isinstance(module[-1], nn.Linear):
        return BodyHeadNet.from_parts(nn.Sequential(*list(module)[:-1]), module[-1])
    raise ConfigError(
        "model",
        name,
        "a model with a linear head: an nn.Sequential whose last layer is an nn.Linear, or a module "
        f"with a body and a head = nn.Linear (the certified head, scrubbing and FedAU act on it); "
        f"{type(module).__name__} has neither",
    )


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, *, seed: int | None = None
) -> BodyHeadNet:
    """Build a :class:`BodyHeadNet` by name, initialised from ``seed`` when given.

    Parameters
    ----------
    name : str
        A registered model (:data:`fedunlearn.model_registry.MODELS`) or a user's builder as
        ``"module:function"`` (:mod:`fedunlearn.model_spec`).
    input_shape : sequence of int
        Shape of one sample: ``(C, H, W)`` for the CNNs, ``(F,)`` for ``adult-mlp``.
    num_classes : int
        Number of output classes.
    seed : int, optional
        Seeds the initial weights so every party builds the same initial model M^1.
    """
    from fedunlearn.model_registry import MODELS

    spec = MODELS.spec(name)
    shape = tuple(int(s) for s in input_shape)
    if spec.input_rank is not None and len(shape) != spec.input_rank:
        raise ConfigError(
            "model",
            name,
            f"a model for inputs of rank {spec.input_rank}; the data has sample shape {shape}",
        )
    if num_classes < 2:
        raise ConfigError("num_classes", num_classes, "at least 2")
    builder = spec.resolve()
    if seed is None:
        return as_body_head(builder(shape, num_classes), num_classes, name, shape)
    # Seed a private generator so building a model never disturbs the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return as_body_head(builder(shape, num_classes), num_classes, name, shape)


def resolve_model_name(model: str, dataset: str, sample_shape: Sequence[int] | None = None) -> str:
    """``model`` itself, or, for ``model == "auto"``, the dataset's default model (picked by the
    samples' shape for a dataset that names none: :func:`fedunlearn.dataset_spec.auto_model_for`;
    still ``auto`` when that shape is not given and the dataset does not state it)."""
    if model != "auto":
        return model
    from fedunlearn.dataset_registry import DATASETS
    from fedunlearn.dataset_spec import auto_model_for

    spec = DATASETS.spec(dataset)
    if spec.default_model:
        return spec.default_model
    shape = sample_shape if sample_shape is not None else spec.sample_shape
    # A file's or a user's data: auto is resolved where the samples are known (building the
    # model); a record written before that keeps "auto", which resolves the same way again.
    return model if shape is None else auto_model_for(shape)


def build_dataset_model(
    model: str,
    dataset: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int | None = None,
) -> BodyHeadNet:
    """:func:`build_model` for a run's ``model`` key (``auto`` = the dataset's default)."""
    name = resolve_model_name(model, dataset, input_shape)
    return build_model(name, input_shape, num_classes, seed=seed)


def __getattr__(name: str):
    # Read from the registries on each access, so a model or dataset registered later counts.
    if name == "MODEL_NAMES":
        from fedunlearn.model_registry import MODELS

        return MODELS.names()
    if name == "DEFAULT_MODEL":
        from fedunlearn.dataset_registry import DATASETS

        return {spec.name: spec.default_model for spec in DATASETS if spec.default_model}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
