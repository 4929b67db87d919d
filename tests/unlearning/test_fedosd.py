"""FedOSD's core math (Pan et al., AAAI 2025): UCE, the OSD direction, the non-reverting projection."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.unlearning.fedosd import (
    client_gradient,
    learning_rate,
    non_reverting,
    orthogonal_steepest_descent,
    post_training_step,
    pseudo_gradient,
    unlearning_cross_entropy,
    unlearning_step,
)


def _close(a, b, tol=1e-6):
    return torch.allclose(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol
    )


# --- Unlearning Cross-Entropy -------------------------------------------------------------------


def test_uce_value_and_gradient_by_hand_on_three_classes():
    # logits log(1, 2, 1) give softmax (1/4, 1/2, 1/4).
    logits = torch.log(torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]], dtype=torch.float64))
    labels = torch.tensor([1, 0])
    # sample 1: p_y = 1/2 -> -log(1 - 1/4) = log(4/3); sample 2: p_y = 1/4 -> log(8/7).
    expected = (math.log(4 / 3) + math.log(8 / 7)) / 2
    assert math.isclose(float(unlearning_cross_entropy(logits, labels)), expected, rel_tol=1e-12)

    # d/dz_y [-log(1 - p_y/2)] = p_y (1 - p_y) / (2 - p_y); d/dz_j = -p_y p_j / (2 - p_y).
    z = logits[:1].clone().requires_grad_(True)
    unlearning_cross_entropy(z, labels[:1]).backward()
    assert _close(z.grad[0], [-(0.5 * 0.25) / 1.5, 0.25 / 1.5, -(0.5 * 0.25) / 1.5], 1e-12)


def test_uce_is_bounded_where_negative_ce_is_not():
    torch.manual_seed(0)
    logits = torch.randn(500, 5, dtype=torch.float64) * 30
    labels = torch.randint(0, 5, (500,))
    per_sample = [
        float(unlearning_cross_entropy(logits[i : i + 1], labels[i : i + 1])) for i in range(500)
    ]
    assert min(per_sample) >= 0 and max(per_sample) <= math.log(2)  # log 2 only as p_y -> 1
    # Driving the label's logit to -inf: -CE runs to -inf, UCE settles at its minimum 0.
    far = torch.tensor([[-1e4, 0.0, 0.0]], dtype=torch.float64)
    assert -nn.functional.cross_entropy(far, torch.tensor([0])) < -1e3
    assert float(unlearning_cross_entropy(far, torch.tensor([0]))) == pytest.approx(0.0, abs=1e-12)


def test_uce_descent_pushes_the_label_probability_down():
    torch.manual_seed(1)
    model = nn.Linear(4, 3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    before = torch.softmax(model(x), 1).gather(1, y[:, None]).mean()
    grads = client_gradient(model, x, y, loss="uce")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p -= 0.5 * grads[name]
    after = torch.softmax(model(x), 1).gather(1, y[:, None]).mean()
    assert after < before


# --- client_gradient ----------------------------------------------------------------------------


def test_client_gradient_matches_the_hand_gradient_of_ce_and_ignores_batch_size():
    model = nn.Linear(2, 3)
    nn.init.zeros_(model.weight), nn.init.zeros_(model.bias)
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    y = torch.tensor([0, 2])
    # Zero weights: p = (1/3, 1/3, 1/3); dCE/dW = mean_i (p - e_{y_i}) x_i^T, dCE/db = mean_i (p - e_{y_i}).
    r = torch.tensor([[-2 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, -2 / 3]])
    expected_w = (r[0][:, None] * x[0][None] + r[1][:, None] * x[1][None]) / 2
    full = client_gradient(model, x, y)
    assert _close(full["weight"], expected_w) and _close(full["bias"], r.mean(0))
    one_by_one = client_gradient(model, x, y, batch_size=1)
    assert _close(one_by_one["weight"], expected_w) and _close(one_by_one["bias"], r.mean(0))
    assert float(model.weight.detach().abs().sum()) == 0.0 and model.weight.grad is None


def test_client_gradient_refuses_bad_arguments():
    model = nn.Linear(2, 2)
    x, y = torch.zeros(3, 2), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ConfigError, match="loss"):
        client_gradient(model, x, y, loss="ga")
    with pytest.raises(ConfigError, match="batch_size"):
        client_gradient(model, x, y, batch_size=0)
    with pytest.raises(ConfigError):
        client_gradient(model, x[:0], y[:0])


def test_pseudo_gradient_is_the_local_move_over_the_rate():
    got = pseudo_gradient({"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([0.8, 1.1])}, 0.1)
    assert _close(got["w"], [2.0, -1.0])


# --- Orthogonal Steepest Descent ----------------------------------------------------------------


def test_osd_by_hand_in_two_and_three_dimensions():
    # g_u = (1, 1), g_r = (1, 0): projection (0, 1), rescaled to ||g_u|| = sqrt 2.
    d = orthogonal_steepest_descent(torch.tensor([1.0, 1.0]), [torch.tensor([1.0, 0.0])])
    assert _close(d, [0.0, math.sqrt(2)])
    # Non-orthogonal remaining gradients spanning the xy-plane leave only z: (0, 0, 3) -> sqrt 14.
    rem = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([2.0, -1.0, 0.0])]
    d = orthogonal_steepest_descent(torch.tensor([1.0, 2.0, 3.0]), rem)
    assert _close(d, [0.0, 0.0, math.sqrt(14)], 1e-5)
    raw = orthogonal_steepest_descent(torch.tensor([1.0, 2.0, 3.0]), rem, rescale=False)
    assert _close(raw, [0.0, 0.0, 3.0], 1e-5)


def test_osd_never_conflicts_and_still_descends_in_high_dimension():
    torch.manual_seed(2)
    for m in (1, 5, 30):
        g_u = torch.randn(50, dtype=torch.float64)
        rem = [torch.randn(50, dtype=torch.float64) for _ in range(m)]
        d = orthogonal_steepest_descent(g_u, rem)
        assert max(abs(float(d @ g)) for g in rem) < 1e-9 * float(g_u.norm()) * 10
        assert float(d @ g_u) > 0 and math.isclose(float(d.norm()), float(g_u.norm()), rel_tol=1e-9)


def test_osd_degenerate_cases():
    g_u = torch.tensor([1.0, -2.0, 0.5])
    spanning = [torch.eye(3)[i] for i in range(3)]
    assert float(orthogonal_steepest_descent(g_u, spanning).abs().max()) == 0.0
    assert float(orthogonal_steepest_descent(torch.zeros(3), [torch.ones(3)]).abs().max()) == 0.0
    assert _close(orthogonal_steepest_descent(g_u, [torch.zeros(3), torch.zeros(3)]), g_u)
    assert _close(orthogonal_steepest_descent(g_u, []), g_u)
    one = torch.tensor([1.0, 1.0, 0.0])
    assert _close(
        orthogonal_steepest_descent(g_u, [one, one, 2 * one]),
        orthogonal_steepest_descent(g_u, [one]),
    )
    # g_u itself among the remaining gradients: no non-conflicting descent, so no step.
    assert float(orthogonal_steepest_descent(g_u, [g_u, one]).abs().max()) == 0.0


def test_osd_on_state_dicts_keeps_shapes_and_refuses_other_keys():
    g_u = {"a": torch.tensor([[1.0, 0.0]]), "b": torch.tensor([1.0])}
    rem = [{"a": torch.tensor([[1.0, 0.0]]), "b": torch.tensor([0.0])}]
    d = orthogonal_steepest_descent(g_u, rem)
    assert (
        d["a"].shape == (1, 2) and _close(d["a"], [[0.0, 0.0]]) and _close(d["b"], [math.sqrt(2)])
    )
    with pytest.raises(ConfigError, match="remaining_gradients"):
        orthogonal_steepest_descent(g_u, [{"a": torch.zeros(1, 2)}])


def test_an_osd_step_leaves_remaining_losses_unchanged_to_first_order():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    data = [(torch.randn(15, 6, dtype=torch.float64), torch.randint(0, 3, (15,))) for _ in range(3)]
    g_u = client_gradient(model, *data[0], loss="uce")
    rem = [client_gradient(model, *xy) for xy in data[1:]]
    d = orthogonal_steepest_descent(g_u, rem)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def losses_after(eps):
        model.load_state_dict({k: state[k] - eps * d[k] for k in state})
        with torch.no_grad():
            uce = unlearning_cross_entropy(model(data[0][0]), data[0][1])
            ce = [nn.functional.cross_entropy(model(x), y) for x, y in data[1:]]
        return float(uce), [float(c) for c in ce]

    uce0, ce0 = losses_after(0.0)
    for eps in (1e-3, 1e-4):
        uce, ce = losses_after(eps)
        assert uce < uce0  # UCE falls linearly in eps ...
        assert max(abs(a - b) for a, b in zip(ce, ce0)) < 0.05 * (
            uce0 - uce
        )  # ... the others only O(eps^2)


# --- Post-training without reverting ------------------------------------------------------------


def test_non_reverting_by_hand():
    g_a = torch.tensor([1.0, 0.0])
    assert _close(non_reverting(torch.tensor([1.0, 1.0]), g_a), [0.0, math.sqrt(2)])
    assert _close(non_reverting(torch.tensor([1.0, 1.0]), g_a, rescale=False), [0.0, 1.0])
    # <g, g_a> < 0: the step -g moves away from w_0; the code still projects, the option does not.
    g = torch.tensor([-1.0, 1.0])
    assert _close(non_reverting(g, g_a), [0.0, math.sqrt(2)])
    assert _close(non_reverting(g, g_a, only_if_conflicting=True), g)
    assert _close(non_reverting(g, torch.zeros(2)), g)
    assert float(non_reverting(torch.tensor([3.0, 0.0]), g_a).abs().max()) == 0.0


def test_post_training_never_brings_the_model_back_towards_the_original():
    torch.manual_seed(4)
    original = {"w": torch.zeros(10, dtype=torch.float64), "n": torch.tensor(7)}
    state = {"w": torch.randn(10, dtype=torch.float64), "n": torch.tensor(7)}
    for _ in range(20):
        # Adversarial gradients: mostly pointing from w_0 to w, so plain descent would revert.
        grads = [{"w": 3 * state["w"] + torch.randn(10, dtype=torch.float64)} for _ in range(4)]
        for only in (False, True):
            new = post_training_step(state, original, grads, 0.05, only_if_conflicting=only)
            assert float(new["w"].norm()) >= float(state["w"].norm()) - 1e-12
        plain = state["w"] - 0.05 * sum(g["w"] for g in grads) / 4
        assert float(plain.norm()) < float(state["w"].norm())  # the projection is what prevents it
        state = new
    assert int(state["n"]) == 7


def test_server_steps_by_hand():
    state = {"w": torch.tensor([0.0, 0.0]), "buf": torch.tensor([5.0])}
    # mean g_u = (1, 1); remaining (1, 0) -> d = (0, sqrt 2); w = -0.1 d.
    new = unlearning_step(
        state,
        [{"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([0.0, 2.0])}],
        [{"w": torch.tensor([1.0, 0.0])}],
        0.1,
    )
    assert _close(new["w"], [0.0, -0.1 * math.sqrt(2)]) and _close(new["buf"], [5.0])
    # g_a = (1, 0): (1, 1) -> (0, sqrt 2), (3, 0) -> 0; mean (0, sqrt2 / 2).
    new = post_training_step(
        {"w": torch.tensor([1.0, 0.0])},
        {"w": torch.tensor([0.0, 0.0])},
        [{"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([3.0, 0.0])}],
        0.2,
    )
    assert _close(new["w"], [1.0, -0.2 * math.sqrt(2) / 2])
    assert learning_rate(0, 4e-4) == 4e-4 and math.isclose(learning_rate(10, 1.0, 0.5), 0.5**10)
    with pytest.raises(ConfigError, match="lr"):
        unlearning_step(state, [{"w": torch.ones(2)}], [], -1.0)


def test_client_gradient_leaves_batchnorm_statistics_alone():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    client_gradient(
        model, torch.randn(8, 3) + 5, torch.randint(0, 2, (8,)), loss="uce", batch_size=3
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
