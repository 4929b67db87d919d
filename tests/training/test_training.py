"""Local training learns and is reproducible per seed; model-state arithmetic is exact."""

from __future__ import annotations

import torch

from fedunlearn.data.datasets import load_dataset
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.model_state import (
    state_difference,
    state_norm,
    state_sum,
    weighted_average,
)
from fedunlearn.training.models import build_model


def _digits_model_and_data():
    data = load_dataset("digits", seed=0)
    model = build_model("digits-cnn", data.input_shape, data.num_classes, seed=0)
    return model, data


def test_training_learns_digits():
    model, data = _digits_model_and_data()
    before = evaluate(model, data.test.x, data.test.y)
    train_epochs(
        model, data.train.x, data.train.y, epochs=3, lr=0.05, momentum=0.9, batch_size=32, seed=1
    )
    after = evaluate(model, data.test.x, data.test.y)
    assert before.accuracy < 0.3
    assert after.accuracy > 0.85 and after.loss < before.loss


def test_same_seed_same_model_different_seed_different():
    def trained(seed):
        model, data = _digits_model_and_data()
        train_epochs(
            model,
            data.train.x[:300],
            data.train.y[:300],
            epochs=1,
            lr=0.05,
            batch_size=16,
            seed=seed,
        )
        return model.state_dict()

    a, b, c = trained(3), trained(3), trained(4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["head.weight"], c["head.weight"])


def test_update_arithmetic_rebuilds_the_client_model():
    base = {"w": torch.randn(3, 4), "steps": torch.tensor(5)}
    client = {"w": torch.randn(3, 4), "steps": torch.tensor(9)}
    update = state_difference(client, base)
    rebuilt = state_sum(base, update)
    assert torch.equal(rebuilt["steps"], client["steps"])
    assert torch.allclose(rebuilt["w"], client["w"])
    assert abs(state_norm({"w": torch.tensor([3.0, 4.0])}) - 5.0) < 1e-12


def test_weighted_average_uses_num_examples_as_weights():
    a, b = {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([4.0, 6.0])}
    avg = weighted_average([a, b], [1, 3])
    assert torch.allclose(avg["w"], torch.tensor([3.0, 5.0]))
