"""Rapid retraining (Liu, Xu, Yuan, Wang, Li, INFOCOM 2022): the diagonal empirical FIM against
per-sample gradients written out by hand for a softmax-linear model, the FIM-momentum step against
2-3 numbers worked out by hand, and the local optimiser on a badly conditioned toy problem."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.training.local import train_epochs
from fedunlearn.unlearning.rapid_retraining import (
    FisherMomentum,
    diagonal_fisher,
    fisher_step,
    rapid_retraining_epochs,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tensors of a few hundred numbers: a second intra-op thread only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _zero_linear(inputs: int = 2, classes: int = 2) -> nn.Linear:
    layer = nn.Linear(inputs, classes)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    return layer


def _badly_conditioned(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Two features of scales 10 and 0.1 (curvature ratio 10^4); the label needs both."""
    z = torch.randn(n, 2, generator=torch.Generator().manual_seed(0))
    return z * torch.tensor([10.0, 0.1]), (z[:, 0] + z[:, 1] > 0).long()


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x), y).item()


# --- diagonal_fisher ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_diagonal_fisher_is_the_mean_of_squared_per_sample_gradients_by_hand(batch_size):
    # W = 0, b = 0: softmax p = (1/2, 1/2) for any x. d CE / d logits = p - e_y, so
    # sample 1 (x = (1, 2), y = 0): p - e_0 = (-1/2, 1/2), dW = [[-1/2, -1], [1/2, 1]], db = (-1/2, 1/2);
    # sample 2 (x = (3, -1), y = 1): p - e_1 = (1/2, -1/2), dW = [[3/2, -1/2], [-3/2, 1/2]],
    # db = (1/2, -1/2). Mean of squares: W [[(1/4 + 9/4)/2, (1 + 1/4)/2], same], b (1/4, 1/4).
    model = _zero_linear()
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    y = torch.tensor([0, 1])
    fisher = diagonal_fisher(model, x, y, batch_size=batch_size)
    assert set(fisher) == {"weight", "bias"}
    torch.testing.assert_close(fisher["weight"], torch.tensor([[1.25, 0.625], [1.25, 0.625]]))
    torch.testing.assert_close(fisher["bias"], torch.tensor([0.25, 0.25]))
    assert torch.count_nonzero(model.weight) == 0  # the model is not changed


def test_diagonal_fisher_is_not_the_square_of_the_mean_gradient():
    # The same two samples: their mean bias gradient is (0, 0), yet the FIM is (1/4, 1/4).
    model = _zero_linear()
    x, y = torch.tensor([[1.0, 2.0], [3.0, -1.0]]), torch.tensor([0, 1])
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(model.bias.grad, torch.zeros(2))
    assert diagonal_fisher(model, x, y, batch_size=2)["bias"].min().item() == pytest.approx(0.25)


def test_diagonal_fisher_of_a_network_matches_a_loop_over_samples():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3))
    x, y = torch.randn(7, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    expected = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for n, p in model.named_parameters():
            expected[n] += p.grad.square() / len(x)
    fisher = diagonal_fisher(model, x, y, batch_size=3)
    for name, value in expected.items():
        torch.testing.assert_close(fisher[name], value)


def test_diagonal_fisher_refuses_bad_input():
    model = _zero_linear()
    x, y = torch.ones(2, 2), torch.tensor([0, 1])
    with pytest.raises(ConfigError, match="batch_size"):
        diagonal_fisher(model, x, y, batch_size=0)
    with pytest.raises(ConfigError, match="y"):
        diagonal_fisher(model, x, torch.tensor([0]), batch_size=1)
    with pytest.raises(ConfigError, match="x"):
        diagonal_fisher(model, x[:0], y[:0], batch_size=1)


# --- fisher_step --------------------------------------------------------------------------------


def test_fisher_step_two_steps_by_hand():
    # Step 1 (t = 1): m = 0.1 * 2 = 0.2, m_hat = 0.2 / 0.1 = 2; v = 0.001 * 16, v_hat = 16,
    # sqrt = 4; w = 1 - 0.1 * 2 / (4 + 0) = 0.95.
    w, state = fisher_step(
        torch.tensor([1.0]),
        torch.tensor([2.0]),
        torch.tensor([4.0]),
        FisherMomentum.zeros_like(torch.tensor([1.0])),
        lr=0.1,
        damping=0.0,
    )
    assert w.item() == pytest.approx(0.95)
    assert (state.exp_avg.item(), state.exp_fisher_sq.item(), state.step) == pytest.approx(
        (0.2, 0.016, 1)
    )
    # Step 2 with g = 1, Gamma = 1, damping 1: m = 0.18 + 0.1 = 0.28, m_hat = 0.28 / 0.19;
    # v = 0.015984 + 0.001 = 0.016984, v_hat = 0.016984 / (1 - 0.999^2) = 0.016984 / 0.001999.
    w2, state2 = fisher_step(
        w, torch.tensor([1.0]), torch.tensor([1.0]), state, lr=0.1, damping=1.0
    )
    m_hat, v_hat = 0.28 / 0.19, 0.016984 / 0.001999
    assert w2.item() == pytest.approx(0.95 - 0.1 * m_hat / (math.sqrt(v_hat) + 1.0))
    assert state2.step == 2


def test_fisher_step_first_step_is_a_damped_newton_step_per_coordinate():
    # t = 1: the bias corrections undo (1 - beta), so the step is lr * g / (|Gamma| + lambda)
    # whatever the betas: g / Gamma = (1, -3, 0.5) for g = (2, -3, 1), Gamma = (2, 1, 2).
    g, gamma = torch.tensor([2.0, -3.0, 1.0]), torch.tensor([2.0, 1.0, 2.0])
    for betas in ((0.9, 0.999), (0.0, 0.0), (0.5, 0.3)):
        w, _ = fisher_step(
            torch.zeros(3),
            g,
            gamma,
            FisherMomentum.zeros_like(g),
            lr=0.5,
            damping=0.0,
            momentum=betas[0],
            fisher_momentum=betas[1],
        )
        torch.testing.assert_close(w, torch.tensor([-0.5, 1.5, -0.25]))


def test_fisher_step_leaves_its_inputs_alone():
    param, g, gamma = torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([4.0])
    state = FisherMomentum.zeros_like(param)
    fisher_step(param, g, gamma, state, lr=0.1, damping=0.0)
    assert (param.item(), g.item(), gamma.item(), state.exp_avg.item(), state.step) == (
        1.0,
        2.0,
        4.0,
        0.0,
        0,
    )


def test_fisher_step_zero_fisher_without_damping_does_not_move_nor_nan():
    w, state = fisher_step(
        torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 2.0]),
        torch.tensor([0.0, 4.0]),
        FisherMomentum.zeros_like(torch.zeros(2)),
        lr=0.1,
        damping=0.0,
    )
    assert torch.isfinite(w).all() and torch.isfinite(state.exp_fisher_sq).all()
    torch.testing.assert_close(w, torch.tensor([1.0, 0.95]))


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("lr", 0.0),
        ("lr", math.inf),
        ("damping", -1e-3),
        ("momentum", 1.0),
        ("fisher_momentum", -0.1),
    ],
)
def test_fisher_step_refuses_bad_rates(keyword, value):
    kwargs = {"lr": 0.1, "damping": 0.0, keyword: value}
    with pytest.raises(ConfigError, match=keyword):
        fisher_step(
            torch.zeros(1),
            torch.zeros(1),
            torch.zeros(1),
            FisherMomentum.zeros_like(torch.zeros(1)),
            **kwargs,
        )


