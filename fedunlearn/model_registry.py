"""The models a run's ``model`` key names: one :class:`~fedunlearn.model_spec.ModelSpec` per
model, one line each (its builder is a function of a module under
:mod:`fedunlearn.training.architectures`, imported when the model is built).

A model of your own needs no line here: ``model = "mypkg.models:build"`` in a run config builds it
through your function (``docs/adding-a-dataset.md``). To make it a named model, add its module and
one line at the end.
"""

from __future__ import annotations

from fedunlearn.model_spec import ModelRegistry

MODELS = ModelRegistry()

_ARCHITECTURES = "fedunlearn.training.architectures"
MODELS.register(
    "digits-cnn",
    f"{_ARCHITECTURES}.small_cnns:digits_cnn",
    description="conv 16@3x3, pool, FC 64: for small images (8x8 digits)",
    input_rank=3,
)
MODELS.register(
    "mnist-cnn",
    f"{_ARCHITECTURES}.small_cnns:mnist_cnn",
    description="FedEraser's MNIST network: 2 conv (20, 50 @5x5) + FC 500 (Liu et al. 2021)",
    input_rank=3,
)
MODELS.register(
    "cifar10-cnn",
    f"{_ARCHITECTURES}.small_cnns:cifar10_cnn",
    description="FedEraser's CIFAR-10 network: 2 conv (32, 64 @5x5) + FC 512 (Liu et al. 2021)",
    input_rank=3,
)
MODELS.register(
    "adult-mlp",
    f"{_ARCHITECTURES}.mlp:adult_mlp",
    description="FedEraser's Adult network: FC 64 on feature vectors (Liu et al. 2021)",
    input_rank=1,
)
MODELS.register(
    "resnet18-cifar",
    f"{_ARCHITECTURES}.resnet:resnet18_cifar",
    description="ResNet-18, CIFAR variant, BatchNorm (He et al. 2016): 11.2M parameters; give it a GPU",
    input_rank=3,
)
MODELS.register(
    "resnet18-cifar-gn",
    f"{_ARCHITECTURES}.resnet:resnet18_cifar_gn",
    description="ResNet-18, CIFAR variant, GroupNorm for label skew (Hsieh et al. 2020); stacks for the judge",
    input_rank=3,
)

# ---------------------------------------------------------------------- models a user adds
# One line each, e.g.
# MODELS.register("my-net", "mypkg.models:build", description="...", input_rank=3)
