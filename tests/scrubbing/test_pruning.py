"""Class-discriminative pruning (Wang et al., WWW 2022): the clients' per-class activations
(eqs. 2-3), TF-IDF (eqs. 4-6), the forgotten class's top channels, and pruning them (eq. 7) so the
output no longer depends on them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.pruning import (
    class_channel_sums,
    discriminative_channels,
    global_mean_activations,
    prune_channels,
    pruned_count,
    pruning_layer,
    select_channels,
    tf_idf,
)
from fedunlearn.training.local import train_epochs
from fedunlearn.training.models import BodyHeadNet, build_model
from fedunlearn.training.stacked import build_model_stack

SHAPES = {"digits-cnn": (1, 8, 8), "mnist-cnn": (1, 28, 28), "adult-mlp": (20,)}


def _model(name: str, seed: int = 0) -> BodyHeadNet:
    return build_model(name, SHAPES[name], 10, seed=seed)


# ---------------------------------------------------------------- which layer
@pytest.mark.parametrize(
    "name, which, layer, next_layer, channels",
    [
        ("digits-cnn", "features", "body.4", "head", 64),
        ("mnist-cnn", "features", "body.7", "head", 500),
        ("adult-mlp", "features", "body.0", "head", 64),
        ("digits-cnn", "last-conv", "body.0", "body.4", 16),
        ("mnist-cnn", "last-conv", "body.3", "body.7", 50),
        ("adult-mlp", "last-conv", "body.0", "head", 64),  # no convolution: its features
    ],
)
def test_the_pruned_layer_is_the_feature_layer_or_the_last_convolution(
    name, which, layer, next_layer, channels
):
    found = pruning_layer(_model(name), which)
    assert (found.name, found.next_name, found.channels) == (layer, next_layer, channels)
    with pytest.raises(ConfigError, match="prune-layer"):
        pruning_layer(_model(name), "first-conv")


# ---------------------------------------------------------------- local processing (eqs. 2, 3)
def test_class_sums_are_relu_then_spatial_mean_of_the_conv_output_summed_per_class():
    model = _model("digits-cnn")
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(50, 1, 8, 8, generator=generator)
    y = torch.randint(0, 10, (50,), generator=generator)
    y[0] = 9  # at least one sample of the top class; class 0 may be absent: its row must be 0
    sums, counts = class_channel_sums(model, x, y, 10, layer="body.0", batch_size=7)
    pooled = torch.relu(model.body[0](x)).mean(dim=(2, 3)).double()  # A_l, one row per sample
    for u in range(10):
        torch.testing.assert_close(sums[u], pooled[y == u].sum(dim=0))
        assert counts[u] == int((y == u).sum())
    assert sums.dtype == torch.float64 and counts.dtype == torch.int64
    assert model.training  # the model's mode is given back


def test_clients_sums_add_up_to_the_mean_over_all_their_samples():
    model = _model("adult-mlp")
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(90, 20, generator=generator), torch.randint(0, 4, (90,), generator=generator)
    parts = [class_channel_sums(model, x[i::3], y[i::3], 4) for i in range(3)]
    total = sum(p[0] for p in parts), sum(p[1] for p in parts)
    means, present = global_mean_activations(*total)
    pooled = torch.relu(model.body[0](x)).double().detach()
    assert present == [0, 1, 2, 3]
    for u in present:
        torch.testing.assert_close(means[u], pooled[y == u].mean(dim=0))


def test_a_class_no_client_holds_is_left_out_and_cannot_be_the_forgotten_one():
    sums = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]])
    counts = torch.tensor([2, 0, 1])
    means, present = global_mean_activations(sums, counts)
    assert present == [0, 2]
    torch.testing.assert_close(means, torch.tensor([[0.5, 1.0], [3.0, 1.0]], dtype=torch.float64))
    with pytest.raises(ConfigError, match="scrub-forget"):
        select_channels(sums, counts, 1, 0.5)


# ---------------------------------------------------------------- TF-IDF (eqs. 4-6)
def test_tf_idf_matches_a_hand_computed_example():
    # Class rows; a channel "occurs" in a class when it is >= that row's mean over channels.
    # class 0 (mean 4/3): channel 0; class 1 (mean 4/3): channel 2; class 2 (mean 1): all three.
    # Occurrences per channel: 2, 1, 2 -> IDF = log(4/3), log(4/2), log(4/3).
    a = torch.tensor([[2.0, 1.0, 1.0], [1.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    low, high = math.log(4 / 3), math.log(2)
    expected = torch.tensor(
        [
            [0.5 * low, 0.25 * high, 0.25 * low],
            [0.25 * low, 0.25 * high, 0.5 * low],
            [low / 3, high / 3, low / 3],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(tf_idf(a), expected)
    # The rare channel wins class 0 although its term frequency is half channel 0's.
    assert discriminative_channels(tf_idf(a), 0, 0.3) == [1]


def test_a_class_that_activates_nothing_scores_zero_everywhere():
    a = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    scores = tf_idf(a)
    assert torch.equal(scores[1], torch.zeros(2, dtype=torch.float64))
    assert torch.isfinite(scores).all()


def test_a_channel_that_fires_only_for_the_forgotten_class_ranks_first():
    """End to end in the core: a network whose hidden unit 4 reads only class 3's input feature;
    every other unit fires for every class. The clients' sums, TF-IDF and selection put unit 4
    first for class 3, and not first for another class."""
    body = nn.Sequential(nn.Linear(5, 6), nn.ReLU())
    model = BodyHeadNet(body, 6, 5)
    with torch.no_grad():
        body[0].weight.copy_(torch.rand(6, 5, generator=torch.Generator().manual_seed(3)) + 0.5)
        body[0].weight[4] = torch.tensor([0.0, 0.0, 0.0, 0.4, 0.0])
        body[0].bias.zero_()
    generator = torch.Generator().manual_seed(4)
    y = torch.arange(200) % 5
    x = nn.functional.one_hot(y, 5).float() + 0.05 * torch.rand(200, 5, generator=generator)
    x[:, 3] = torch.where(y == 3, x[:, 3], torch.zeros(()))  # feature 3 only in class 3
    clients = [class_channel_sums(model, x[i::4], y[i::4], 5) for i in range(4)]
    sums, counts = sum(c[0] for c in clients), sum(c[1] for c in clients)
    channels, scores = select_channels(sums, counts, 3, 0.2)
    assert channels[0] == 4 and len(channels) == pruned_count(6, 0.2) == 2
    assert scores.argmax() == 4
    assert select_channels(sums, counts, 0, 0.2)[0][0] != 4


# ---------------------------------------------------------------- pruning (eq. 7)
@pytest.mark.parametrize(
    "name, which", [(name, "features") for name in SHAPES] + [("digits-cnn", "last-conv"),
                                                              ("mnist-cnn", "last-conv")]
)  # fmt: skip
def test_pruning_removes_exactly_the_channels_contribution_to_the_output(name, which):
    model = _model(name)
    layer = pruning_layer(model, which)
    state = {k: v.clone() for k, v in model.state_dict().items()}  # loading below overwrites it
    pruned = prune_channels(state, [2, 5], layer.name, layer.next_name)
    x = torch.randn(16, *SHAPES[name], generator=torch.Generator().manual_seed(5))

    def output(s):
        model.load_state_dict(s)
        with torch.no_grad():
            return model(x)

    reference = output(pruned)
    for channel, changes in ((2, False), (5, False), (3, True)):
        perturbed = {k: v.clone() for k, v in pruned.items()}
        perturbed[f"{layer.name}.weight"][channel] += 3.0  # the channel's input weights
        perturbed[f"{layer.name}.bias"][channel] += 1.0
        moved = not torch.allclose(output(perturbed), reference)
        assert moved == changes, (name, channel)
    # Nothing else was touched: every other entry is the original's.
    for key, value in state.items():
        differs = pruned[key] != value
        if key in (f"{layer.name}.weight", f"{layer.name}.bias"):
            rows = differs.reshape(len(differs), -1).any(1).nonzero().flatten().tolist()
            assert rows == [2, 5]
        elif key == f"{layer.next_name}.weight":
            block = value.shape[1] // layer.channels
            columns = differs.any(0).nonzero().flatten().tolist()
            assert columns == [*range(2 * block, 3 * block), *range(5 * block, 6 * block)]
            assert (pruned[key][:, columns] == 0).all()
        else:
            assert not differs.any(), key


@pytest.mark.parametrize("which", ["features", "last-conv"])
def test_sgd_fine_tuning_keeps_a_pruned_channel_pruned(which):
    """Its activation and outgoing weights are 0, so every gradient reaching them is 0: weight
    decay and momentum included, training cannot revive it (the paper's masked back-propagation)."""
    model = _model("digits-cnn")
    layer = pruning_layer(model, which)
    model.load_state_dict(prune_channels(model.state_dict(), [7], layer.name, layer.next_name))
    generator = torch.Generator().manual_seed(6)
    x, y = torch.randn(64, 1, 8, 8, generator=generator), torch.randint(0, 10, (64,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train_epochs(model, x, y, epochs=2, lr=0.1, batch_size=16, seed=0, momentum=0.9,
                 weight_decay=1e-3)  # fmt: skip
    after = model.state_dict()
    weight, bias, following = (f"{layer.name}.weight", f"{layer.name}.bias",
                               f"{layer.next_name}.weight")  # fmt: skip
    block = after[following].shape[1] // layer.channels
    assert (after[weight][7] == 0).all() and after[bias][7] == 0
    assert (after[following][:, 7 * block : 8 * block] == 0).all()
    assert not torch.equal(after[weight][6], before[weight][6])  # the other channels train


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("ratio", [0, 0.0, 1, 1.0, -0.1, 1.5, float("nan"), "0.1", None])
def test_a_ratio_outside_the_open_unit_interval_is_refused(ratio):
    with pytest.raises(ConfigError, match="prune-ratio"):
        discriminative_channels(torch.rand(3, 8), 0, ratio)


@pytest.mark.parametrize("forgotten", [-1, 3, True, 1.0])
def test_a_class_outside_the_scores_is_refused(forgotten):
    with pytest.raises(ConfigError, match="forgotten_class"):
        discriminative_channels(torch.rand(3, 8), forgotten, 0.2)


def test_the_pruned_count_rounds_up_and_leaves_a_channel():
    assert [pruned_count(50, r) for r in (0.05, 0.1, 0.5, 0.99)] == [3, 5, 25, 49]
    assert pruned_count(16, 0.01) == 1


def test_bad_activations_channels_and_stacks_are_refused():
    with pytest.raises(ConfigError, match="mean_activations"):
        tf_idf(torch.tensor([[1.0, -0.5], [1.0, 1.0]]))
    with pytest.raises(ConfigError, match="mean_activations"):
        tf_idf(torch.tensor([[1.0, float("nan")], [1.0, 1.0]]))
    with pytest.raises(ConfigError, match="mean_activations"):
        tf_idf(torch.tensor([[1.0, 2.0]]))  # one class: nothing to discriminate
    model = _model("digits-cnn")
    with pytest.raises(ConfigError, match="channels"):
        prune_channels(model.state_dict(), [16], "body.0", "body.4")
    with pytest.raises(ConfigError, match="layer"):
        prune_channels(model.state_dict(), [1], "body.9", "body.4")
    stack = build_model_stack("digits-cnn", "digits", (1, 8, 8), 10, [0, 1, 2])
    with pytest.raises(ConfigError, match="judge-models"):
        prune_channels(stack.state_dict(), [1], "body.0", "body.4")
    with pytest.raises(ConfigError, match="judge-models"):
        class_channel_sums(stack, torch.randn(4, 1, 8, 8), torch.zeros(4), 10)


# ---------------------------------------------------------------- why the feature layer
def test_on_a_trained_network_the_feature_units_carry_the_class_and_the_convolution_does_not():
    """The default ``prune-layer``: on a digits-cnn trained centrally, pruning 30 % of class 3's
    most discriminative feature units, then one epoch of fine-tuning on D_r, makes class 3
    unrecognisable and the other classes recognised; the same with the (only, shallow)
    convolution's channels leaves class 3 mostly recognised."""
    from fedunlearn.data.datasets import load_dataset
    from fedunlearn.training.local import evaluate

    splits = load_dataset("digits", "")
    train, test = splits.train, splits.test
    model = build_model("digits-cnn", tuple(splits.input_shape), 10, seed=0)
    train_epochs(model, train.x, train.y, epochs=5, lr=0.05, batch_size=32, seed=0, momentum=0.9)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    three, kept = test.y == 3, train.y != 3

    def accuracies(which):
        layer = pruning_layer(model, which)
        model.load_state_dict(trained)
        sums, counts = class_channel_sums(model, train.x, train.y, 10, layer=layer.name)
        channels, _ = select_channels(sums, counts, 3, 0.3)
        model.load_state_dict(prune_channels(trained, channels, layer.name, layer.next_name))
        train_epochs(model, train.x[kept], train.y[kept], epochs=1, lr=0.05, batch_size=32,
                     seed=1, momentum=0.9)  # fmt: skip
        return (
            evaluate(model, test.x[three], test.y[three]).accuracy,
            evaluate(model, test.x[~three], test.y[~three]).accuracy,
        )

    model.load_state_dict(trained)
    assert evaluate(model, test.x[three], test.y[three]).accuracy > 0.9
    original_others = evaluate(model, test.x[~three], test.y[~three]).accuracy
    forgotten, others = accuracies("features")
    assert forgotten < 0.1 and others > original_others - 0.02
    assert accuracies("last-conv")[0] > 0.5  # far from forgotten (error >= 90 %)
