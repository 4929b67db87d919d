"""Readouts of forgetting (Golatkar et al. 2020, Sec. 5.3): error, entropy, relearn time, plots."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from fedunlearn.data.datasets import load_dataset
from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.readout_figures import (
    plot_entropy_histograms,
    plot_information_tradeoff,
    plot_relearn_times,
)
from fedunlearn.scrubbing.readouts import (
    RelearnResult,
    error_rate,
    output_entropy,
    relearn_time,
)
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.models import build_dataset_model

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FORGOTTEN_CLASS = 0


def _linear(weight: list[list[float]], bias: list[float] | None = None) -> nn.Linear:
    """A linear classifier with hand-set weights (logits = W x + b)."""
    w = torch.tensor(weight, dtype=torch.float32)
    layer = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(torch.zeros(w.shape[0]) if bias is None else torch.tensor(bias))
    return layer


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def _assert_same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name


def _assert_png(path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_SIGNATURE


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These models are tiny: a second intra-op thread only adds waiting on a busy 2-core box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


@pytest.fixture(scope="module")
def without_class(digits):
    """A digits CNN trained briefly on D_r = every class but FORGOTTEN_CLASS (D_f = that class)."""
    x, y = digits.train.x, digits.train.y
    keep = y != FORGOTTEN_CLASS
    model = build_dataset_model("auto", "digits", (1, 8, 8), 10, seed=0)
    train_epochs(model, x[keep], y[keep], epochs=3, lr=0.05, batch_size=64, seed=0, momentum=0.9)
    return model, (x, y), (x[~keep], y[~keep])


# ------------------------------------------------------------------------------- error_rate


def test_error_rate_is_zero_or_one_on_hand_set_linear_model():
    model = _linear([[1.0, 0.0], [0.0, 1.0]])  # predicts the larger coordinate
    x = torch.tensor([[2.0, 0.0], [0.0, 3.0], [5.0, 1.0]])
    assert error_rate(model, x, torch.tensor([0, 1, 0])) == 0.0
    assert error_rate(model, x, torch.tensor([1, 0, 1])) == 1.0
    assert error_rate(model, x, torch.tensor([0, 1, 1]), batch_size=1) == pytest.approx(1 / 3)


def test_error_rate_is_nan_on_empty_input():
    model = _linear([[1.0, 0.0], [0.0, 1.0]])
    assert math.isnan(error_rate(model, torch.empty(0, 2), torch.empty(0, dtype=torch.long)))


def test_error_rate_matches_evaluate_and_leaves_model_untouched(digits, without_class):
    model = without_class[0]
    model.train()
    before = _state(model)
    x, y = digits.test.x, digits.test.y
    rate = error_rate(model, x, y, batch_size=100)
    assert rate == pytest.approx(1.0 - evaluate(model, x, y).accuracy)
    model.train()
    error_rate(model, x, y)
    assert model.training  # mode restored
    _assert_same_state(model, before)
    # Every sample of the class never seen in training is misclassified.
    assert error_rate(model, *without_class[2]) > 0.9


def test_error_rate_rejects_bad_batch_size():
    model = _linear([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ConfigError, match="batch_size") as excinfo:
        error_rate(model, torch.ones(2, 2), torch.zeros(2, dtype=torch.long), batch_size=0)
    assert excinfo.value.parameter == "batch_size"


# --------------------------------------------------------------------------- output_entropy


def test_output_entropy_of_constant_logits_is_log_k():
    model = _linear([[0.0, 0.0]] * 5, bias=[3.0] * 5)
    entropy = output_entropy(model, torch.randn(7, 2))
    assert entropy.dtype == np.float64
    assert entropy.shape == (7,)
    np.testing.assert_allclose(entropy, math.log(5), rtol=1e-12)


def test_output_entropy_of_peaked_model_is_zero():
    model = _linear([[200.0, 0.0], [0.0, 200.0], [-200.0, -200.0]])
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    entropy = output_entropy(model, x)
    assert entropy.shape == (2,)
    assert np.all(entropy >= 0)
    assert np.all(entropy < 1e-12)


def test_output_entropy_matches_categorical_entropy(digits, without_class):
    model = without_class[0]
    x = digits.test.x[:300]
    before = _state(model)
    entropy = output_entropy(model, x, batch_size=64)
    with torch.no_grad():
        expected = torch.distributions.Categorical(logits=model(x).double()).entropy().numpy()
    np.testing.assert_allclose(entropy, expected, rtol=1e-9, atol=1e-12)
    assert np.all((entropy >= 0) & (entropy <= math.log(10) + 1e-9))
    _assert_same_state(model, before)


def test_output_entropy_of_empty_input_is_empty():
    entropy = output_entropy(_linear([[1.0, 0.0], [0.0, 1.0]]), torch.empty(0, 2))
    assert entropy.shape == (0,)
    assert entropy.dtype == np.float64


# ----------------------------------------------------------------------------- relearn_time


def test_relearn_time_reaches_threshold_after_some_steps(without_class):
    model, (x, y), (x_f, y_f) = without_class
    before = _state(model)
    initial_loss = evaluate(model, x_f, y_f).loss
    assert initial_loss > 3.0  # D_f was never seen: high loss
    result = relearn_time(
        model, x, y, x_f, y_f, threshold=0.5, max_epochs=3.0, check_every=5, seed=0
    )
    assert isinstance(result, RelearnResult)
    assert result.reached
    assert result.steps is not None and result.steps > 0
    assert result.steps % 5 == 0
    steps_per_epoch = math.ceil(len(x) / 64)
    assert result.steps_per_epoch == steps_per_epoch
    assert result.epochs == pytest.approx(result.steps / steps_per_epoch)
    assert result.threshold == 0.5
    # The curve starts at the untouched model's loss and stops at the first check below threshold.
    assert result.curve[0] == (0, pytest.approx(initial_loss, rel=1e-5))
    assert [step for step, _ in result.curve] == list(range(0, result.steps + 1, 5))
    assert result.curve[-1][1] <= 0.5
    assert all(loss > 0.5 for _, loss in result.curve[:-1])
    _assert_same_state(model, before)


def test_relearn_time_is_zero_when_already_below_threshold(without_class):
    model, (x, y), (x_f, y_f) = without_class
    result = relearn_time(model, x, y, x_f, y_f, threshold=1000.0)
    assert result.reached
    assert result.steps == 0
    assert result.epochs == 0.0
    assert len(result.curve) == 1


def test_relearn_time_not_reached_within_tiny_budget(without_class):
    model, (x, y), (x_f, y_f) = without_class
    before = _state(model)
    result = relearn_time(
        model, x, y, x_f, y_f, threshold=0.01, max_epochs=0.2, check_every=3, seed=1
    )
    budget = math.floor(0.2 * math.ceil(len(x) / 64))
    assert not result.reached
    assert result.steps is None and result.epochs is None
    assert result.budget_steps == budget
    assert result.budget_epochs == pytest.approx(budget / result.steps_per_epoch)
    # Checks at step 0, every 3 steps, and at the end of the budget.
    expected_steps = sorted(set(range(0, budget + 1, 3)) | {budget})
    assert [step for step, _ in result.curve] == expected_steps
    assert all(loss > 0.01 for _, loss in result.curve)
    _assert_same_state(model, before)


def test_relearn_time_is_deterministic_for_a_seed(without_class):
    model, (x, y), (x_f, y_f) = without_class
    kwargs = dict(threshold=0.01, max_epochs=0.5, check_every=2)
    first = relearn_time(model, x, y, x_f, y_f, seed=3, **kwargs)
    second = relearn_time(model, x, y, x_f, y_f, seed=3, **kwargs)
    other = relearn_time(model, x, y, x_f, y_f, seed=4, **kwargs)
    assert first == second
    assert [step for step, _ in other.curve] == [step for step, _ in first.curve]
    assert [loss for _, loss in other.curve[1:]] != [loss for _, loss in first.curve[1:]]


@pytest.mark.parametrize(
    ("parameter", "overrides"),
    [
        ("threshold", {"threshold": 0.0}),
        ("threshold", {"threshold": -1.0}),
        ("threshold", {"threshold": float("nan")}),
        ("check_every", {"check_every": 0}),
        ("check_every", {"check_every": 2.5}),
        ("max_epochs", {"max_epochs": 0}),
        ("max_epochs", {"max_epochs": -0.5}),
        ("lr", {"lr": 0.0}),
        ("batch_size", {"batch_size": 0}),
        ("x_forget", {"x_forget": torch.empty(0, 2), "y_forget": torch.empty(0).long()}),
        ("y_forget", {"y_forget": torch.zeros(3, dtype=torch.long)}),
        ("x_train", {"x_train": torch.empty(0, 2), "y_train": torch.empty(0).long()}),
    ],
)
def test_relearn_time_rejects_bad_arguments(parameter, overrides):
    arguments = {
        "x_train": torch.ones(4, 2),
        "y_train": torch.zeros(4, dtype=torch.long),
        "x_forget": torch.ones(2, 2),
        "y_forget": torch.zeros(2, dtype=torch.long),
        "threshold": 0.1,
    }
    arguments.update(overrides)
    model = _linear([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ConfigError, match=parameter) as excinfo:
        relearn_time(
            model,
            arguments.pop("x_train"),
            arguments.pop("y_train"),
            arguments.pop("x_forget"),
            arguments.pop("y_forget"),
            **arguments,
        )
    assert excinfo.value.parameter == parameter


# ------------------------------------------------------------------------------------ plots


def test_plot_entropy_histograms_writes_png(tmp_path):
    rng = np.random.default_rng(0)
    entropies = {
        "original": {
            "D_r": rng.uniform(0, 0.3, 200),
            "D_f": rng.uniform(0, 0.3, 50),
            "D_test": rng.uniform(0, 1.5, 100),
        },
        "retrain": {
            "D_r": rng.uniform(0, 0.3, 200),
            "D_f": rng.uniform(0, 1.5, 50),
            "D_test": np.array([]),  # skipped
        },
        "fisher": {"D_f": np.array([np.nan, 2.0, 2.2]), "D_test": rng.uniform(0, 1.5, 100)},
        "empty": {"D_f": np.array([])},
    }
    path = plot_entropy_histograms(entropies, tmp_path / "entropy.png", num_classes=10)
    assert path == tmp_path / "entropy.png"
    _assert_png(path)
    # Without num_classes the bins span [0, largest entropy seen]; all-zero entropies still plot.
    _assert_png(plot_entropy_histograms({"m": {"D_f": np.zeros(5)}}, tmp_path / "zeros.png"))


def test_plot_entropy_histograms_rejects_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="entropies"):
        plot_entropy_histograms({}, tmp_path / "none.png")
    with pytest.raises(ConfigError, match="num_classes"):
        plot_entropy_histograms({"m": {"D_f": np.ones(3)}}, tmp_path / "k.png", num_classes=1)
    assert not (tmp_path / "none.png").exists()


def test_plot_relearn_times_writes_png_with_not_reached(tmp_path):
    frame = pd.DataFrame(
        {
            "method": ["original", "retrain", "fisher", "newton"],
            "relearn_epochs": [0.1, 1.5, None, np.nan],
            "relearn_budget_epochs": [3.0, 3.0, 3.0, np.nan],
        }
    )
    _assert_png(plot_relearn_times(frame, tmp_path / "relearn.png"))
    # No budget column, retrain not reached, nothing reached at all.
    no_budget = pd.DataFrame({"method": ["retrain", "fisher"], "relearn_epochs": [np.nan, 0.4]})
    _assert_png(plot_relearn_times(no_budget, tmp_path / "no_budget.png"))
    nothing = pd.DataFrame({"method": ["a", "b"], "relearn_epochs": [np.nan, np.nan]})
    _assert_png(plot_relearn_times(nothing, tmp_path / "nothing.png"))


def test_plot_relearn_times_needs_its_columns(tmp_path):
    with pytest.raises(ConfigError, match="relearn_epochs") as excinfo:
        plot_relearn_times(pd.DataFrame({"method": ["a"]}), tmp_path / "bad.png")
    assert excinfo.value.parameter == "frame"


def test_plot_information_tradeoff_writes_png_dropping_bad_information(tmp_path):
    rows = []
    for method in ("fisher", "newton"):
        for lam, info in ((1e-8, 5e4), (1e-6, 2e3), (1e-4, 30.0), (1e-2, 0.0), (1.0, np.nan)):
            rows.append(
                {
                    "method": method,
                    "lam": lam,
                    "information_nats": info,
                    "error_forget": 0.02 + 0.1 * lam**0.1,
                    "error_test": 0.05 + 0.05 * lam**0.1,
                }
            )
    _assert_png(plot_information_tradeoff(pd.DataFrame(rows), tmp_path / "tradeoff.png"))
    # Every row dropped: the figure still says so instead of failing.
    nothing = pd.DataFrame(rows).assign(information_nats=np.nan)
    _assert_png(plot_information_tradeoff(nothing, tmp_path / "empty.png"))


def test_plot_information_tradeoff_needs_its_columns(tmp_path):
    frame = pd.DataFrame({"method": ["a"], "lam": [1.0], "information_nats": [1.0]})
    with pytest.raises(ConfigError, match="error_forget"):
        plot_information_tradeoff(frame, tmp_path / "bad.png")
