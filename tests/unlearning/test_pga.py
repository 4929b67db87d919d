"""PGA (Halimi et al., arXiv 2207.05521): reference model, projection, radius, ascent, retention."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.retention import RetentionRecord, Selection
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.unlearning.pga import (
    LastRoundRetention,
    ball_radius,
    project_to_ball,
    projected_gradient_ascent,
    reference_model,
    validation_threshold,
)


def _state(**tensors):
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in tensors.items()}


def test_reference_model_by_hand():
    # M = (1, 0); U_1 = (2, 2), n_1 = 1; U_2 = (-1, 4), n_2 = 3; U_3 = (100, 100) is the target's.
    # Mean of the others: (1*2 + 3*(-1)) / 4 = -0.25, (1*2 + 3*4) / 4 = 3.5 -> w_ref = (0.75, 3.5).
    m = _state(w=[1.0, 0.0])
    updates = {1: _state(w=[2.0, 2.0]), 2: _state(w=[-1.0, 4.0]), 3: _state(w=[100.0, 100.0])}
    counts = {1: 1, 2: 3, 3: 5}
    ref = reference_model(m, updates, counts, targets=[3])
    assert torch.allclose(ref["w"], torch.tensor([0.75, 3.5]))
    # The paper's form (Σn w^T - n_i w_i) / (Σn - n_i), with w^T the FedAvg of all three.
    models = {k: m["w"] + u["w"] for k, u in updates.items()}
    total = sum(counts.values())
    w_t = sum(counts[k] * models[k] for k in models) / total
    paper = (total * w_t - counts[3] * models[3]) / (total - counts[3])
    assert torch.allclose(ref["w"], paper, atol=1e-5)
    # A target that did not take part (or whose update is gone) changes nothing.
    del updates[3]
    assert torch.allclose(reference_model(m, updates, counts, targets=[3])["w"], ref["w"])


def test_reference_model_refuses_no_other_client_and_bad_counts():
    m, u = _state(w=[0.0]), {1: _state(w=[1.0])}
    with pytest.raises(ConfigError, match="targets"):
        reference_model(m, u, {1: 1}, targets=[1])
    with pytest.raises(ConfigError, match=r"counts\[1\]"):
        reference_model(m, u, {1: 0})


def test_projection_outside_lands_on_the_sphere_along_the_ray():
    center = _state(a=[1.0, 1.0], b=[0.0])
    point = _state(a=[4.0, 5.0], b=[12.0])  # w - c = (3, 4, 12), norm 13
    out = project_to_ball(point, center, 2.6)  # 2.6 / 13 = 0.2 -> c + (0.6, 0.8, 2.4)
    assert torch.allclose(out["a"], torch.tensor([1.6, 1.8]))
    assert torch.allclose(out["b"], torch.tensor([2.4]))


def test_projection_inside_is_unchanged_and_non_float_tensors_untouched():
    center = _state(a=[0.0, 0.0])
    center["n"] = torch.tensor(0)
    point = {"a": torch.tensor([0.3, 0.4]), "n": torch.tensor(7)}
    out = project_to_ball(point, center, 0.5)  # distance exactly 0.5: on the ball already
    assert torch.equal(out["a"], point["a"]) and int(out["n"]) == 7
    far = project_to_ball({"a": torch.tensor([3.0, 4.0]), "n": torch.tensor(7)}, center, 1.0)
    assert int(far["n"]) == 7 and torch.allclose(far["a"], torch.tensor([0.6, 0.8]))
    with pytest.raises(ConfigError, match="radius"):
        project_to_ball(point, center, -1.0)


def test_ball_radius_is_sqrt_of_a_third_of_the_mean_squared_distance():
    # Random "models" at fixed points: squared distances 9 and 25 to w_ref = 0 -> sqrt(34/2/3).
    points = {0: [3.0, 0.0], 1: [0.0, 5.0]}

    def build(seed):
        model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([points[seed]]))
        return model

    ref = {"weight": torch.zeros(1, 2)}
    assert ball_radius(ref, build, num_models=2, seed=0) == pytest.approx(math.sqrt(34 / 6))

    # Seeds come from ``seed``: the same seed, the same radius (no global RNG involved).
    def seeded(seed):
        torch.manual_seed(seed)
        return nn.Linear(3, 2)

    ref = dict(nn.Linear(3, 2).state_dict())
    assert ball_radius(ref, seeded, seed=4) == ball_radius(ref, seeded, seed=4)


def _toy_problem(seed=0, n=96):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    train_epochs(model, x, y, epochs=30, lr=0.1, batch_size=16, seed=seed)
    return model, x, y


def test_ascent_stays_in_the_ball_and_raises_the_target_loss():
    model, x, y = _toy_problem()
    reference = {k: t.clone() for k, t in model.state_dict().items()}
    before = evaluate(model, x, y).loss
    radius = 0.5
    out = projected_gradient_ascent(
        model, x, y, reference=reference, radius=radius, epochs=20, lr=0.5, batch_size=16,
        seed=1, clip_norm=5.0, momentum=0.9,
    )  # fmt: skip
    after = evaluate(model, x, y).loss
    assert after > before + 0.1
    assert out["steps"] == 20 * 6 and not out["stopped_early"]
    # With lr 0.5 for 120 steps the ascent would leave a radius-0.5 ball: it stops on the sphere.
    params = {k: p.detach() for k, p in model.named_parameters()}
    dist = math.sqrt(sum(float((params[k] - reference[k]).pow(2).sum()) for k in params))
    assert dist <= radius * (1 + 1e-5) and dist == pytest.approx(radius, rel=1e-4)
    assert out["distance"] == pytest.approx(dist, rel=1e-6)


def test_ball_holds_after_every_step():
    model, x, y = _toy_problem(seed=2)
    reference = {k: t.clone() for k, t in model.state_dict().items()}
    seen = []

    class Watch(nn.Module):  # records the distance to w_ref at every forward pass
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, inputs):
            params = {k: p.detach() for k, p in self.inner.named_parameters()}
            seen.append(
                math.sqrt(sum(float((params[k] - reference[k]).pow(2).sum()) for k in params))
            )
            return self.inner(inputs)

    watched = Watch(model)
    ref = {f"inner.{k}": t for k, t in reference.items()}
    projected_gradient_ascent(
        watched, x, y, reference=ref, radius=0.2, epochs=3, lr=1.0, batch_size=8, seed=0
    )
    assert max(seen) <= 0.2 * (1 + 1e-5) and len(seen) == 3 * 12


def test_early_stop_on_validation_accuracy_and_on_distance():
    model, x, y = _toy_problem(seed=3)
    validation = _toy_problem(seed=4)[1:]  # other samples of the same task
    reference = {k: t.clone() for k, t in model.state_dict().items()}
    assert evaluate(model, *validation).accuracy > 0.9
    out = projected_gradient_ascent(
        model, x, y, reference=reference, radius=100.0, epochs=50, lr=0.5, batch_size=16,
        seed=0, validation=validation, stop_accuracy=0.5,
    )  # fmt: skip
    assert out["stopped_early"] and out["stop_reason"] == "accuracy"
    assert out["accuracy"] < 0.5 and evaluate(model, *validation).accuracy == out["accuracy"]
    assert out["steps"] < 50 * 6
    # Notebook rule: stop once the squared distance to the target's own model exceeds a bound.
    model2, _, _ = _toy_problem(seed=3)
    out = projected_gradient_ascent(
        model2, x, y, reference=reference, radius=100.0, epochs=50, lr=0.5, batch_size=16,
        seed=0, anchor=reference, stop_distance=0.25,
    )  # fmt: skip
    params = {k: p.detach() for k, p in model2.named_parameters()}
    sq = sum(float((params[k] - reference[k]).pow(2).sum()) for k in params)
    assert out["stop_reason"] == "distance" and sq > 0.25


def _by_hand(weight, bias, x, y, lr, steps):
    """Full-batch gradient ascent on the mean cross-entropy of a 1-input, 2-class linear model,
    written out: grad_W = (softmax(W x + b) - onehot(y))^T x / n, grad_b likewise; each step
    W += lr grad_W."""
    w, b = np.array(weight, dtype=np.float64), np.array(bias, dtype=np.float64)
    out = [(w.copy(), b.copy())]
    for _ in range(steps):
        logits = x[:, None] * w[None, :, 0] + b[None, :]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        residual = p - np.eye(2)[y]
        w = w + lr * (residual * x[:, None]).mean(axis=0)[:, None]
        b = b + lr * residual.mean(axis=0)
        out.append((w.copy(), b.copy()))
    return out


def _accuracy_by_hand(w, b, x, y) -> float:
    return float(((x[:, None] * w[None, :, 0] + b[None, :]).argmax(axis=1) == y).mean())


@pytest.mark.parametrize("margin, expected_step", [(30, 6), (50, 7)])
def test_the_paper_stop_fires_at_the_first_step_below_tau_by_hand(margin, expected_step):
    # A 1-input, 2-class linear model that starts right on every sample; the ascent moves the
    # boundary step by step, so the validation accuracy falls one sample at a time: by hand,
    # 1.0 for steps 0-4, then 0.8, 0.6, 0.4, 0.2, 0.2, 0.0.
    x = np.array([-2.0, -1.0, 0.5, 1.0, 2.0, 3.0])
    y = np.array([0, 0, 1, 1, 1, 1])
    x_val = np.array([-1.6, -0.6, 0.3, 0.9, 1.7])
    y_val = np.array([0, 0, 1, 1, 1])
    weight, bias, lr = [[-1.0], [1.0]], [0.0, 0.0], 0.8
    reference_accuracy = _accuracy_by_hand(np.array(weight), np.array(bias), x_val, y_val)
    tau = validation_threshold(reference_accuracy, margin)
    assert tau == pytest.approx(1 - margin / 100)  # acc(w_ref) = 1
    path = _by_hand(weight, bias, x, y, lr, steps=40)
    accuracies = [_accuracy_by_hand(w, b, x_val, y_val) for w, b in path]
    assert accuracies[:9] == pytest.approx([1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2])
    first = next(k for k, a in enumerate(accuracies) if a < tau)
    assert first == expected_step and accuracies[first - 1] >= tau
    model = nn.Linear(1, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight))
        model.bias.copy_(torch.tensor(bias))
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    to_tensor = lambda a: torch.tensor(a, dtype=torch.float32)[:, None]  # noqa: E731
    out = projected_gradient_ascent(
        model, to_tensor(x), torch.tensor(y), reference=reference, radius=1e6, epochs=40, lr=lr,
        batch_size=len(x), seed=0, validation=(to_tensor(x_val), torch.tensor(y_val)),
        stop_accuracy=tau,
    )  # fmt: skip
    assert out["steps"] == first and out["stop_reason"] == "accuracy"
    assert out["accuracy"] == pytest.approx(accuracies[first])
    w, b = path[first]
    assert torch.allclose(model.weight.detach().double(), torch.tensor(w), atol=1e-5)
    assert torch.allclose(model.bias.detach().double(), torch.tensor(b), atol=1e-5)


def test_tau_is_the_reference_accuracy_minus_the_margin_in_points():
    assert validation_threshold(0.97, 10) == pytest.approx(0.87)
    assert validation_threshold(0.5, 0) == 0.5
    assert validation_threshold(0.05, 10) == pytest.approx(-0.05)  # never fires: stays a number
    for bad, name in (((1.2, 10), "reference_accuracy"), ((0.9, -1), "pga-stop-margin"),
                      ((0.9, 101), "pga-stop-margin")):  # fmt: skip
        with pytest.raises(ConfigError, match=name):
            validation_threshold(*bad)


def test_ascent_is_reproducible_and_validates():
    runs = []
    for _ in range(2):
        model, x, y = _toy_problem(seed=4)
        ref = {k: t.clone() for k, t in model.state_dict().items()}
        projected_gradient_ascent(
            model, x, y, reference=ref, radius=1.0, epochs=2, lr=0.1, batch_size=16, seed=7
        )
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1])
    kwargs = dict(reference=ref, radius=1.0, epochs=1, lr=0.1, batch_size=16, seed=0)
    for bad, match in [
        ({"epochs": 0}, "epochs"),
        ({"lr": 0.0}, "lr"),
        ({"stop_accuracy": 1.5}, "stop_accuracy"),
        ({"stop_accuracy": 0.5}, "stop_accuracy"),  # without validation samples
        ({"validation": (x[:0], y[:0]), "stop_accuracy": 0.5}, "validation"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"stop_distance": 1.0}, "stop_distance"),
    ]:
        with pytest.raises(ConfigError, match=match):
            projected_gradient_ascent(model, x, y, **{**kwargs, **bad})


def test_last_round_retention_keeps_one_round_at_a_time():
    policy = LastRoundRetention()
    m, u = _state(w=[0.0]), {2: _state(w=[1.0]), 5: _state(w=[2.0])}
    record = RetentionRecord.empty([policy.name])
    for t in (1, 2, 3):
        selection = policy.select(t, m, u, {2: 1, 5: 1})
        assert selection == Selection(True, frozenset({2, 5}))
        record.add(policy.name, t, selection)
        settled = policy.settle()
        assert settled == ({} if t == 1 else {t - 1: None})
        for r, clients in settled.items():
            record.settle(policy.name, r, clients)
        assert policy.settle() == {}  # handed over once
    assert record.selections[policy.name] == {3: (2, 5)}
    # A round without updates keeps nothing and releases nothing.
    assert not policy.select(4, m, {}, {}).keeps_anything() and policy.settle() == {}
    with pytest.raises(ValueError):
        policy.select(3, m, u, {2: 1, 5: 1})  # rounds come in increasing order


def test_last_round_retention_state_round_trip_and_forget():
    policy = LastRoundRetention()
    m, u = _state(w=[0.0]), {1: _state(w=[1.0])}
    policy.select(6, m, u, {1: 1})
    state = policy.state_dict()
    restored = LastRoundRetention.from_state(state)
    assert restored.last_round == 6
    restored.select(7, m, u, {1: 1})
    assert restored.settle() == {6: None}  # a resumed run releases the round kept before
    assert LastRoundRetention.forget_in_state(state, [1]) == state  # no per-client numbers
    for bad in ({"format": 2, "last_round": 1}, {"format": 1, "last_round": 0}, [1]):
        with pytest.raises(StoreCorruptionError):
            LastRoundRetention.from_state(bad)
    assert LastRoundRetention.from_config(None).state_dict() == {"format": 1, "last_round": None}


def test_the_stop_is_the_authors_absolute_distance_or_a_multiple_of_the_start():
    from fedunlearn.unlearning.pga import stop_distance

    assert stop_distance(2.0, 2.2, 0.0) == 2.2  # the authors' code: absolute
    assert stop_distance(2.0, 2.2, 4.9) == pytest.approx(9.8)  # ours: 4.9x where it started
    assert stop_distance(0.45, 0.0, 4.9) == pytest.approx(2.205)  # their stored run's ratio
    for args, name in (((-1.0, 2.2, 0.0), "start_distance2"), ((1.0, math.inf, 0.0), "pga-stop-distance"),
                       ((1.0, 2.2, -0.5), "pga-stop-ratio"), ((1.0, 2.2, math.nan), "pga-stop-ratio")):  # fmt: skip
        with pytest.raises(ConfigError, match=name):
            stop_distance(*args)


def test_the_client_sets_its_stop_from_its_own_start_when_a_ratio_is_sent():
    # w_ref = (0, 0), its own model (3, 4): squared distance 25 over the parameters; the buffer
    # "n" (not a parameter) counts for nothing.
    from clients.objectives import _anchor

    reference = {"w": torch.zeros(2), "n": torch.tensor(100.0)}
    anchor = {"w": torch.tensor([3.0, 4.0]), "n": torch.tensor(0.0)}
    sent = {"pga-stop": "ratio", "pga-stop-distance": 2.2, "pga-stop-ratio": 2.0}
    ratio = _anchor({"anchor": anchor}, sent, reference, ["w"])
    assert ratio["stop_distance"] == pytest.approx(50.0) and ratio["anchor"] is anchor
    absolute = _anchor({"anchor": anchor}, {**sent, "pga-stop": "distance"}, reference, ["w"])
    assert absolute["stop_distance"] == 2.2  # the authors' rule ignores the ratio
    assert _anchor({"anchor": anchor}, {"pga-stop-distance": 0.0}, reference, ["w"]) == {}
    assert _anchor(None, sent, reference, ["w"]) == {}


def test_the_client_sets_tau_from_the_reference_on_the_validation_samples_it_was_sent():
    from clients.objectives import _stop

    model, x, y = _toy_problem(seed=5)
    reference = {k: t.clone() for k, t in model.state_dict().items()}
    keys = [k for k, _ in model.named_parameters()]
    config = {"pga-stop": "validation", "pga-stop-margin": 25.0}
    stop = _stop({"validation": {"x": x, "y": y}}, config, model, reference, keys, "cpu")
    assert stop["stop_accuracy"] == pytest.approx(evaluate(model, x, y).accuracy - 0.25)
    assert torch.equal(stop["validation"][0], x)
    with pytest.raises(ConfigError, match="validation"):
        _stop({}, config, model, reference, keys, "cpu")
    with pytest.raises(ConfigError, match="pga-stop"):
        _stop({}, {"pga-stop": "accuracy"}, model, reference, keys, "cpu")
