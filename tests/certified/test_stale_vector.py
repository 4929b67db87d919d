"""The fast mode's float32 stale vector: every number it hands the certificate bounds its exact
float64 counterpart, and the certificate built on it never falls below the true residual."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedunlearn.certified.certificate import CertifiedRemovalParams
from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import normalize_features, one_vs_rest_targets, second_derivative
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.certified.staleness import rounding_gamma, stale_terms
from fedunlearn.certified.statistics import weighted_grams
from fedunlearn.errors import ConfigError


def _exact(loss, x, t, present, w, w0, v):
    """The float64 values the float32 terms stand for."""
    b = (x @ v.T) * present[:, None]
    change = second_derivative(loss, x @ w.T, t) - second_derivative(loss, x @ w0.T, t)
    stale = ((change * present[:, None]) * b).T @ x
    return np.sum(b**4, axis=0), np.sum(b**2, axis=0), stale


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(5, 600),
    d=st.sampled_from([1, 3, 40, 300]),
    heads=st.integers(1, 3),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e3]),
    step_scale=st.sampled_from([1e-9, 1e-4, 1e-1, 10.0]),
    drift_scale=st.sampled_from([0.0, 1e-6, 1e-2, 3.0]),
    spread=st.sampled_from([0.0, 8.0]),
    loss=st.sampled_from(["logistic", "least-squares"]),
    carried=st.sampled_from([None, 0.0, 1e-6, 1e-3]),
)
def test_float32_terms_bound_their_float64_values(
    seed, n, d, heads, scale, step_scale, drift_scale, spread, loss, carried
):
    """Adversarial magnitudes: weights up to 1e3 (scores in the flat tails and near 0), steps from
    1e-9 to 10, features whose coordinates span 8 orders of magnitude, rows of norm exactly 1; a
    carried drift ``X (w - w0)`` off by its whole declared error, in the worst direction."""
    rng = np.random.default_rng(seed)
    raw = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-spread, 0, size=d)
    x = normalize_features(raw)
    t = np.where(rng.random((n, heads)) < 0.5, -1.0, 1.0)
    present = rng.random(n) < 0.9
    w0 = scale * rng.normal(size=(heads, d)) / np.sqrt(d)
    w = w0 + drift_scale * rng.normal(size=(heads, d))
    v = step_scale * rng.normal(size=(heads, d))
    drift = None
    if carried is not None:
        error = np.full((n, heads), carried)
        sign = np.where(rng.random((n, heads)) < 0.5, -1.0, 1.0)
        drift = (x @ (w - w0).T + sign * error, error)
    terms = stale_terms(
        loss,
        x.astype(np.float32),
        np.linalg.norm(x, axis=1),
        t,
        present,
        x @ w0.T,
        w,
        w0,
        v,
        drift=drift,
    )
    b4, b2, stale = _exact(loss, x, t, present, w, w0, v)
    assert np.all(terms["b4"] >= b4 * (1 - 1e-12))
    assert np.all(terms["b2"] >= b2 * (1 - 1e-12))
    error = np.linalg.norm(stale - terms["stale"], axis=1)
    assert np.all(error <= terms["stale_error"] * (1 + 1e-9) + 1e-300), (error, terms)


def test_the_carried_drift_bounds_its_distance_to_the_exact_one():
    """``next_drift`` after several steps: its declared error covers X (w - w0) computed in float64."""
    rng = np.random.default_rng(3)
    x = normalize_features(rng.normal(size=(500, 30)))
    t = np.where(rng.random((500, 2)) < 0.5, -1.0, 1.0)
    present = np.ones(500, dtype=bool)
    w0 = rng.normal(size=(2, 30))
    w, drift = w0.copy(), None
    for _ in range(20):
        v = 0.05 * rng.normal(size=(2, 30))
        terms = stale_terms(
            "logistic", x.astype(np.float32), np.ones(500), t, present, x @ w0.T, w, w0, v,
            drift=drift,
        )  # fmt: skip
        drift = terms["next_drift"]
        w = w + v
        gap = np.abs(drift[0] - x @ (w - w0).T)
        assert np.all(gap <= drift[1] * (1 + 1e-9))
    assert np.all(drift[1] > 0)


def test_rounding_gamma_refuses_sums_too_long_for_float32():
    assert rounding_gamma(10) == pytest.approx(10 * 2.0**-24, rel=1e-6)
    with pytest.raises(ConfigError) as error:
        rounding_gamma(2**24)
    assert error.value.parameter == "length"


def test_float32_step_terms_track_the_float64_ones():
    """Not only sound: the float32 bounds exceed the float64 values by a rounding's worth."""
    rng = np.random.default_rng(1)
    x = normalize_features(rng.normal(size=(2000, 50)) + 0.2)
    t = np.where(rng.random((2000, 1)) < 0.5, -1.0, 1.0)
    present = np.ones(2000, dtype=bool)
    w0 = rng.normal(size=(1, 50))
    w, v = w0 + 0.05 * rng.normal(size=(1, 50)), 0.01 * rng.normal(size=(1, 50))
    terms = stale_terms(
        "logistic", x.astype(np.float32), np.ones(2000), t, present, x @ w0.T, w, w0, v
    )
    b4, b2, stale = _exact("logistic", x, t, present, w, w0, v)
    assert terms["b4"] == pytest.approx(b4, rel=1e-3)
    assert terms["b2"] == pytest.approx(b2, rel=1e-3)
    assert terms["stale_error"][0] < 0.05 * np.linalg.norm(stale)


