"""A stack of N models trained at once equals N separate ``train_epochs`` runs, member by member."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.models import BodyHeadNet, build_dataset_model
from fedunlearn.training.stacked import (
    ModelStack,
    build_model_stack,
    evaluate_stack,
    member_seeds,
    train_stack_epochs,
)

# (model, dataset, sample shape): the digits CNN and the Adult MLP.
SHAPES = [("digits-cnn", "digits", (1, 8, 8)), ("adult-mlp", "adult", (12,))]


def _random_data(shape, n=70, num_classes=10, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=generator)
    y = torch.randint(0, num_classes, (n,), generator=generator)
    return x, y


def _max_difference(a: nn.Module, b: nn.Module) -> float:
    return max(
        (pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_member_seeds_are_derived_per_member_and_independent():
    seeds = member_seeds(7, 4)
    assert seeds == [derive_seed(7, "judge-model", i) for i in range(4)]
    assert len(set(seeds)) == 4
    assert member_seeds(8, 4) != seeds


def test_member_i_is_built_as_build_dataset_model_with_seed_i():
    seeds = member_seeds(0, 3)
    stack = build_model_stack("auto", "digits", (1, 8, 8), 10, seeds)
    for member, seed in zip(stack.members, seeds, strict=True):
        alone = build_dataset_model("auto", "digits", (1, 8, 8), 10, seed=seed)
        assert _max_difference(member, alone) == 0.0
    assert _max_difference(stack.members[0], stack.members[1]) > 0.0


def test_the_state_dict_is_one_ordinary_dict_of_member_tensors():
    stack = build_model_stack("adult-mlp", "adult", (12,), 2, [1, 2])
    keys = set(stack.state_dict())
    assert keys == {
        f"members.{i}.{name}"
        for i in range(2)
        for name in ("body.0.weight", "body.0.bias", "head.weight", "head.bias")
    }


@pytest.mark.parametrize(("model", "dataset", "shape"), SHAPES)
def test_a_stack_trains_exactly_as_separate_runs(model, dataset, shape):
    # 70 samples in batches of 32: the last batch of each epoch is partial (6 samples).
    x, y = _random_data(shape)
    stack = build_model_stack(model, dataset, shape, 10, member_seeds(0, 3))
    separate = [copy.deepcopy(member) for member in stack.members]
    batch_seeds = [derive_seed(0, "train", i) for i in range(3)]
    settings = dict(epochs=2, lr=0.1, batch_size=32, momentum=0.9, weight_decay=1e-2)

    losses = train_stack_epochs(stack, x, y, seeds=batch_seeds, **settings)
    expected = [
        train_epochs(member, x, y, seed=seed, **settings)
        for member, seed in zip(separate, batch_seeds, strict=True)
    ]

    assert losses == pytest.approx(expected, abs=1e-5)
    for trained, alone in zip(stack.members, separate, strict=True):
        for (name, a), (_, b) in zip(
            trained.named_parameters(), alone.named_parameters(), strict=True
        ):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
    # Training moved every member, and differently (own batches and initial weights).
    initial = build_model_stack(model, dataset, shape, 10, member_seeds(0, 3))
    assert all(
        _max_difference(a, b) > 1e-3 for a, b in zip(stack.members, initial.members, strict=True)
    )


def test_members_with_the_same_init_but_other_batch_seeds_diverge():
    x, y = _random_data((1, 8, 8))
    stack = build_model_stack("digits-cnn", "digits", (1, 8, 8), 10, [3, 3])
    train_stack_epochs(stack, x, y, epochs=1, lr=0.1, batch_size=16, seeds=[1, 2])
    assert _max_difference(stack.members[0], stack.members[1]) > 1e-4


@pytest.mark.parametrize(("model", "dataset", "shape"), SHAPES)
def test_forward_equals_each_members_own_forward(model, dataset, shape):
    x, _ = _random_data(shape, n=9)
    stack = build_model_stack(model, dataset, shape, 10, [4, 5, 6])
    logits = stack(x)
    assert logits.shape == (3, 9, 10)
    for index, member in enumerate(stack.members):
        torch.testing.assert_close(logits[index], member(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(stack.logits(x, batch_size=4), logits.detach(), atol=1e-6, rtol=0)


def test_forward_gradients_reach_the_members():
    stack = build_model_stack("adult-mlp", "adult", (12,), 2, [1, 2])
    stack(torch.randn(5, 12))[1].sum().backward()
    assert stack.members[0].head.weight.grad is None or not stack.members[0].head.weight.grad.any()
    assert stack.members[1].head.weight.grad.abs().sum() > 0


def test_member_states_round_trip():
    stack = build_model_stack("digits-cnn", "digits", (1, 8, 8), 10, [1, 2, 3])
    states = stack.member_states()
    other = build_model_stack("digits-cnn", "digits", (1, 8, 8), 10, [7, 8, 9])
    assert _max_difference(other.members[0], stack.members[0]) > 0
    other.load_member_states(states)
    for a, b in zip(other.members, stack.members, strict=True):
        assert _max_difference(a, b) == 0.0
    # member_states are copies: changing one leaves the stack untouched.
    states[0]["head.bias"].add_(1.0)
    assert not torch.equal(stack.members[0].head.bias, states[0]["head.bias"])
    with pytest.raises(ConfigError, match="states"):
        other.load_member_states(states[:2])


def test_evaluate_stack_equals_evaluate_per_member():
    x, y = _random_data((12,), n=50, num_classes=2)
    stack = build_model_stack("adult-mlp", "adult", (12,), 2, [1, 2, 3])
    results = evaluate_stack(stack, x, y, batch_size=16)
    for result, member in zip(results, stack.members, strict=True):
        alone = evaluate(member, x, y)
        assert result.num_examples == alone.num_examples == 50
        assert result.accuracy == pytest.approx(alone.accuracy)
        assert result.loss == pytest.approx(alone.loss, abs=1e-6)


def test_bad_inputs_name_the_parameter():
    stack = build_model_stack("adult-mlp", "adult", (12,), 2, [1, 2])
    x, y = _random_data((12,), n=10, num_classes=2)
    settings = dict(epochs=1, lr=0.1, batch_size=4)
    with pytest.raises(ConfigError, match="seeds") as caught:
        train_stack_epochs(stack, x, y, seeds=[1, 2, 3], **settings)
    assert caught.value.parameter == "seeds"
    with pytest.raises(ConfigError) as caught:
        train_stack_epochs(stack, x[:0], y[:0], seeds=[1, 2], **settings)
    assert caught.value.parameter == "x"
    with pytest.raises(ConfigError) as caught:
        build_model_stack("adult-mlp", "adult", (12,), 2, [])
    assert caught.value.parameter == "seeds"
    with pytest.raises(ConfigError) as caught:
        member_seeds(0, 0)
    assert caught.value.parameter == "judge-models"


def test_a_model_with_buffers_is_refused():
    body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    with pytest.raises(ConfigError, match="buffers"):
        ModelStack([BodyHeadNet(body, 8, 2)])


def test_members_of_different_architectures_are_refused():
    a = build_dataset_model("adult-mlp", "adult", (12,), 2, seed=1)
    b = build_dataset_model("adult-mlp", "adult", (13,), 2, seed=1)
    with pytest.raises(ConfigError, match=r"members\[1\]"):
        ModelStack([a, b])


def test_a_body_without_a_batched_formulation_trains_through_vmap_equally():
    # Tanh has no batched rule in the stack, so the whole body runs under vmap(functional_call).
    def member(seed):
        torch.manual_seed(seed)
        return BodyHeadNet(nn.Sequential(nn.Linear(12, 16), nn.Tanh()), 16, 3)

    stack = ModelStack([member(1), member(2)])
    separate = [copy.deepcopy(m) for m in stack.members]
    x, y = _random_data((12,), n=37, num_classes=3)
    settings = dict(epochs=2, lr=0.1, batch_size=8, momentum=0.5, weight_decay=1e-3)
    train_stack_epochs(stack, x, y, seeds=[3, 4], **settings)
    for trained, alone, seed in zip(stack.members, separate, [3, 4], strict=True):
        train_epochs(alone, x, y, seed=seed, **settings)
        assert _max_difference(trained, alone) < 1e-5
