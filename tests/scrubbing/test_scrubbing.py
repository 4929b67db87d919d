"""Scrubbing math (Golatkar et al. 2020): Newton scrub, Fisher forgetting, D_f-only, the KL bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_scrub import (
    fisher_forgetting,
    forget_only_curvature,
    gaussian_kl,
    newton_scrub,
    softmax_head_sums,
)
from torch import nn

from fedunlearn.certified.curvature import assemble_hessian, head_sums
from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.scrubbers import (
    diagonal_fisher,
    fisher_gaussian,
    fisher_sample,
    psd_power,
    reference_fisher_gaussian,
    reference_fisher_variance,
)


def _spd(rng, k):
    a = rng.normal(size=(k + 3, k))
    return a.T @ a + 0.5 * np.eye(k)


def test_noiseless_newton_scrub_on_a_quadratic_lands_on_the_retrained_minimiser():
    """Proposition 3 as t -> infinity: L_Dr(w) = (w - w*)^T A (w - w*) / 2, one Newton step hits w*."""
    rng = np.random.default_rng(0)
    a = _spd(rng, 6)
    w_star, w = rng.normal(size=6), rng.normal(size=6)
    scrubbed = newton_scrub(w, a @ (w - w_star), a, lam=0.0, sigma_h=1.0)
    np.testing.assert_allclose(scrubbed.weights, w_star, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scrubbed.covariance, 0.0)


def test_newton_scrub_noise_has_the_stated_covariance_and_scales_with_lambda_and_sigma():
    rng = np.random.default_rng(1)
    b = _spd(rng, 3)
    w = np.zeros(3)
    draws = np.stack(
        [
            newton_scrub(w, np.zeros(3), b, lam=0.01, sigma_h=2.0, rng=rng).weights
            for _ in range(20000)
        ]
    )
    expected = np.sqrt(0.01) * 2.0 * psd_power(b, -0.5)
    np.testing.assert_allclose(np.cov(draws.T), expected, atol=0.02 * np.abs(expected).max())
    # std ~ (lambda sigma_h^2)^{1/4}: 16x lambda doubles it, 4x sigma_h doubles it.
    base = newton_scrub(w, np.zeros(3), b, lam=0.01, sigma_h=2.0).covariance
    np.testing.assert_allclose(
        newton_scrub(w, np.zeros(3), b, lam=0.16, sigma_h=2.0).covariance, 4 * base
    )
    np.testing.assert_allclose(
        newton_scrub(w, np.zeros(3), b, lam=0.01, sigma_h=8.0).covariance, 4 * base
    )


def test_fisher_forgetting_noise_follows_the_chosen_power():
    f = np.array([1e-2, 1.0, 16.0])
    quarter = fisher_forgetting(np.zeros(3), f, lam=1.0, sigma_h=1.0).covariance
    half = fisher_forgetting(np.zeros(3), f, lam=1.0, sigma_h=1.0, power=-0.5).covariance
    np.testing.assert_allclose(quarter, f**-0.5)
    np.testing.assert_allclose(half, f**-1.0)
    with pytest.raises(ConfigError) as error:
        fisher_forgetting(np.zeros(3), f, lam=1.0, sigma_h=1.0, power=-1.0)
    assert error.value.parameter == "power"


def test_gaussian_kl_matches_closed_forms():
    assert gaussian_kl(np.zeros(1), np.ones(1), np.ones(1), np.full(1, 4.0)) == pytest.approx(
        0.5 * (1 / 4 + 1 / 4 - 1 + np.log(4))
    )
    rng = np.random.default_rng(2)
    c0, c1 = _spd(rng, 4), _spd(rng, 4)
    m0, m1 = rng.normal(size=4), rng.normal(size=4)
    assert gaussian_kl(m0, c0, m0, c0) == pytest.approx(0.0, abs=1e-12)
    inv1 = np.linalg.inv(c1)
    expected = 0.5 * (
        np.trace(inv1 @ c0)
        + (m1 - m0) @ inv1 @ (m1 - m0)
        - 4
        + np.log(np.linalg.det(c1) / np.linalg.det(c0))
    )
    assert gaussian_kl(m0, c0, m1, c1) == pytest.approx(expected, rel=1e-10)
    d0, d1 = np.array([1.0, 2.0]), np.array([3.0, 0.5])
    assert gaussian_kl(m0[:2], d0, m1[:2], d1) == pytest.approx(
        gaussian_kl(m0[:2], np.diag(d0), m1[:2], np.diag(d1)), rel=1e-12
    )


def test_forget_only_variant_equals_the_retained_variant_at_an_exact_minimum():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 3))
    labels = rng.integers(0, 3, size=60)
    reg = 1.0  # L_D = CE + reg/2 ||w||^2, minimised exactly by Newton
    w = np.zeros(9)
    for _ in range(50):
        _, g, h = softmax_head_sums(x, labels, w.reshape(3, 3))
        w -= np.linalg.solve(h + reg * np.eye(9), g + reg * w)
    forget = np.arange(10)
    keep = np.arange(10, 60)
    _, g_r, h_r = softmax_head_sums(x[keep], labels[keep], w.reshape(3, 3))
    _, g_f, h_f = softmax_head_sums(x[forget], labels[forget], w.reshape(3, 3))
    _, _, h_d = softmax_head_sums(x, labels, w.reshape(3, 3))
    # Regulariser on the retained side: grad L_Dr = g_r + reg w, H_Dr = h_r + reg I.
    b, g = forget_only_curvature(h_d + reg * np.eye(9), h_f, g_f)
    np.testing.assert_allclose(b, h_r + reg * np.eye(9), atol=1e-10)
    np.testing.assert_allclose(g, g_r + reg * w, atol=1e-9)
    only_f = newton_scrub(w, g, b, lam=0.0, sigma_h=0.0)
    with_r = newton_scrub(w, g_r + reg * w, h_r + reg * np.eye(9), lam=0.0, sigma_h=0.0)
    np.testing.assert_allclose(only_f.weights, with_r.weights, atol=1e-9)


def test_softmax_head_hessian_matches_finite_differences():
    rng = np.random.default_rng(4)
    x, labels, w = rng.normal(size=(20, 3)), rng.integers(0, 4, size=20), rng.normal(size=(4, 3))
    _, g, h = softmax_head_sums(x, labels, w)
    eps = 1e-6
    numeric = np.zeros_like(h)
    for j in range(12):
        step = np.zeros(12)
        step[j] = eps
        numeric[:, j] = (
            softmax_head_sums(x, labels, (w.ravel() + step).reshape(4, 3))[1]
            - softmax_head_sums(x, labels, (w.ravel() - step).reshape(4, 3))[1]
        ) / (2 * eps)
    np.testing.assert_allclose(h, numeric, atol=1e-6)


def test_client_block_sums_add_up_to_the_exact_head_hessian():
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(60, 4)), np.ones((60, 1))])
    y = rng.integers(0, 3, size=60)
    w = rng.normal(size=(3, 5))
    loss, gradient, hessian = softmax_head_sums(x, y, w)
    parts = [head_sums(x[:25], y[:25], w), head_sums(x[25:], y[25:], w)]
    total = {k: sum(p[k].astype(np.float64) for p in parts) for k in parts[0]}
    assert np.isclose(total["loss"][0], loss, rtol=1e-12)
    np.testing.assert_allclose(total["gradient"].ravel(), gradient, rtol=1e-12)
    # blocks travel in float32: the assembled Hessian matches to single precision
    np.testing.assert_allclose(assemble_hessian(total["blocks"], 3, 5), hessian, atol=1e-5)
    assert head_sums(x[:0], y[:0], w)["blocks"].shape == parts[0]["blocks"].shape


@pytest.mark.parametrize("power", [-0.25, -0.5])
def test_fisher_scrub_draws_eq_8_as_the_reference_does(power):
    """Per tensor, mean w and std (lambda sigma_h^2)^{1/4} F^power: the same draw as eq. 8 on the
    flat vector, where F is above the floor."""
    rng = np.random.default_rng(5)
    weights = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=4)}
    fisher = {name: rng.uniform(0.5, 3.0, size=w.shape) for name, w in weights.items()}
    mean, base = fisher_gaussian(weights, fisher, power=power, floor=1e-3)
    drawn = fisher_sample(mean, base, 0.04, 1.5, np.random.default_rng(7))
    noise = np.random.default_rng(7)
    for name in weights:
        expected = fisher_forgetting(weights[name], fisher[name], 0.04, 1.5, power=power, rng=noise)
        np.testing.assert_allclose(drawn[name], expected.weights, rtol=1e-12)
        np.testing.assert_allclose(np.sqrt(0.04) * 1.5 * base[name], expected.covariance)
    # F below the floor: the noise stays finite (the floor caps it), zero Fisher included.
    _, floored = fisher_gaussian(weights, {"a": np.zeros((3, 2))}, power=power, floor=1e-3)
    np.testing.assert_allclose(floored["a"], 1e-3 ** (2 * power))
    with pytest.raises(ConfigError):
        fisher_gaussian(weights, fisher, power=-1.0, floor=1e-3)


def test_reference_fisher_scrub_resets_the_forgotten_class_row_to_zero_mean():
    rng = np.random.default_rng(6)
    weights = {"head.weight": rng.normal(size=(3, 4)), "head.bias": rng.normal(size=3)}
    fisher = {name: rng.uniform(0.5, 3.0, size=w.shape) for name, w in weights.items()}
    mean, base = reference_fisher_gaussian(weights, fisher, forget_class=2)
    expected_base, _ = reference_fisher_variance(fisher, forget_class=2)
    for name in weights:
        np.testing.assert_array_equal(base[name], expected_base[name])
        np.testing.assert_array_equal(mean[name][:2], weights[name][:2])
        assert not mean[name][2].any()
    kept, _ = reference_fisher_gaussian(weights, fisher)
    np.testing.assert_array_equal(kept["head.weight"], weights["head.weight"])


def test_diagonal_fisher_matches_a_per_sample_brute_force():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x = torch.randn(7, 4, dtype=torch.float64)
    fisher = diagonal_fisher(model, x, samples=None, batch_size=3)
    brute = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for i in range(len(x)):
        probs = torch.softmax(model(x[i : i + 1]), dim=1)[0].detach()
        for c in range(3):
            model.zero_grad()
            torch.log_softmax(model(x[i : i + 1]), dim=1)[0, c].backward()
            for name, p in model.named_parameters():
                brute[name] += probs[c] * p.grad.square()
    for name in brute:
        torch.testing.assert_close(fisher[name], brute[name] / len(x))
    # Sampled labels (eq. 8) estimate the same expectation.
    sampled = diagonal_fisher(
        model, x.repeat(300, 1), samples=1, generator=torch.Generator().manual_seed(0)
    )
    for name in brute:
        torch.testing.assert_close(sampled[name], brute[name] / len(x), rtol=0.15, atol=1e-3)


# ---------------------------------------------------------------- finite-time scrub (eq. 6)


def _flow(curvature, minimiser, w0, eta, t):
    """Exact gradient flow on (w - w*)^T C (w - w*) / 2 for time t, by scipy's expm."""
    from scipy.linalg import expm

    return minimiser + expm(-eta * t * curvature) @ (w0 - minimiser)