def _mnist_like(seed: int, n: int, d: int):
    rng = np.random.default_rng(seed)
    x = normalize_features(rng.normal(size=(n, d)) + 0.4)
    labels = (x @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0).astype(int)
    return x, one_vs_rest_targets(labels, [0, 1])


@pytest.mark.parametrize("order", ["random", "worst-fit-first"])
def test_a_long_stream_without_refresh_stays_certified(order):
    """300 removals from 600 samples on one anchor (refresh_ratio huge, max_rank above the
    stream): the anchor drifts far, the bound must still cover the true residual every time."""
    x, targets = _mnist_like(2, 600, 12)
    head = CertifiedHead(
        CentralHeadData("logistic", x, targets),
        CertifiedRemovalParams(
            sigma=1.0, lam=1e-3, mode="fast", refresh_ratio=1e9, max_rank=1000, epsilon=1e6
        ),
        rng=np.random.default_rng(0),
    )
    head.fit()
    if order == "random":
        sequence = np.random.default_rng(3).permutation(600)[:300]
    else:  # the samples the model fits worst (smallest margins) move w the most
        sequence = np.argsort(x @ head.weights[0] * targets[:, 0])[:300]
    refreshes = 0
    for index in sequence:
        certificate = head.remove([int(index)])
        refreshes += certificate.refreshed
        assert head.residual() <= head.beta * (1 + 1e-9)
    assert refreshes == 0
    assert np.linalg.norm(head.weights - head._anchor) > 0.1 * np.linalg.norm(head.weights)


def test_fast_mode_bound_stays_near_exact_mode_without_refreshing():
    """The measured stale vector replaces the drift-widened bound: 100 removals on one anchor cost
    at most twice exact mode's beta (the drift bound cost several times more)."""
    x, targets = _mnist_like(4, 1500, 20)
    betas = {}
    for mode in ("exact", "fast"):
        head = CertifiedHead(
            CentralHeadData("logistic", x, targets),
            CertifiedRemovalParams(sigma=1.0, epsilon=1e6, lam=1e-3, mode=mode, max_rank=200),
            rng=np.random.default_rng(7),
        )
        head.fit()
        certificates = [head.remove([i]) for i in range(100)]
        assert not any(c.retrained for c in certificates)
        if mode == "fast":
            assert not any(c.refreshed for c in certificates)
        betas[mode] = head.beta
    assert betas["exact"] <= betas["fast"] <= 2.0 * betas["exact"]


def test_refresh_ratio_sets_how_stale_the_anchor_may_get():
    """Refresh when the stale parts since the anchor exceed refresh_ratio times the rest of the
    bounds: a tiny ratio refreshes every other request, a huge one never."""
    x, targets = _mnist_like(5, 300, 8)
    counts = {}
    for ratio in (1e-9, 1e9):
        head = CertifiedHead(
            CentralHeadData("logistic", x, targets),
            CertifiedRemovalParams(sigma=1.0, lam=1e-2, mode="fast", refresh_ratio=ratio),
            rng=np.random.default_rng(1),
        )
        head.fit()
        counts[ratio] = sum(head.remove([i]).refreshed for i in range(20))
    assert counts[1e9] == 0
    assert counts[1e-9] >= 9


def test_gram_of_the_remaining_rows_is_the_full_gram_downdated():
    x, targets = _mnist_like(6, 200, 5)
    data = CentralHeadData("logistic", x, targets)
    data.gram()
    for drop in ([3, 7], list(range(20, 130))):  # few removed: downdate; most: formed afresh
        data.drop(drop)
        expected = weighted_grams(x, data.present[:, None].astype(float))[0]
        np.testing.assert_allclose(data.gram(), expected, atol=1e-10)


def test_a_data_without_a_stale_vector_keeps_the_drift_bound():
    """HeadData without ``measures_staleness`` (a federation's) gets the drift-widened bound and
    the drift refresh rule; its certificate holds as well."""

    class DriftOnly(CentralHeadData):
        measures_staleness = False

        def step(self, weights, anchor, step, *, hessian_vector=True):
            return super().step(weights, anchor, step, hessian_vector=hessian_vector)

    x, targets = _mnist_like(8, 300, 6)
    head = CertifiedHead(
        DriftOnly("logistic", x, targets),
        CertifiedRemovalParams(sigma=1.0, lam=1e-2, mode="fast", refresh_ratio=2.0),
        rng=np.random.default_rng(2),
    )
    head.fit()
    refreshed = [head.remove([i]).refreshed for i in range(30)]
    assert head.residual() <= head.beta
    assert any(refreshed)