def test_fisher_step_refuses_mismatched_shapes():
    with pytest.raises(ConfigError, match="shape"):
        fisher_step(
            torch.zeros(2),
            torch.zeros(3),
            torch.zeros(2),
            FisherMomentum.zeros_like(torch.zeros(2)),
            lr=0.1,
            damping=0.0,
        )


# --- rapid_retraining_epochs --------------------------------------------------------------------


def test_beats_sgd_on_a_badly_conditioned_problem_at_each_ones_best_lr():
    x, y = _badly_conditioned()
    torch.manual_seed(1)
    start = nn.Linear(2, 2)
    sgd_best = fim_best = math.inf
    for lr in (0.01, 0.1, 0.3, 1.0):  # the same number of steps (50) for both
        sgd = copy.deepcopy(start)
        train_epochs(sgd, x, y, epochs=5, lr=lr, batch_size=20, seed=0)
        fim = copy.deepcopy(start)
        rapid_retraining_epochs(fim, x, y, epochs=5, lr=lr, batch_size=20, seed=0, damping=1e-8)
        sgd_best, fim_best = min(sgd_best, _loss(sgd, x, y)), min(fim_best, _loss(fim, x, y))
    assert fim_best < 0.5 * sgd_best, (fim_best, sgd_best)


def test_one_full_batch_step_is_fisher_step_on_the_autograd_gradient_and_the_fim():
    x, y = _badly_conditioned(30)
    torch.manual_seed(2)
    model = nn.Linear(2, 2)
    reference = copy.deepcopy(model)
    fisher = diagonal_fisher(reference, x, y, batch_size=30)
    nn.functional.cross_entropy(reference(x), y).backward()
    loss = rapid_retraining_epochs(
        model, x, y, epochs=1, lr=0.05, batch_size=30, seed=0, damping=0.1
    )
    assert loss == pytest.approx(_loss(reference, x, y), rel=1e-5)
    for name, param in reference.named_parameters():
        expected, _ = fisher_step(
            param.detach(),
            param.grad,
            fisher[name],
            FisherMomentum.zeros_like(param),
            lr=0.05,
            damping=0.1,
        )
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), expected)


def test_deterministic_per_seed_and_the_seed_matters():
    x, y = _badly_conditioned(60)
    torch.manual_seed(3)
    start = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    runs = {}
    for key, seed in (("a", 7), ("b", 7), ("c", 8)):
        model = copy.deepcopy(start)
        loss = rapid_retraining_epochs(model, x, y, epochs=2, lr=0.01, batch_size=16, seed=seed)
        runs[key] = (loss, torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert runs["a"][0] == runs["b"][0]
    assert torch.equal(runs["a"][1], runs["b"][1])
    assert not torch.equal(runs["a"][1], runs["c"][1])


def test_a_dead_input_with_zero_damping_stays_put_and_finite():
    # The second feature is 0 for every sample: its weights get zero gradient and zero FIM.
    x, y = _badly_conditioned(40)
    x[:, 1] = 0.0
    torch.manual_seed(4)
    model = nn.Linear(2, 2)
    dead_column = model.weight[:, 1].detach().clone()
    loss = rapid_retraining_epochs(
        model, x, y, epochs=2, lr=0.1, batch_size=10, seed=0, damping=0.0
    )
    assert math.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    torch.testing.assert_close(model.weight[:, 1].detach(), dead_column)


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("epochs", 0), ("batch_size", 0), ("lr", -1.0), ("damping", math.nan), ("momentum", 1.5)],
)
def test_rapid_retraining_epochs_refuses_bad_arguments(keyword, value):
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    kwargs = {"epochs": 1, "lr": 0.1, "batch_size": 2, "seed": 0, "damping": 0.0, keyword: value}
    with pytest.raises(ConfigError, match=keyword):
        rapid_retraining_epochs(_zero_linear(), x, y, **kwargs)
