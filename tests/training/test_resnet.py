"""ResNet-18, CIFAR variant (He et al. 2016): a body of 512 features under a linear head, whose
BatchNorm statistics FedAvg averages and whose features the certified head certifies.

CPU cost: the forward shapes use 32x32 CIFAR-shaped samples (a handful); training and the
certified head use 8x8 three-channel samples, which the same network takes (global average pooling
makes it resolution-agnostic) at 1/16 of the operations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.certified.certificate import CertifiedRemovalParams
from fedunlearn.certified.features import head_features
from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import one_vs_rest_targets
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.errors import ConfigError
from fedunlearn.training.local import train_epochs
from fedunlearn.training.model_state import state_difference, state_sum, weighted_average
from fedunlearn.training.models import build_model
from fedunlearn.training.stacked import build_model_stack

RESNETS = ("resnet18-cifar", "resnet18-cifar-gn")
SMALL = (3, 8, 8)


def _toy_problem(n: int, classes: int = 3, seed: int = 0):
    """Labels set by which third of the channels is brightest: learnable in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = torch.randn(n, *SMALL, generator=generator)
    x[torch.arange(n), y] += 2.0
    return x, y


@pytest.mark.parametrize("name", RESNETS)
def test_cifar_shapes_and_the_body_head_split(name):
    model = build_model(name, (3, 32, 32), 10, seed=0).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        features, logits = model.features(x), model(x)
    assert features.shape == (2, 512) and logits.shape == (2, 10)
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (512, 10)
    torch.testing.assert_close(model.head(features), logits)
    assert 11.1e6 < sum(p.numel() for p in model.parameters()) < 11.2e6  # He et al.: 11M


def test_cifar_variant_stem_is_a_stride_one_3x3_without_max_pool():
    body = build_model("resnet18-cifar", (3, 32, 32), 10).body
    stem = body[0]
    assert (stem.kernel_size, stem.stride) == ((3, 3), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in body.modules())
    convs = [m for m in body.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) == 1 + 2 * 2 * 4  # the stem and two per BasicBlock, 2 blocks x 4 stages


def test_normalisation_choice_batchnorm_buffers_or_groupnorm_none():
    bn = build_model("resnet18-cifar", SMALL, 10)
    gn = build_model("resnet18-cifar-gn", SMALL, 10)
    assert any(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    assert len(list(bn.buffers())) == 3 * 20  # mean, var, count for each of the 20 norm layers
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gn.modules())
    assert list(gn.buffers()) == []


def test_fedavg_averages_batchnorm_statistics_with_the_weights():
    start = build_model("resnet18-cifar", SMALL, 3, seed=0)
    states = []
    for client, n in enumerate((8, 16)):
        model = build_model("resnet18-cifar", SMALL, 3, seed=0)
        x, y = _toy_problem(n, seed=client)
        train_epochs(model, x + client, y, epochs=1, lr=0.01, batch_size=8, seed=client)
        states.append(model.state_dict())
    key = "body.1.running_mean"
    assert not torch.equal(states[0][key], states[1][key])  # clients' statistics differ
    average = weighted_average(states, [8, 16])
    torch.testing.assert_close(average[key], (8 * states[0][key] + 16 * states[1][key]) / 24)
    counter = "body.1.num_batches_tracked"
    assert average[counter].dtype == torch.int64
    assert int(average[counter]) == round((8 * 1 + 16 * 2) / 24)  # batches of 8: 1 and 2
    # An update U = M_k - M keeps the buffers: M + U rebuilds the client's state exactly.
    rebuilt = state_sum(start.state_dict(), state_difference(states[1], start.state_dict()))
    for name, value in states[1].items():
        torch.testing.assert_close(rebuilt[name], value, rtol=0, atol=1e-6)
    global_model = build_model("resnet18-cifar", SMALL, 3)
    global_model.load_state_dict(average)  # strict: every buffer present
    with torch.no_grad():
        assert torch.isfinite(global_model.eval()(torch.randn(2, *SMALL))).all()


