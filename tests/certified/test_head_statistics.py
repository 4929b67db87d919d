"""The sums behind the certified head: split over clients they add up to the central ones."""

from __future__ import annotations

import numpy as np
import pytest

from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import normalize_features, one_vs_rest_targets
from fedunlearn.certified.statistics import (
    HeadSums,
    RemovedParts,
    StepSums,
    head_sums,
    pack_symmetric,
    removed_parts,
    step_sums,
    unpack_symmetric,
    weighted_grams,
)
from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError


def _data(seed=0, n=90, d=6, classes=3):
    rng = np.random.default_rng(seed)
    x = normalize_features(rng.normal(size=(n, d)))
    labels = rng.integers(0, classes, size=n)
    return x, one_vs_rest_targets(labels, list(range(classes))), rng


def test_pack_and_unpack_symmetric_round_trip():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 5, 5))
    sym = a + a.transpose(0, 2, 1)
    packed = pack_symmetric(sym)
    assert packed.shape == (3, 15)
    np.testing.assert_array_equal(unpack_symmetric(packed, 5), sym)


@pytest.mark.parametrize("loss", ["logistic", "least-squares"])
def test_client_sums_add_up_to_the_central_sums(loss):
    x, t, rng = _data()
    w, w0, v = (rng.normal(size=(3, 6)) for _ in range(3))
    mask = rng.random(len(x)) > 0.2
    central = head_sums(loss, x, t, w, mask=mask)
    central_step = step_sums(loss, x, t, w, w0, v, mask=mask)
    splits = np.array_split(np.arange(len(x)), 4)
    client = [head_sums(loss, x[s], t[s], w, mask=mask[s]) for s in splits]
    client_step = [step_sums(loss, x[s], t[s], w, w0, v, mask=mask[s]) for s in splits]
    total = sum(client[1:], client[0])
    total_step = sum(client_step[1:], client_step[0])
    assert total.count == central.count == mask.sum()
    for a, b in (
        (total.loss, central.loss),
        (total.gradient, central.gradient),
        (total.hessian, central.hessian),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for name in ("point", "xv_squared", "hessian_vector"):
        np.testing.assert_allclose(
            getattr(total_step, name), getattr(central_step, name), rtol=1e-12, atol=1e-12
        )
    # The wire format keeps every digit.
    again = HeadSums.from_arrays(central.to_arrays())
    np.testing.assert_array_equal(again.hessian, central.hessian)
    assert (
        StepSums.from_arrays(central_step.to_arrays()).point.tolist() == central_step.point.tolist()
    )


def test_removed_parts_factor_is_the_hessian_part_at_the_anchor():
    x, t, rng = _data(1)
    w, w0 = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    parts = removed_parts("logistic", x[:5], t[:5], w, w0)
    hessian_at_anchor = head_sums("logistic", x[:5], t[:5], w0).hessian
    np.testing.assert_allclose(
        np.einsum("kmd,kme->kde", parts.factor, parts.factor), hessian_at_anchor, atol=1e-12
    )
    np.testing.assert_allclose(
        parts.gradient, head_sums("logistic", x[:5], t[:5], w, hessian=False).gradient
    )
    np.testing.assert_allclose(parts.gram, x[:5].T @ x[:5])
    again = RemovedParts.from_arrays(parts.to_arrays())
    np.testing.assert_array_equal(again.gram, parts.gram)
    # Without an anchor (exact mode) no factor is formed or sent.
    bare = removed_parts("logistic", x[:5], t[:5], w, None)
    assert bare.factor.shape == (3, 0, 6)
    np.testing.assert_array_equal(bare.gradient, parts.gradient)
    np.testing.assert_array_equal(bare.gram, parts.gram)


def test_single_precision_grams_are_close_but_not_equal():
    x, _, rng = _data(2, n=500, d=20)
    w = rng.random((500, 2))
    exact = weighted_grams(x, w)
    single = weighted_grams(x, w, single_precision=True)
    np.testing.assert_allclose(single, exact, rtol=1e-4, atol=1e-5)
    # float64 sums in another order agree to rounding, measured against the matrix's scale
    reference = (x * w[:, :1]).T @ x
    np.testing.assert_allclose(exact[0], reference, rtol=0, atol=1e-12 * np.abs(reference).max())


def test_central_data_reuses_the_previous_step_exactly_when_it_can():
    x, t, rng = _data(3)
    data = CentralHeadData("logistic", x, t)
    w0 = rng.normal(size=(3, 6))
    v1, v2 = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    data.step(w0, w0, v1)
    data.drop([4, 9])
    cached = data.step(w0 + v1, w0, v2)
    direct = step_sums("logistic", x, t, w0 + v1, w0, v2, mask=data.present)
    for name in ("point", "xv_squared", "hessian_vector"):
        np.testing.assert_allclose(getattr(cached, name), getattr(direct, name), rtol=1e-10)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("certified-mode", "slow"),
        ("certified-bound", "x"),
        ("certified-loss", "hinge"),
        ("certified-sigma", 0),
        ("certified-lambda", -1),
        ("certified-remove-clients", "12"),
        ("certified-noise", "none"),
        ("dp-noise-multiplier", -1),
        ("dp-clipping-norm", 0),
    ],
)
def test_certified_run_config_errors_name_the_key(key, value):
    with pytest.raises(ConfigError) as error:
        ExperimentConfig.from_run_config({"num-clients": 10, key: value})
    assert error.value.parameter == key
