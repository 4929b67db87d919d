"""Scrubbing math (Golatkar et al. 2020): Newton scrub, Fisher forgetting, D_f-only, the KL bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing import (
    diagonal_fisher,
    fisher_forgetting,
    forget_only_curvature,
    gaussian_kl,
    newton_scrub,
    psd_power,
    softmax_head_sums,
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


def test_variational_forgetting_finds_the_optimal_noise_of_a_quadratic():
    """E[(w+n)^T A (w+n)]/2 - lam sum log s^2 is minimised at s_i^2 = 2 lam / A_ii."""
    from fedunlearn.scrubbing import variational_forgetting

    curvature = torch.tensor([0.5, 2.0, 8.0], dtype=torch.float64)
    model = nn.Linear(3, 1, bias=False).double()

    def retained_loss(params):
        w = params["weight"][0]
        return 0.5 * (curvature * w.square()).sum()

    variance = variational_forgetting(
        model,
        retained_loss,
        lam=0.01,
        steps=3000,
        lr=0.02,
        generator=torch.Generator().manual_seed(0),
    )["weight"][0]
    torch.testing.assert_close(variance, 2 * 0.01 / curvature, rtol=0.25, atol=0.0)
    with pytest.raises(ConfigError):
        variational_forgetting(model, retained_loss, lam=0.0)
