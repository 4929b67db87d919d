"""FedAU (Gu et al., IJCAI 2024): auxiliary targets, the auxiliary head, the linear unlearning."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fedunlearn.unlearning.fedau as fedau
from fedunlearn.errors import ConfigError
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.model_state import weighted_average
from fedunlearn.training.models import BodyHeadNet
from fedunlearn.unlearning.fedau import (
    auxiliary_nbytes,
    auxiliary_targets,
    class_auxiliary_targets,
    fedau_joint_epochs,
    fedau_unlearn,
    initial_auxiliary_head,
    keep_auxiliary,
    train_auxiliary_head,
)


def _linear_net(weight: list[list[float]], bias: list[float]) -> BodyHeadNet:
    net = BodyHeadNet(nn.Identity(), len(weight[0]), len(weight))
    with torch.no_grad():
        net.head.weight.copy_(torch.tensor(weight))
        net.head.bias.copy_(torch.tensor(bias))
    return net


def test_auxiliary_targets_keep_true_labels_and_never_give_the_true_label_to_forgotten_ones():
    y = torch.randint(0, 5, (200,), generator=torch.Generator().manual_seed(0))
    forget = torch.arange(200) % 3 == 0
    aux = auxiliary_targets(y, 5, forget, generator=torch.Generator().manual_seed(1))
    assert torch.equal(aux[~forget], y[~forget])
    assert (aux[forget] != y[forget]).all() and aux.min() >= 0 and aux.max() < 5
    # Two classes: the only other label is the flipped one; client level forgets every sample.
    y2 = torch.tensor([0, 1, 1, 0])
    assert torch.equal(auxiliary_targets(y2, 2), torch.tensor([1, 0, 0, 1]))
    assert torch.equal(class_auxiliary_targets(y2, 1, 2), torch.ones(4, dtype=torch.long))
    with pytest.raises(ConfigError, match="forget"):
        auxiliary_targets(y2, 2, torch.tensor([1, 0, 1, 0]))
    with pytest.raises(ConfigError, match="forget_class"):
        class_auxiliary_targets(y2, 2, 2)


def test_one_sgd_step_of_the_auxiliary_head_matches_the_hand_computation():
    # phi = (1, 2), W = 0, b = 0: p = (1/2, 1/2); target 1: p - e_1 = (1/2, -1/2).
    # grad W = (p - e) phi^T = [[1/2, 1], [-1/2, -1]], grad b = (1/2, -1/2); lr = 1.
    net = _linear_net([[0.0, 0.0], [0.0, 0.0]], [0.0, 0.0])
    before = {k: v.clone() for k, v in net.state_dict().items()}
    aux = train_auxiliary_head(
        net, torch.tensor([[1.0, 2.0]]), torch.tensor([1]), epochs=1, lr=1.0, batch_size=1, seed=0
    )
    assert torch.allclose(aux["weight"], torch.tensor([[-0.5, -1.0], [0.5, 1.0]]))
    assert torch.allclose(aux["bias"], torch.tensor([-0.5, 0.5]))
    # The client's model is left as it was: only W_a is trained.
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_each_round_starts_from_the_gamma_blend_of_the_head_and_the_previous_auxiliary_head():
    net = _linear_net([[4.0, 0.0], [0.0, 4.0]], [8.0, 0.0])
    previous = {"weight": torch.zeros(2, 2), "bias": torch.tensor([0.0, 4.0])}
    start = initial_auxiliary_head(net.head, previous, gamma=0.25)  # 0.75 W + 0.25 W_a^prev
    assert torch.allclose(start["weight"], torch.tensor([[3.0, 0.0], [0.0, 3.0]]))
    assert torch.allclose(start["bias"], torch.tensor([6.0, 1.0]))
    assert torch.equal(initial_auxiliary_head(net.head)["weight"], net.head.weight)
    with pytest.raises(ConfigError, match="gamma"):
        initial_auxiliary_head(net.head, previous, gamma=1.5)


def _hand_kept():
    return {
        "a": {"weight": torch.tensor([[0.0, 0.0], [2.0, 2.0]]), "bias": torch.tensor([1.0, 1.0])},
        "b": {"weight": torch.tensor([[4.0, 0.0], [0.0, 4.0]]), "bias": torch.tensor([-1.0, 3.0])},
    }


def test_the_linear_operation_on_a_two_class_two_feature_toy_by_hand():
    final = {
        "body.scale": torch.tensor([7.0]),
        "head.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "head.bias": torch.tensor([0.5, -0.5]),
    }
    # mean W_a = [[2, 0], [1, 3]], mean b_a = [0, 2]; alpha = 1/2: W_u = (W + mean W_a) / 2.
    out = fedau_unlearn(final, _hand_kept(), ["a", "b"], alpha=0.5)
    assert torch.allclose(out["head.weight"], torch.tensor([[1.5, 1.0], [2.0, 3.5]]))
    assert torch.allclose(out["head.bias"], torch.tensor([0.25, 0.75]))
    assert torch.equal(out["body.scale"], final["body.scale"])
    # Class level: W - mean W_a = [[-1, 2], [2, 1]], b - mean b_a = [0.5, -2.5].
    sub = fedau_unlearn(final, _hand_kept(), ["b", "a"], operation="subtract")
    assert torch.allclose(sub["head.weight"], torch.tensor([[-1.0, 2.0], [2.0, 1.0]]))
    assert torch.allclose(sub["head.bias"], torch.tensor([0.5, -2.5]))
    # One target, code default alpha = 0.9: W_u = 0.1 W + 0.9 W_a^a.
    one = fedau_unlearn(final, _hand_kept(), ["a"])
    assert torch.allclose(one["head.weight"], torch.tensor([[0.1, 0.2], [2.1, 2.2]]))
    # Forgetting nobody returns the model unchanged (a copy).
    same = fedau_unlearn(final, _hand_kept(), [])
    assert all(torch.equal(same[k], final[k]) and same[k] is not final[k] for k in final)


def test_the_operation_is_linear_in_the_final_model_and_the_kept_heads():
    g = torch.Generator().manual_seed(3)

    def draw():
        state = {
            "head.weight": torch.randn(3, 4, generator=g),
            "head.bias": torch.randn(3, generator=g),
        }
        kept = {
            c: {"weight": torch.randn(3, 4, generator=g), "bias": torch.randn(3, generator=g)}
            for c in (0, 1, 2)
        }
        return state, kept

    (s1, k1), (s2, k2) = draw(), draw()
    lam, mu = 0.7, -2.3
    s = {n: lam * s1[n] + mu * s2[n] for n in s1}
    k = {c: {n: lam * k1[c][n] + mu * k2[c][n] for n in k1[c]} for c in k1}
    for operation in ("combine", "subtract"):
        f = fedau_unlearn(s, k, [0, 2], alpha=0.3, operation=operation)
        f1 = fedau_unlearn(s1, k1, [0, 2], alpha=0.3, operation=operation)
        f2 = fedau_unlearn(s2, k2, [0, 2], alpha=0.3, operation=operation)
        for n in f:
            assert torch.allclose(f[n], lam * f1[n] + mu * f2[n], atol=1e-5)


def test_bad_requests_are_refused_with_the_parameter_named():
    final = {"head.weight": torch.zeros(2, 2), "head.bias": torch.zeros(2)}
    with pytest.raises(ConfigError, match="targets"):
        fedau_unlearn(final, _hand_kept(), ["c"])
    with pytest.raises(ConfigError, match="alpha"):
        fedau_unlearn(final, _hand_kept(), ["a"], alpha=1.2)
    with pytest.raises(ConfigError, match="operation"):
        fedau_unlearn(final, _hand_kept(), ["a"], operation="average")
    with pytest.raises(ConfigError, match="head"):
        fedau_unlearn(final, _hand_kept(), ["a"], head="classifier")
    with pytest.raises(ConfigError, match="kept"):
        fedau_unlearn(final, {"a": {"weight": torch.zeros(3, 2), "bias": torch.zeros(3)}}, ["a"])


def test_keeping_replaces_a_clients_head_and_a_head_costs_k_times_d_plus_k_floats():
    kept = keep_auxiliary({}, _hand_kept())
    newer = {"weight": torch.ones(2, 2), "bias": torch.ones(2)}
    kept = keep_auxiliary(kept, {"a": newer})
    assert torch.equal(kept["a"]["weight"], torch.ones(2, 2)) and torch.equal(
        kept["b"]["bias"], torch.tensor([-1.0, 3.0])
    )
    head = {"weight": torch.zeros(10, 64), "bias": torch.zeros(10)}  # digits-cnn: K = 10, d = 64
    assert auxiliary_nbytes(head) == (10 * 64 + 10) * 4 == 2600


def test_joint_training_moves_the_model_and_returns_a_seeded_auxiliary_head():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, generator=g), torch.randint(0, 2, (32,), generator=g)
    results = []
    for _ in range(2):
        torch.manual_seed(5)
        net = BodyHeadNet(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), 4, 2)
        start = {k: v.clone() for k, v in net.state_dict().items()}
        loss, aux = fedau_joint_epochs(
            net, x, y, auxiliary_targets(y, 2), epochs=2, lr=0.1, batch_size=8, seed=1
        )
        assert torch.isfinite(torch.tensor(loss)) and not torch.equal(
            start["body.0.weight"], net.body[0].weight
        )
        results.append(aux)
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def _toy_clients():
    """Clients 1, 2: the label is the sign of x1. Client 0 holds backdoor-like data: a trigger
    feature of 6 and label 0 whatever x1 (the authors' client-level experiment). With a trigger of 4
    the others lose ~7 points: W_a trained on flipped labels also shrinks the x1 weights."""
    g = torch.Generator().manual_seed(0)
    clients = {}
    for cid in (0, 1, 2):
        x = torch.randn(60, 3, generator=g)
        x[:, 2] = 6.0 if cid == 0 else 0.0
        y = torch.zeros(60, dtype=torch.long) if cid == 0 else (x[:, 0] > 0).long()
        clients[cid] = (x, y)
    return clients


def test_forgetting_a_client_drops_its_accuracy_only_with_no_client_computation(monkeypatch):
    clients = _toy_clients()
    torch.manual_seed(0)
    global_model = BodyHeadNet(nn.Identity(), 3, 2)
    kept: dict = {}
    for rnd in range(8):
        states, replies = [], {}
        for cid, (x, y) in clients.items():
            local = BodyHeadNet(nn.Identity(), 3, 2)
            local.load_state_dict(global_model.state_dict())
            train_epochs(local, x, y, epochs=2, lr=0.5, batch_size=20, seed=100 * rnd + cid)
            y_aux = auxiliary_targets(y, 2, generator=torch.Generator().manual_seed(cid))
            replies[cid] = train_auxiliary_head(
                local, x, y_aux, epochs=2, lr=0.1, batch_size=20, seed=rnd, previous=kept.get(cid)
            )
            states.append(local.state_dict())
        global_model.load_state_dict(weighted_average(states, [60, 60, 60]))
        kept = keep_auxiliary(kept, replies)
    before = {cid: evaluate(global_model, *clients[cid]).accuracy for cid in clients}
    assert min(before.values()) > 0.9

    def no_client_work(*args, **kwargs):
        raise AssertionError("client computation at request time")

    monkeypatch.setattr(fedau, "train_epochs", no_client_work)
    monkeypatch.setattr(fedau, "train_auxiliary_head", no_client_work)
    unlearned = BodyHeadNet(nn.Identity(), 3, 2)
    unlearned.load_state_dict(fedau_unlearn(global_model.state_dict(), kept, [0]))
    after = {cid: evaluate(unlearned, *clients[cid]).accuracy for cid in clients}
    assert after[0] < 0.2
    assert after[1] >= before[1] - 0.05 and after[2] >= before[2] - 0.05


def test_the_client_trains_its_auxiliary_head_with_the_runs_momentum_and_weight_decay():
    # The authors train W_a with the model's optimiser (SGD, momentum 0.9, weight decay 5e-4);
    # the client's head must be the core's with the run's momentum and weight decay, not plain SGD.
    from types import SimpleNamespace

    from clients.objectives import auxiliary_head
    from fedunlearn.seeding import derive_seed
    from fedunlearn.store.retention import AUXILIARY_REQUEST

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=generator), torch.randint(0, 4, (40,), generator=generator)
    net = BodyHeadNet(nn.Identity(), 3, 4)
    setup = SimpleNamespace(
        config=SimpleNamespace(training_seed=7, weight_decay=0.0), partition_id=2, num_classes=4
    )
    config = {AUXILIARY_REQUEST: 3, "weight-decay": 0.01, "server-round": 5}
    settings = {"lr": 0.1, "momentum": 0.9, "batch_size": 8, "device": "cpu"}
    sent = torch.tensor(auxiliary_head(net, x, y, config, setup, settings))

    labels = torch.Generator().manual_seed(derive_seed(7, "fedau-labels", 2))
    y_aux = auxiliary_targets(y, 4, generator=labels)

    def head(momentum, weight_decay):
        out = train_auxiliary_head(
            net,
            x,
            y_aux,
            epochs=3,
            lr=0.1,
            batch_size=8,
            seed=derive_seed(7, "fedau", 5, 2),
            gamma=0.0,
            momentum=momentum,
            weight_decay=weight_decay,
        )
        return torch.cat([out["weight"].flatten(), out["bias"].flatten()])

    assert torch.allclose(sent, head(0.9, 0.01), atol=1e-6)
    assert not torch.allclose(sent, head(0.0, 0.0), atol=1e-3)
    assert not torch.allclose(sent, head(0.9, 0.0), atol=1e-5)
