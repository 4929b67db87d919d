"""Every model is body + linear head; shapes as in FedEraser's Table I."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.training.models import DEFAULT_MODEL, MODEL_NAMES, build_model, resolve_model_name


@pytest.mark.parametrize(
    ("name", "input_shape", "feature_dim"),
    [
        ("digits-cnn", (1, 8, 8), 64),
        ("mnist-cnn", (1, 28, 28), 500),
        ("cifar10-cnn", (3, 32, 32), 512),
        ("adult-mlp", (104,), 64),
    ],
)
def test_model_shapes_body_and_head(name, input_shape, feature_dim):
    num_classes = 2 if name == "adult-mlp" else 10
    model = build_model(name, input_shape, num_classes, seed=0)
    x = torch.randn(5, *input_shape)
    assert model.features(x).shape == (5, feature_dim)
    assert model(x).shape == (5, num_classes)
    assert isinstance(model.head, nn.Linear)
    assert model.head.in_features == feature_dim and model.head.out_features == num_classes
    assert {"head.weight", "head.bias"} <= set(model.state_dict())
    assert all(k.startswith(("body.", "head.")) for k in model.state_dict())


def test_paper_layer_counts():
    convs = lambda m: sum(isinstance(x, nn.Conv2d) for x in m.modules())  # noqa: E731
    linears = lambda m: sum(isinstance(x, nn.Linear) for x in m.modules())  # noqa: E731
    pools = lambda m: sum(isinstance(x, nn.MaxPool2d) for x in m.modules())  # noqa: E731
    mnist = build_model("mnist-cnn", (1, 28, 28), 10)
    cifar = build_model("cifar10-cnn", (3, 32, 32), 10)
    adult = build_model("adult-mlp", (104,), 2)
    assert (convs(mnist), linears(mnist)) == (2, 2)
    assert (convs(cifar), pools(cifar), linears(cifar)) == (2, 2, 2)
    assert (convs(adult), linears(adult)) == (0, 2)


def test_same_seed_same_initial_model_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("digits-cnn", (1, 8, 8), 10, seed=7)
    after = torch.rand(1)
    b = build_model("digits-cnn", (1, 8, 8), 10, seed=7)
    c = build_model("digits-cnn", (1, 8, 8), 10, seed=8)
    assert torch.equal(before, after)
    for key in a.state_dict():
        assert torch.equal(a.state_dict()[key], b.state_dict()[key])
    assert not torch.equal(a.state_dict()["head.weight"], c.state_dict()["head.weight"])


def test_bad_model_requests():
    with pytest.raises(ConfigError, match="model='resnet'"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="rank 1"):
        build_model("adult-mlp", (1, 8, 8), 2)
    assert resolve_model_name("auto", "fashion-mnist") == "mnist-cnn"
    assert set(DEFAULT_MODEL.values()) <= set(MODEL_NAMES)
