"""The planted backdoor: the trigger sits where it should, on the chosen samples only, by seed."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.data.backdoor import (
    Trigger,
    attack_success_rate,
    image_trigger,
    make_trigger,
    plant_backdoor,
    tabular_trigger,
    triggered_test_set,
)
from fedunlearn.errors import ConfigError


def _images(n=40, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 8, 8, generator=generator)
    y = torch.arange(n) % 4
    return x, y


def _table(n=50, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=generator)
    x[:, 2] = 1.0  # a constant feature: never part of the pattern
    x[:, 4] *= 10.0  # the widest range
    y = torch.arange(n) % 2
    return x, y


def test_the_patch_is_the_bottom_right_3x3_at_the_training_maximum_and_nothing_else_changes():
    x, _ = _images()
    trigger = image_trigger(x)
    assert trigger.values == (float(x.max()),)
    triggered = trigger.apply(x[5])
    assert torch.all(triggered[:, 5:, 5:] == x.max())
    untouched = torch.ones(8, 8, dtype=torch.bool)
    untouched[5:, 5:] = False
    assert torch.equal(triggered[:, untouched], x[5][:, untouched])
    # A batch gets the same stamp per sample, and the input is not changed in place.
    before = x.clone()
    batch = trigger.apply(x)
    assert torch.equal(batch[5], triggered)
    assert torch.equal(x, before)


def test_the_tabular_pattern_lies_outside_the_training_range():
    x, _ = _table()
    trigger = tabular_trigger(x)
    assert len(trigger.features) == 3 and 2 not in trigger.features and 4 in trigger.features
    triggered = trigger.apply(x)
    maxima, minima = x.max(dim=0).values, x.min(dim=0).values
    for feature, value in zip(trigger.features, trigger.values, strict=True):
        assert value == pytest.approx(
            float(maxima[feature] + 3 * (maxima[feature] - minima[feature]))
        )
        assert torch.all(triggered[:, feature] > maxima[feature])
    others = [f for f in range(6) if f not in trigger.features]
    assert torch.equal(triggered[:, others], x[:, others])
    assert make_trigger(x) == trigger and make_trigger(_images()[0]).kind == "patch"


def test_planting_changes_round_fraction_n_samples_of_other_classes_only():
    x, y = _images(n=40)
    trigger = image_trigger(x)
    x_before, y_before = x.clone(), y.clone()
    x2, y2, planted = plant_backdoor(
        x, y, trigger=trigger, fraction=0.25, target_class=1, num_classes=4, seed=3
    )
    assert len(planted) == 10
    assert torch.all(y[planted] != 1) and torch.all(y2[planted] == 1)
    assert torch.equal(x2[planted], trigger.apply(x[planted]))
    others = torch.ones(40, dtype=torch.bool)
    others[planted] = False
    assert torch.equal(x2[others], x[others]) and torch.equal(y2[others], y[others])
    assert torch.equal(x, x_before) and torch.equal(y, y_before)


def test_planting_is_determined_by_the_seed():
    x, y = _images(n=40)
    trigger = image_trigger(x)

    def planted(seed):
        return plant_backdoor(
            x, y, trigger=trigger, fraction=0.2, target_class=0, num_classes=4, seed=seed
        )[2]

    assert torch.equal(planted(1), planted(1))
    assert not torch.equal(planted(1), planted(2))


def test_a_full_fraction_plants_every_sample_of_another_class():
    x, y = _table(n=20)
    _, y2, planted = plant_backdoor(
        x, y, trigger=tabular_trigger(x), fraction=1.0, target_class=0, num_classes=2, seed=0
    )
    assert torch.equal(planted, torch.nonzero(y == 1).flatten())
    assert torch.all(y2 == 0)


@pytest.mark.parametrize(
    ("fraction", "target_class", "parameter"),
    [
        (0.0, 0, "judge-backdoor-fraction"),
        (1.5, 0, "judge-backdoor-fraction"),
        (0.001, 0, "judge-backdoor-fraction"),
        (0.5, 4, "judge-backdoor-class"),
        (0.5, -1, "judge-backdoor-class"),
    ],
)
def test_bad_settings_name_the_parameter(fraction, target_class, parameter):
    x, y = _images(n=40)
    with pytest.raises(ConfigError) as caught:
        plant_backdoor(
            x,
            y,
            trigger=image_trigger(x),
            fraction=fraction,
            target_class=target_class,
            num_classes=4,
            seed=0,
        )
    assert caught.value.parameter == parameter


def test_bad_triggers_are_refused():
    with pytest.raises(ConfigError, match="kind"):
        Trigger("stripe", (1.0,))
    with pytest.raises(ConfigError, match="num_features"):
        tabular_trigger(torch.ones(5, 3))
    with pytest.raises(ConfigError, match="size"):
        image_trigger(torch.randn(2, 1, 4, 4), size=5)


def test_the_triggered_test_set_holds_other_classes_stamped():
    x, y = _images(n=12)
    trigger = image_trigger(x)
    triggered = triggered_test_set(x, y, trigger=trigger, target_class=2)
    assert len(triggered) == int((y != 2).sum())
    assert torch.equal(triggered, trigger.apply(x[y != 2]))


def test_attack_success_rate_is_the_share_predicted_as_the_target():
    assert attack_success_rate(torch.tensor([1, 1, 0, 3]), 1) == 0.5
    assert attack_success_rate(torch.tensor([2, 2, 2]), 2) == 1.0
    assert attack_success_rate(torch.tensor([0, 1, 3]), 2) == 0.0
    assert attack_success_rate(torch.tensor([], dtype=torch.long), 2) != attack_success_rate(
        torch.tensor([], dtype=torch.long), 2
    )  # nan: no triggered samples, no rate