def _quadratic_pair(seed, k=5):
    rng = np.random.default_rng(seed)
    a, b = _spd(rng, k), _spd(rng, k)
    return rng, a, b, rng.normal(size=k), rng.normal(size=k), rng.normal(size=k)


@pytest.mark.parametrize("t", [0.05, 0.3, 1.5])
def test_finite_time_scrub_maps_the_flow_on_all_data_to_the_flow_on_retained_data(t):
    """Proposition 3: S(w_D(t)) = w_Dr(t) for quadratic losses, both flows from the same w0."""
    from fedunlearn.scrubbing.scrubbers import finite_time_scrub

    _, a, b, w_d, w_r, w0 = _quadratic_pair(5)
    eta = 0.2
    assert eta * t * np.linalg.eigvalsh(a)[-1] < 30  # below the cap: the formula is exact
    w = _flow(a, w_d, w0, eta, t)
    scrubbed = finite_time_scrub(
        w, a @ (w - w_d), a, b @ (w - w_r), b, lam=0.0, sigma_h=1.0, time=t, lr=eta
    )
    np.testing.assert_allclose(scrubbed.weights, _flow(b, w_r, w0, eta, t), atol=1e-9)
    np.testing.assert_allclose(scrubbed.covariance, 0.0)
    # The scrub is not the Newton step at finite t.
    assert not np.allclose(scrubbed.weights, w_r, atol=1e-3)


