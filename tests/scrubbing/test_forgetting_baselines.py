"""Section 5.2 baselines of Golatkar et al. (2020): negative gradient, random labels, hiding."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import fedunlearn.scrubbing.baselines as baselines
from fedunlearn.data.datasets import load_dataset
from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.baselines import (
    chance_clamped_cross_entropy,
    hide_class,
    negative_gradient_epochs,
    random_label_epochs,
    random_labels,
)
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.models import build_dataset_model

K = 10


@pytest.fixture(scope="module")
def trained():
    """A digits CNN trained on 500 digits training samples, and a forget set D_f of 60 samples."""
    data = load_dataset("digits", seed=0)
    model = build_dataset_model("auto", "digits", (1, 8, 8), K, seed=0)
    x, y = data.train.x[:500], data.train.y[:500]
    train_epochs(model, x, y, epochs=3, lr=0.1, batch_size=32, seed=0, momentum=0.9)
    return model, x[:60], y[:60]


def _state(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


def _assert_same(first, second):
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0)


# ---------------------------------------------------------------- negative gradient


def test_chance_clamped_cross_entropy_gives_no_gradient_past_chance():
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 5.0, 0.0]], requires_grad=True)
    targets = torch.tensor([0, 0])  # the first is confident and right, the second wrong
    clamped = chance_clamped_cross_entropy(logits, targets, 3)
    full = nn.functional.cross_entropy(logits, targets, reduction="none")
    assert full[1] > math.log(3)
    torch.testing.assert_close(clamped[0], full[0])
    assert clamped[1].item() == pytest.approx(math.log(3))
    clamped.sum().backward()
    assert torch.count_nonzero(logits.grad[1]) == 0
    assert torch.count_nonzero(logits.grad[0]) == 3


def test_negative_gradient_raises_the_forget_loss_of_a_trained_model(trained):
    model, x_f, y_f = trained
    model = copy.deepcopy(model)
    before = evaluate(model, x_f, y_f)
    assert before.loss < 0.5 and before.accuracy > 0.9
    last = negative_gradient_epochs(
        model, x_f, y_f, epochs=3, lr=0.05, batch_size=16, seed=0, num_classes=K
    )
    after = evaluate(model, x_f, y_f)
    assert after.loss > before.loss + 0.5
    assert after.accuracy < before.accuracy
    assert 0 < last <= math.log(K)


def test_negative_gradient_is_seeded(trained):
    model, x_f, y_f = trained
    kwargs = {"epochs": 2, "lr": 0.05, "batch_size": 16, "seed": 3, "num_classes": K}
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    assert negative_gradient_epochs(first, x_f, y_f, **kwargs) == negative_gradient_epochs(
        second, x_f, y_f, **kwargs
    )
    _assert_same(first.state_dict(), second.state_dict())


def test_negative_gradient_stops_once_every_sample_is_past_chance(trained):
    """A model sure of a wrong class on all of D_f (loss >> log K) gets no gradient at all."""
    model, x_f, _ = trained
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[0] = 12.0  # predicts class 0 for everything
    y_f = torch.full((len(x_f),), 3)
    assert evaluate(model, x_f, y_f).loss > math.log(K) + 5
    before = _state(model)
    last = negative_gradient_epochs(
        model, x_f, y_f, epochs=2, lr=0.5, batch_size=16, seed=0, num_classes=K, momentum=0.9
    )
    assert last == pytest.approx(math.log(K))
    _assert_same(_state(model), before)


# ---------------------------------------------------------------- random labels


def test_random_labels_are_never_the_true_label_and_cover_the_others_uniformly():
    y = torch.arange(K).repeat(2000)
    drawn = random_labels(y, K, torch.Generator().manual_seed(0))
    assert drawn.shape == y.shape and drawn.dtype == torch.int64
    assert not torch.any(drawn == y)
    assert drawn.min() >= 0 and drawn.max() < K
    for true in range(K):
        counts = torch.bincount(drawn[y == true], minlength=K).float()
        assert counts[true] == 0
        others = torch.cat([counts[:true], counts[true + 1 :]])
        # 2000 draws over 9 classes: ~222 each, binomial std ~14.
        assert torch.all((others - 2000 / (K - 1)).abs() < 70)
    again = random_labels(y, K, torch.Generator().manual_seed(0))
    assert torch.equal(drawn, again)
    # Two classes: the other one, always.
    assert torch.equal(random_labels(torch.tensor([0, 1, 1]), 2), torch.tensor([1, 0, 0]))


def test_random_label_epochs_redraw_wrong_labels_each_epoch_and_hurt_the_forget_set(
    trained, monkeypatch
):
    model, x_f, y_f = trained
    model = copy.deepcopy(model)
    seen = []

    def spy(y, num_classes, generator=None):
        labels = random_labels(y, num_classes, generator)
        seen.append(labels)
        return labels

    monkeypatch.setattr(baselines, "random_labels", spy)
    before = evaluate(model, x_f, y_f)
    last = random_label_epochs(
        model, x_f, y_f, epochs=3, lr=0.2, batch_size=16, seed=0, num_classes=K
    )
    assert len(seen) == 3
    for labels in seen:
        assert not torch.any(labels == y_f)
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    after = evaluate(model, x_f, y_f)
    assert after.accuracy < before.accuracy - 0.5
    assert after.loss > before.loss
    assert math.isfinite(last) and last > 0


def test_random_label_epochs_are_seeded(trained):
    model, x_f, y_f = trained
    kwargs = {"epochs": 1, "lr": 0.05, "batch_size": 16, "num_classes": K}
    first, second, third = (copy.deepcopy(model) for _ in range(3))
    random_label_epochs(first, x_f, y_f, seed=1, **kwargs)
    random_label_epochs(second, x_f, y_f, seed=1, **kwargs)
    random_label_epochs(third, x_f, y_f, seed=2, **kwargs)
    _assert_same(first.state_dict(), second.state_dict())
    assert not torch.equal(first.head.weight, third.head.weight)


# ---------------------------------------------------------------- hiding


def test_hide_class_redraws_only_that_row_and_is_seeded():
    model = build_dataset_model("auto", "digits", (1, 8, 8), K, seed=0)
    before = _state(model)
    hide_class(model, 4, generator=torch.Generator().manual_seed(7))
    after = _state(model)
    for name in before:
        if name.startswith("head."):
            continue
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0)
    keep = [c for c in range(K) if c != 4]
    torch.testing.assert_close(after["head.weight"][keep], before["head.weight"][keep])
    torch.testing.assert_close(after["head.bias"][keep], before["head.bias"][keep])
    assert not torch.equal(after["head.weight"][4], before["head.weight"][4])
    assert after["head.bias"][4] != before["head.bias"][4]
    bound = 1 / math.sqrt(model.head.in_features)
    assert after["head.weight"][4].abs().max() <= bound
    assert abs(after["head.bias"][4]) <= bound
    # Same generator seed, same row; another seed, another row.
    twin = build_dataset_model("auto", "digits", (1, 8, 8), K, seed=0)
    hide_class(twin, 4, generator=torch.Generator().manual_seed(7))
    _assert_same(_state(twin), after)
    other = build_dataset_model("auto", "digits", (1, 8, 8), K, seed=0)
    hide_class(other, 4, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(other.head.weight[4], after["head.weight"][4])


def test_hide_class_draws_from_the_default_linear_init():
    layer = nn.Linear(400, 3)
    model = nn.Sequential(nn.Linear(5, 400), nn.ReLU(), layer)
    hide_class(model, 2, generator=torch.Generator().manual_seed(0))
    row = layer.weight[2].detach()
    bound = 1 / math.sqrt(400)
    assert row.abs().max() <= bound
    # U(-b, b): mean 0, variance b^2 / 3 (400 draws).
    assert abs(row.mean().item()) < 0.2 * bound
    assert row.var().item() == pytest.approx(bound**2 / 3, rel=0.2)
    assert model[0].weight.shape == (400, 5)  # the last nn.Linear was used, not the first


@pytest.mark.parametrize("label", [-1, K, 2.0, "3", True])
def test_hide_class_rejects_bad_labels(label):
    model = build_dataset_model("auto", "digits", (1, 8, 8), K, seed=0)
    with pytest.raises(ConfigError) as error:
        hide_class(model, label)
    assert error.value.parameter == "label"


def test_hide_class_needs_a_linear_layer():
    with pytest.raises(ConfigError) as error:
        hide_class(nn.Sequential(nn.ReLU()), 0)
    assert error.value.parameter == "model"


# ---------------------------------------------------------------- argument checks


@pytest.mark.parametrize("function", [negative_gradient_epochs, random_label_epochs])
@pytest.mark.parametrize(
    ("override", "parameter"),
    [
        (
            {"x_forget": torch.zeros(0, 1, 8, 8), "y_forget": torch.zeros(0, dtype=torch.long)},
            "x_forget",
        ),
        ({"y_forget": torch.zeros(3, dtype=torch.long)}, "y_forget"),
        ({"y_forget": torch.full((4,), K)}, "y_forget"),
        ({"y_forget": torch.full((4,), -1)}, "y_forget"),
        ({"y_forget": torch.zeros(4)}, "y_forget"),
        ({"epochs": 0}, "epochs"),
        ({"epochs": 1.5}, "epochs"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_classes": 1}, "num_classes"),
    ],
)
def test_training_baselines_reject_bad_arguments(function, override, parameter):
    model = build_dataset_model("auto", "digits", (1, 8, 8), K, seed=0)
    before = _state(model)
    kwargs = {
        "x_forget": torch.zeros(4, 1, 8, 8),
        "y_forget": torch.tensor([0, 1, 2, 3]),
        "epochs": 1,
        "lr": 0.1,
        "batch_size": 2,
        "seed": 0,
        "num_classes": K,
    }
    kwargs.update(override)
    with pytest.raises(ConfigError) as error:
        function(model, **kwargs)
    assert error.value.parameter == parameter
    _assert_same(_state(model), before)


def test_random_labels_rejects_a_single_class():
    with pytest.raises(ConfigError) as error:
        random_labels(torch.zeros(3, dtype=torch.long), 1)
    assert error.value.parameter == "num_classes"
