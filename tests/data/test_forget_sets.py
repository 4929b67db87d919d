"""The cohort D_f: parsing, each client's mask, and errors that name the value."""

from __future__ import annotations

import numpy as np
import pytest

from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.errors import ConfigError

LABELS = np.array([0, 5, 1, 5, 5, 2, 5, 3])


@pytest.mark.parametrize("text", ["class:5", "client:3", "samples:2:10", "samples:2:10:5"])
def test_every_form_parses_and_prints_back(text):
    assert str(ForgetSet.parse(text, num_clients=4, num_classes=10)) == text


def test_class_cohort_is_every_sample_of_the_class_on_every_client():
    forget = ForgetSet.parse("class:5", num_clients=4)
    for partition in range(4):
        np.testing.assert_array_equal(forget.mask(LABELS, partition, seed=0), LABELS == 5)


def test_client_cohort_is_all_of_that_client_and_nothing_elsewhere():
    forget = ForgetSet.parse("client:1", num_clients=4)
    assert forget.mask(LABELS, 1, seed=0).all()
    assert not forget.mask(LABELS, 0, seed=0).any()
    assert forget.involves(1) and not forget.involves(2)


def test_samples_are_the_requested_count_of_the_class_and_the_same_for_every_party():
    forget = ForgetSet.parse("samples:2:3:5", num_clients=4)
    mask = forget.mask(LABELS, 2, seed=7)
    assert mask.sum() == 3 and (LABELS[mask] == 5).all()
    np.testing.assert_array_equal(mask, forget.mask(LABELS, 2, seed=7))
    assert not forget.mask(LABELS, 1, seed=7).any()
    draws = {tuple(np.flatnonzero(forget.mask(LABELS, 2, seed=s))) for s in range(20)}
    assert len(draws) > 1  # the seed picks which samples


@pytest.mark.parametrize(
    "text", ["", "class", "class:x", "class:1:2", "client:4", "samples:1", "samples:1:0", "row:1"]
)
def test_bad_cohorts_name_the_parameter_and_the_value(text):
    with pytest.raises(ConfigError) as error:
        ForgetSet.parse(text, num_clients=4, num_classes=10)
    assert error.value.parameter == "scrub-forget" and text in str(error.value)


def test_a_class_outside_the_dataset_and_too_few_samples_are_refused():
    with pytest.raises(ConfigError, match="0..9"):
        ForgetSet.parse("class:10", num_clients=4, num_classes=10)
    with pytest.raises(ConfigError, match="at most 4"):
        ForgetSet.parse("samples:0:5:5", num_clients=4).mask(LABELS, 0, seed=0)
