"""FedQUIT (Mora et al., arXiv 2408.07587): the virtual teacher, the KD loss, the client step."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.models import BodyHeadNet
from fedunlearn.unlearning.fedquit import (
    VARIANTS,
    distillation_loss,
    fedquit_epochs,
    virtual_teacher,
)

E = math.e


def _softmax(values):
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def _row(tensor):
    return [float(v) for v in tensor[0]]


# ---------------------------------------------------------------- the virtual teacher by hand

TOY = torch.tensor([[2.0, 1.0, 0.0]])
LABEL0 = torch.tensor([0])


def test_min_teacher_on_the_toy_by_hand():
    # z = [2, 1, 0], y = 0: z_0 <- min z = 0, so the teacher is softmax([0, 1, 0]).
    expected = [1 / (2 + E), E / (2 + E), 1 / (2 + E)]
    assert _row(virtual_teacher(TOY, LABEL0, variant="min")) == pytest.approx(expected, abs=1e-6)
    global_true = E**2 / (E**2 + E + 1)  # softmax([2, 1, 0])_0 = 0.665
    assert expected[0] < global_true


def test_fixed_teacher_is_fedquit_logits_with_zero():
    # z = [3, 1, -1], y = 0, v = 0: softmax([0, 1, -1]) = [1, e, 1/e] / (1 + e + 1/e).
    z = torch.tensor([[3.0, 1.0, -1.0]])
    norm = 1 + E + 1 / E
    expected = [1 / norm, E / norm, (1 / E) / norm]
    got = virtual_teacher(z, LABEL0, variant="fixed", value=0.0)
    assert _row(got) == pytest.approx(expected, abs=1e-6)
    # and "min" sets z_0 to -1 instead: softmax([-1, 1, -1]).
    norm = 2 / E + E
    assert _row(virtual_teacher(z, LABEL0)) == pytest.approx([1 / E / norm, E / norm, 1 / E / norm])


def test_entropy_teacher_by_hand():
    # Non-true classes 1, 2 with logits 1, 0: q = [e, 1] / (e + 1); v* = e/(e+1) * 1 + 0.
    v_star = E / (E + 1)
    expected = _softmax([v_star, 1.0, 0.0])
    got = virtual_teacher(TOY, LABEL0, variant="entropy")
    assert _row(got) == pytest.approx(expected, abs=1e-6)


def test_softmax_teacher_by_hand():
    # p = softmax([2, 1, 0]); the true class gets 1/3, each other gains (p_0 - 1/3) / 2.
    p = _softmax([2.0, 1.0, 0.0])
    share = (p[0] - 1 / 3) / 2
    expected = [1 / 3, p[1] + share, p[2] + share]
    got = virtual_teacher(TOY, LABEL0, variant="softmax")
    assert _row(got) == pytest.approx(expected, abs=1e-6)
    assert sum(expected) == pytest.approx(1.0)


def test_temperature_divides_the_virtual_logits():
    # T = 2 on the min teacher: softmax([0, 1, 0] / 2) = [1, e^0.5, 1] / (2 + e^0.5).
    root = math.sqrt(E)
    expected = [1 / (2 + root), root / (2 + root), 1 / (2 + root)]
    got = virtual_teacher(TOY, LABEL0, temperature=2.0)
    assert _row(got) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_teacher_keeps_the_non_true_ranking_and_lowers_the_true_class(variant):
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(64, 10, generator=generator)
    labels = logits.argmax(dim=1)  # a competent global model: p_y >= 1/K always
    teacher = virtual_teacher(logits, labels, variant=variant, value=-5.0)
    glob = torch.softmax(logits, dim=1)
    rows = torch.arange(64)
    assert torch.all(teacher[rows, labels] < glob[rows, labels])
    torch.testing.assert_close(teacher.sum(dim=1), torch.ones(64))
    for i in range(64):
        keep = torch.arange(10) != labels[i]
        assert torch.equal(teacher[i, keep].argsort(), logits[i, keep].argsort())


def test_softmax_teacher_stays_a_distribution_when_the_true_class_is_already_unlikely():
    # p_y < 1/K would make a non-true entry negative; the teacher is clamped and renormalised.
    z = torch.tensor([[-10.0, 8.0, -9.0]])
    teacher = virtual_teacher(z, LABEL0, variant="softmax")
    assert torch.all(teacher >= 0)
    assert float(teacher.sum()) == pytest.approx(1.0)


def test_teacher_refuses_bad_input():
    with pytest.raises(ConfigError, match="variant"):
        virtual_teacher(TOY, LABEL0, variant="logits")
    with pytest.raises(ConfigError, match="temperature"):
        virtual_teacher(TOY, LABEL0, temperature=0.0)
    with pytest.raises(ConfigError, match="labels"):
        virtual_teacher(TOY, torch.tensor([3]))
    with pytest.raises(ConfigError, match="labels"):
        virtual_teacher(TOY, torch.tensor([0.0]))
    with pytest.raises(ConfigError, match="value"):
        virtual_teacher(TOY, LABEL0, variant="fixed", value=math.nan)


# ---------------------------------------------------------------- the distillation loss


def test_loss_is_zero_when_the_student_is_the_teacher():
    logits = torch.tensor([[0.3, -1.0, 2.0], [1.0, 1.0, 1.0]])
    teacher = torch.softmax(logits / 3.0, dim=1)
    assert float(distillation_loss(logits, teacher, 3.0)) == pytest.approx(0.0, abs=1e-6)


def test_loss_is_the_forward_kl_by_hand():
    # teacher [1/4, 3/4], student softmax([0, 0]) = [1/2, 1/2]:
    # KL = 1/4 ln(1/2) + 3/4 ln(3/2).
    teacher = torch.tensor([[0.25, 0.75]])
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert float(distillation_loss(torch.zeros(1, 2), teacher)) == pytest.approx(expected)
    # With T = 2 the student's logits [0, 2] become softmax([0, 1]) = [1, e] / (1 + e),
    # and the T^2 option multiplies by 4.
    s = [1 / (1 + E), E / (1 + E)]
    expected = 0.25 * math.log(0.25 / s[0]) + 0.75 * math.log(0.75 / s[1])
    student = torch.tensor([[0.0, 2.0]])
    assert float(distillation_loss(student, teacher, 2.0)) == pytest.approx(expected, abs=1e-6)
    scaled = distillation_loss(student, teacher, 2.0, scale_by_temperature_squared=True)
    assert float(scaled) == pytest.approx(4 * expected, abs=1e-6)


def test_loss_ignores_classes_the_teacher_gives_no_mass():
    teacher = torch.tensor([[0.0, 1.0]])
    student = torch.tensor([[0.0, math.log(3.0)]])  # softmax = [1/4, 3/4]
    assert float(distillation_loss(student, teacher)) == pytest.approx(-math.log(0.75))


def test_loss_refuses_mismatched_shapes():
    with pytest.raises(ConfigError, match="teacher_probs"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4))


# ---------------------------------------------------------------- the client step


def _blobs(n_per_class=40, k=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    # Centres on a line, 5 apart: a class's neighbours on the line are its runners-up, so the
    # non-true ranking the teacher must keep is a real structure, not noise between equals.
    centres = torch.zeros(k, 8)
    centres[:, 0] = 5 * torch.arange(k, dtype=torch.float32)
    x = torch.cat([centres[c] + torch.randn(n_per_class, 8, generator=generator) for c in range(k)])
    y = torch.arange(k).repeat_interleave(n_per_class)
    return x, y


@pytest.fixture(scope="module")
def global_model():
    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    model = BodyHeadNet(body, 16, 4)
    x, y = _blobs()
    train_epochs(model, x, y, epochs=30, lr=0.1, batch_size=32, seed=0, momentum=0.9)
    return model


def test_fedquit_forgets_the_client_data_but_keeps_the_other_classes_order(global_model):
    x, y = _blobs(n_per_class=20, seed=1)  # the leaving client's data
    assert evaluate(global_model, x, y).accuracy > 0.95
    with torch.no_grad():
        before = global_model.eval()(x)
    teacher = virtual_teacher(before, y)
    student = copy.deepcopy(global_model)
    fedquit_epochs(student, x, y, epochs=30, lr=3e-2, batch_size=16, seed=0)
    # The min teacher's argmax is never the true class: accuracy falls to (and past) chance 1/4.
    assert evaluate(student, x, y).accuracy < 0.25
    with torch.no_grad():
        after = student.eval()(x)
    # The student has moved to the teacher: its KL to it is a fraction of the global model's.
    assert distillation_loss(after, teacher) < 0.2 * distillation_loss(before, teacher)
    keep = torch.ones_like(before, dtype=torch.bool)
    keep[torch.arange(len(y)), y] = False
    best_before = before[keep].view(len(y), 3).argmax(dim=1)
    best_after = after[keep].view(len(y), 3).argmax(dim=1)
    # The global model's best non-true class stays the student's best non-true class.
    assert (best_before == best_after).float().mean() > 0.9


def test_fedquit_is_deterministic_for_a_seed(global_model):
    x, y = _blobs(n_per_class=10, seed=2)
    models = [copy.deepcopy(global_model) for _ in range(3)]
    losses = [
        fedquit_epochs(model, x, y, epochs=2, lr=1e-2, batch_size=8, seed=seed)
        for model, seed in zip(models, (5, 5, 6))
    ]
    assert losses[0] == losses[1]
    for name, value in models[0].state_dict().items():
        assert torch.equal(value, models[1].state_dict()[name])
    assert any(
        not torch.equal(value, models[2].state_dict()[name])
        for name, value in models[0].state_dict().items()
    )


def test_fedquit_with_sgd_lowers_the_distillation_loss(global_model):
    x, y = _blobs(n_per_class=10, seed=3)
    student = copy.deepcopy(global_model)
    first = fedquit_epochs(student, x, y, epochs=1, lr=0.05, batch_size=8, seed=0, optimizer="sgd")
    later = fedquit_epochs(
        student, x, y, epochs=5, lr=0.05, batch_size=8, seed=0, optimizer="sgd", momentum=0.9
    )
    # The second call's teacher is the already-distilled student: its loss starts lower.
    assert later < first


@pytest.mark.parametrize(
    ("parameter", "options"),
    [
        ("epochs", {"epochs": 0}),
        ("lr", {"lr": -1.0}),
        ("batch_size", {"batch_size": 0}),
        ("optimizer", {"optimizer": "rmsprop"}),
        ("variant", {"variant": "max"}),
        ("temperature", {"temperature": math.inf}),
    ],
)
def test_fedquit_refuses_bad_arguments(global_model, parameter, options):
    x, y = _blobs(n_per_class=2)
    arguments = {"epochs": 1, "lr": 1e-3, "batch_size": 4, "seed": 0} | options
    with pytest.raises(ConfigError, match=parameter):
        fedquit_epochs(copy.deepcopy(global_model), x, y, **arguments)


def test_fedquit_refuses_an_empty_forget_set(global_model):
    with pytest.raises(ConfigError, match="x"):
        fedquit_epochs(
            copy.deepcopy(global_model),
            torch.zeros(0, 8),
            torch.zeros(0, dtype=torch.long),
            epochs=1,
            lr=1e-3,
            batch_size=4,
            seed=0,
        )