def test_finite_time_scrub_at_time_zero_is_the_identity():
    from fedunlearn.scrubbing.scrubbers import finite_time_scrub

    _, a, b, w_d, w_r, w = _quadratic_pair(6)
    scrubbed = finite_time_scrub(
        w, a @ (w - w_d), a, b @ (w - w_r), b, lam=0.0, sigma_h=0.0, time=0.0, lr=0.5
    )
    np.testing.assert_allclose(scrubbed.weights, w, atol=1e-12)


@pytest.mark.parametrize("t", [1e4, np.inf])
def test_finite_time_scrub_after_a_long_run_is_the_newton_scrub(t):
    from fedunlearn.scrubbing.scrubbers import finite_time_scrub

    _, a, b, _, w_r, w = _quadratic_pair(7)
    g_r = b @ (w - w_r)
    long_run = finite_time_scrub(w, np.zeros(5), a, g_r, b, lam=0.0, sigma_h=1.0, time=t, lr=0.1)
    newton = newton_scrub(w, g_r, b, lam=0.0, sigma_h=1.0)
    np.testing.assert_allclose(long_run.mean, newton.mean, atol=1e-10)
    np.testing.assert_allclose(long_run.mean, w_r, atol=1e-10)


def test_finite_time_scrub_noise_is_eq_7s():
    from fedunlearn.scrubbing.scrubbers import finite_time_scrub

    rng, a, b, w_d, w_r, w = _quadratic_pair(8, k=3)
    args = (w, a @ (w - w_d), a, b @ (w - w_r), b)
    first = finite_time_scrub(*args, lam=0.04, sigma_h=1.5, time=0.7, lr=0.3)
    expected = np.sqrt(0.04) * 1.5 * psd_power(b, -0.5)
    np.testing.assert_allclose(first.covariance, expected, rtol=1e-12)
    draws = np.stack(
        [
            finite_time_scrub(*args, lam=0.04, sigma_h=1.5, time=0.7, lr=0.3, rng=rng).weights
            for _ in range(8000)
        ]
    )
    np.testing.assert_allclose(draws.mean(axis=0), first.mean, atol=0.03)
    np.testing.assert_allclose(np.cov(draws.T), expected, atol=0.04 * np.abs(expected).max())
    # Same noise draw as the Newton scrub for the same seed: only the mean differs.
    finite = finite_time_scrub(
        *args, lam=0.04, sigma_h=1.5, time=0.7, lr=0.3, rng=np.random.default_rng(3)
    )
    newton = newton_scrub(w, args[3], b, 0.04, 1.5, rng=np.random.default_rng(3))
    np.testing.assert_allclose(finite.weights - finite.mean, newton.weights - newton.mean)