@pytest.mark.parametrize("name", RESNETS)
def test_one_local_epoch_lowers_the_loss(name):
    x, y = _toy_problem(32)
    model = build_model(name, SMALL, 3, seed=0)

    def loss() -> float:
        with torch.no_grad():  # batch statistics in train mode: BN's running ones lag behind
            return float(nn.functional.cross_entropy(model.train()(x), y))

    before = loss()
    train_epochs(model, x, y, epochs=1, lr=0.002, batch_size=8, seed=0)
    assert loss() < 0.75 * before


def test_certified_head_on_resnet_features_keeps_its_certificate():
    """Guo et al.'s removal on the ResNet's features: the true gradient residual never exceeds
    the reported bound beta, which stays within the budget."""
    x, y = _toy_problem(40)
    model = build_model("resnet18-cifar", SMALL, 3, seed=0)
    features = head_features(model, x)
    assert features.shape == (40, 513)
    np.testing.assert_allclose(np.linalg.norm(features, axis=1), 1.0)
    data = CentralHeadData("logistic", features, one_vs_rest_targets(y.numpy(), [0, 1, 2]))
    head = CertifiedHead(
        data, CertifiedRemovalParams(sigma=1.0, lam=1e-2), rng=np.random.default_rng(0)
    )
    head.fit()
    for ids in ([0], [1, 2], [3]):
        certificate = head.remove(ids)
        assert certificate.certified and not certificate.retrained
        assert head.residual() <= head.beta * (1 + 1e-7) + 1e-10
        assert head.beta <= head.budget


def test_judge_stack_refuses_batchnorm_and_names_the_groupnorm_variant():
    with pytest.raises(ConfigError, match="resnet18-cifar-gn") as error:
        build_model_stack("resnet18-cifar", "cifar10", SMALL, 10, [1, 2])
    assert "60" in str(error.value) and "running_mean" in str(error.value)
    stack = build_model_stack("resnet18-cifar-gn", "cifar10", SMALL, 10, [1, 2])
    with torch.no_grad():
        assert stack(torch.randn(2, *SMALL)).shape == (2, 2, 10)


def test_resnet_needs_image_samples():
    with pytest.raises(ConfigError, match="rank 3"):
        build_model("resnet18-cifar", (100,), 2)


def test_the_cifar_setting_config_is_accepted_and_refuses_full_participation_methods(tmp_path):
    import tomllib
    from pathlib import Path

    from fedunlearn.config import ExperimentConfig

    path = Path(__file__).resolve().parents[2] / "simulations" / "cifar10_resnet18.toml"
    values = tomllib.loads(path.read_text()) | {"data-root": str(tmp_path)}
    config = ExperimentConfig.from_run_config(values)
    assert (config.model, config.num_clients, config.fraction_train) == ("resnet18-cifar", 100, 0.1)
    with pytest.raises(ConfigError) as refused:
        ExperimentConfig.from_run_config(
            values | {"retain-mode": "full", "unlearn-methods": "federaser,fedretrain,pga"}
        )
    assert refused.value.parameter == "fraction-train"


def test_flowers_fedavg_of_batchnorm_states_goes_back_in_the_sent_dtypes():
    """Flower's weighted mean turns BatchNorm's int64 counter into float64; the server rounds it
    back so that the next round's replies (int64) match the model it sends."""
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    from server.training.round_step import in_sent_dtypes

    sent = ArrayRecord(build_model("resnet18-cifar", SMALL, 3, seed=0).state_dict())
    replies = []
    for tracked, n in ((1, 8), (2, 16)):
        state = build_model("resnet18-cifar", SMALL, 3, seed=tracked).state_dict()
        state["body.1.num_batches_tracked"].fill_(tracked)
        replies.append(
            RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"n": n})})
        )
    averaged = aggregate_arrayrecords(replies, "n")
    assert averaged["body.1.num_batches_tracked"].dtype == "float64"  # Flower's own result
    fixed = in_sent_dtypes(averaged, sent)
    assert {name: (a.dtype, a.shape) for name, a in fixed.items()} == {
        name: (a.dtype, a.shape) for name, a in sent.items()
    }
    assert fixed["body.1.num_batches_tracked"].numpy().item() == round((8 * 1 + 16 * 2) / 24)
    np.testing.assert_array_equal(fixed["head.weight"].numpy(), averaged["head.weight"].numpy())