def test_finite_time_scrub_caps_the_exponent_and_stays_finite():
    from fedunlearn.scrubbing.scrubbers import finite_time_scrub

    _, a, b, w_d, w_r, w = _quadratic_pair(9)
    args = (w, a @ (w - w_d), a, b @ (w - w_r), b)
    # eta t eig_max(A) ~ 1e8: exp would overflow to inf (and inf * 0 to nan) without the cap.
    huge = finite_time_scrub(*args, lam=0.0, sigma_h=0.0, time=1e7, lr=1.0)
    assert np.all(np.isfinite(huge.weights))
    # exp(-eta B t) has flushed to 0, so what is left is the Newton step.
    np.testing.assert_allclose(huge.weights, w_r, atol=1e-9)
    # Below the cap, the cap's value is irrelevant.
    t = 29.0 / (0.1 * np.linalg.eigvalsh(a)[-1])
    capped = finite_time_scrub(*args, lam=0.0, sigma_h=0.0, time=t, lr=0.1, max_exponent=30.0)
    loose = finite_time_scrub(*args, lam=0.0, sigma_h=0.0, time=t, lr=0.1, max_exponent=700.0)
    np.testing.assert_allclose(capped.weights, loose.weights, rtol=1e-12)
    # Above it, it is not.
    tight = finite_time_scrub(*args, lam=0.0, sigma_h=0.0, time=t, lr=0.1, max_exponent=5.0)
    assert not np.allclose(tight.weights, loose.weights)


@pytest.mark.parametrize(
    ("override", "parameter"),
    [
        ({"time": -1.0}, "time"),
        ({"time": float("nan")}, "time"),
        ({"lr": 0.0}, "lr"),
        ({"lr": -0.1}, "lr"),
        ({"lam": -1.0}, "lam"),
        ({"sigma_h": -1.0}, "sigma_h"),
        ({"max_exponent": 0.0}, "max_exponent"),
        ({"curvature_all": np.eye(4)}, "curvature_all"),
        ({"curvature_retained": np.eye(2)}, "curvature_retained"),
        ({"gradient_all": np.zeros(4)}, "gradient_all"),
        ({"gradient_retained": np.zeros(2)}, "gradient_retained"),
    ],
)
def test_finite_time_scrub_rejects_bad_arguments(override, parameter):
    from fedunlearn.scrubbing.scrubbers import finite_time_scrub

    kwargs = {
        "weights": np.zeros(3),
        "gradient_all": np.zeros(3),
        "curvature_all": np.eye(3),
        "gradient_retained": np.zeros(3),
        "curvature_retained": np.eye(3),
        "lam": 0.1,
        "sigma_h": 1.0,
        "time": 1.0,
        "lr": 0.1,
    }
    kwargs.update(override)
    with pytest.raises(ConfigError) as error:
        finite_time_scrub(**kwargs)
    assert error.value.parameter == parameter


# ---------------------------------------------------------------- KL over a lambda grid


LAMS = np.array([1e-6, 1e-4, 1e-2, 0.3, 1.0, 5.0])


def test_kl_over_lambda_equals_gaussian_kl_per_lambda_full_covariances():
    from fedunlearn.scrubbing.scrubbers import kl_over_lambda

    rng = np.random.default_rng(10)
    c0, c1 = psd_power(_spd(rng, 4), -0.5), psd_power(_spd(rng, 4), -0.5)
    m0, m1 = rng.normal(size=4), rng.normal(size=4)
    sigma_h = 0.7
    got = kl_over_lambda(m0, c0, m1, c1, LAMS, sigma_h)
    assert got.shape == LAMS.shape
    s = np.sqrt(LAMS) * sigma_h
    expected = [gaussian_kl(m0, si * c0, m1, si * c1) for si in s]
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    assert np.all(np.diff(got) < 0)  # more noise, less information
    # Equal means: only the covariance mismatch is left, the same for every lambda.
    same = kl_over_lambda(m0, c0, m0, c1, LAMS, sigma_h)
    np.testing.assert_allclose(same, gaussian_kl(m0, c0, m0, c1), rtol=1e-9)
    assert same[0] > 0


def test_kl_over_lambda_equals_gaussian_kl_per_lambda_diagonal_covariances():
    from fedunlearn.scrubbing.scrubbers import kl_over_lambda

    rng = np.random.default_rng(11)
    f0, f1 = rng.uniform(0.1, 5.0, size=6), rng.uniform(0.1, 5.0, size=6)
    c0, c1 = f0**-0.5, f1**-0.5  # Fisher forgetting, power -1/4
    m0, m1 = rng.normal(size=6), rng.normal(size=6)
    got = kl_over_lambda(m0, c0, m1, c1, LAMS, 2.0)
    s = np.sqrt(LAMS) * 2.0
    np.testing.assert_allclose(got, [gaussian_kl(m0, si * c0, m1, si * c1) for si in s], rtol=1e-9)
    assert np.all(np.diff(got) < 0)
    # Mixed diagonal/full agrees with full/full.
    np.testing.assert_allclose(kl_over_lambda(m0, c0, m1, np.diag(c1), LAMS, 2.0), got, rtol=1e-9)


@pytest.mark.parametrize(
    ("override", "parameter"),
    [
        ({"lams": [0.1, 0.0]}, "lams"),
        ({"lams": [-1.0]}, "lams"),
        ({"lams": []}, "lams"),
        ({"sigma_h": 0.0}, "sigma_h"),
        ({"mean1": np.zeros(2)}, "mean1"),
        ({"base_cov1": np.ones(2)}, "base_cov1"),
        ({"base_cov1": -np.eye(3)}, "base_cov1"),
    ],
)
def test_kl_over_lambda_rejects_bad_arguments(override, parameter):
    from fedunlearn.scrubbing.scrubbers import kl_over_lambda

    kwargs = {
        "mean0": np.zeros(3),
        "base_cov0": np.eye(3),
        "mean1": np.ones(3),
        "base_cov1": np.eye(3),
        "lams": [0.1, 1.0],
        "sigma_h": 1.0,
    }
    kwargs.update(override)
    with pytest.raises(ConfigError) as error:
        kl_over_lambda(**kwargs)
    assert error.value.parameter == parameter


def test_newton_scrubber_matches_newton_scrub_for_every_lambda():
    from fedunlearn.scrubbing.scrubbers import NewtonScrubber

    rng = np.random.default_rng(7)
    b = _spd(rng, 5)
    w, g = rng.normal(size=5), rng.normal(size=5)
    scrubber = NewtonScrubber(w, g, b)
    for lam in (1e-4, 1e-2):
        reference = newton_scrub(w, g, b, lam=lam, sigma_h=1.5, rng=np.random.default_rng(3))
        np.testing.assert_allclose(scrubber.mean, reference.mean, rtol=1e-10)
        np.testing.assert_allclose(
            np.sqrt(lam) * 1.5 * scrubber.base_covariance(), reference.covariance, rtol=1e-10
        )
        other_g = rng.normal(size=5)
        np.testing.assert_allclose(
            scrubber.with_gradient(w, other_g).mean, NewtonScrubber(w, other_g, b).mean, rtol=1e-10
        )
        draws = np.stack([scrubber.sample(lam, 1.5, rng) for _ in range(20000)])
        np.testing.assert_allclose(
            np.cov(draws.T), reference.covariance, atol=0.03 * np.abs(reference.covariance).max()
        )


def test_reference_fisher_variance_caps_averages_boosts_and_resets_the_class_row():
    from fedunlearn.scrubbing.scrubbers import reference_fisher_variance

    fisher = {
        "body.weight": np.array([[1.0, 0.25], [0.0, 1e-9]]),
        "body.bias": np.array([4.0, 0.0]),
        "head.weight": np.array([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]),
        "head.bias": np.array([1.0, 0.0, 0.5]),
    }
    base, reset = reference_fisher_variance(fisher, forget_class=1)
    # per output unit: the mean of min(1/F, 1e3) over the row
    np.testing.assert_allclose(base["body.weight"][0], [2.5, 2.5], rtol=1e-6)
    np.testing.assert_allclose(base["body.weight"][1], [1e3, 1e3], rtol=1e-6)
    # 1-D tensors and the head are boosted x10; the head's cap is 1e2
    np.testing.assert_allclose(base["body.bias"], [2.5, 1e4], rtol=1e-6)
    np.testing.assert_allclose(base["head.weight"][[0, 2], 0], [10.0, 5.0], rtol=1e-6)
    # the forgotten class's row: mean reset, variance 1 (x10), nothing else reset
    assert reset["head.weight"][1].all() and reset["head.bias"][1]
    assert reset["head.weight"].sum() == 2 and reset["head.bias"].sum() == 1
    assert not reset["body.weight"].any()
    np.testing.assert_allclose(base["head.weight"][1], [10.0, 10.0])
    # without a class nothing is reset and the head's empty row is capped at 1e2 (x10)
    base, reset = reference_fisher_variance(fisher)
    assert not any(m.any() for m in reset.values())
    np.testing.assert_allclose(base["head.weight"][1], [1e3, 1e3], rtol=1e-6)
    with pytest.raises(ConfigError) as error:
        reference_fisher_variance(fisher, forget_class=3)
    assert error.value.parameter == "forget_class"
