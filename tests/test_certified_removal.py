"""Certified removal (Guo et al. 2020): the certificate's claims, on random normalised data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedunlearn.certified_removal import (
    CertifiedHead,
    CertifiedRemovalParams,
    _FastFactor,
    cholesky_solve,
    gaussian_c,
    read_ledger,
    removal_budget,
    sample_perturbation,
    worst_case_bound,
)
from fedunlearn.errors import ConfigError
from fedunlearn.head_statistics import CentralHeadData
from fedunlearn.linear_losses import (
    LOGISTIC_GAMMA,
    FeatureNormError,
    normalize_features,
    one_vs_rest_targets,
    second_derivative,
)


def _problem(seed: int, n: int, d: int, classes: int = 2, shift: float = 0.3):
    rng = np.random.default_rng(seed)
    x = normalize_features(rng.normal(size=(n, d)) + shift)
    if classes == 2:
        labels = (x @ rng.normal(size=d) + 0.2 * rng.normal(size=n) > 0).astype(int)
    else:
        labels = np.argmax(x @ rng.normal(size=(d, classes)), axis=1)
        labels[:classes] = np.arange(classes)  # every class present
    return x, labels, list(range(classes))


def _exact_minimizer_least_squares(x, t, lam, b):
    """argmin sum (w^T x - t)^2 / 2 + lam n / 2 ||w||^2 + b^T w, in closed form."""
    n, d = x.shape
    return np.stack(
        [
            np.linalg.solve(x.T @ x + lam * n * np.eye(d), x.T @ t[:, k] - b[k])
            for k in range(t.shape[1])
        ]
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(30, 80),
    d=st.integers(2, 8),
    classes=st.sampled_from([2, 3]),
    loss=st.sampled_from(["logistic", "least-squares"]),
    mode=st.sampled_from(["exact", "fast"]),
    bound=st.sampled_from(["per-point", "corollary"]),
    gamma=st.sampled_from(["exact", "paper"]),
    lam=st.sampled_from([1e-3, 1e-2, 1e-1]),
    sigma=st.sampled_from([0.05, 1.0, 10.0]),
    batch=st.integers(1, 3),
    noise=st.sampled_from(["gaussian", "gamma"]),
)
def test_true_residual_never_exceeds_the_reported_bound(
    seed, n, d, classes, loss, mode, bound, gamma, lam, sigma, batch, noise
):
    """After every removal, in both modes and with every bound: ||grad L_b(w; D')|| <= beta."""
    x, labels, cls = _problem(seed, n, d, classes)
    data = CentralHeadData(loss, x, one_vs_rest_targets(labels, cls))
    head = CertifiedHead(
        data,
        CertifiedRemovalParams(
            loss=loss,
            lam=lam,
            sigma=sigma,
            noise=noise,
            mode=mode,
            bound=bound,
            gamma=gamma,
            refresh_ratio=3.0,
            max_rank=5,
            track_bounds=True,
        ),
        rng=np.random.default_rng(seed),
    )
    head.fit()
    order = np.random.default_rng(seed + 1).permutation(n)
    removed = 0
    while removed + batch <= n // 2:
        certificate = head.remove(order[removed : removed + batch].tolist())
        removed += batch
        residual = head.residual()
        # The residual is itself computed in floating point: allow rounding of its own size.
        assert residual <= head.beta * (1 + 1e-7) + 1e-10, (residual, head.beta, certificate)
        assert head.beta <= head.budget
        for name, tracked in certificate.tracked.items():
            if not certificate.retrained:
                assert residual <= tracked * (1 + 1e-7) + 1e-10, name


def test_per_point_bound_is_at_most_half_of_corollary_one_in_exact_mode():
    x, labels, cls = _problem(0, 200, 6)
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls)),
        CertifiedRemovalParams(sigma=1.0, lam=1e-2, track_bounds=True, gamma="paper"),
        rng=np.random.default_rng(0),
    )
    head.fit()
    for i in range(40):
        certificate = head.remove([i])
        assert not certificate.retrained
    tracked = certificate.tracked
    assert tracked["per-point-paper-gamma"] <= 0.5 * tracked["corollary-1"] + 1e-9
    # The exact Lipschitz constant scales the same bound by (1/(6 sqrt 3)) / (1/4).
    ratio = tracked["per-point-exact-gamma"] / tracked["per-point-paper-gamma"]
    assert ratio == pytest.approx(LOGISTIC_GAMMA["exact"] / 0.25, rel=1e-3)


def test_exact_lipschitz_constant_of_the_logistic_second_derivative():
    z = np.linspace(-20, 20, 400_001)[:, None]
    d2 = second_derivative("logistic", z, np.ones_like(z))[:, 0]
    slope = np.max(np.abs(np.diff(d2) / np.diff(z[:, 0])))
    assert slope == pytest.approx(1 / (6 * math.sqrt(3)), rel=1e-4)
    assert slope < 0.25


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_least_squares_removal_equals_retraining(mode):
    """gamma = 0: the Newton step lands on the minimiser of L_b on D' (same b)."""
    x, labels, cls = _problem(3, 60, 5, classes=3)
    t = one_vs_rest_targets(labels, cls)
    head = CertifiedHead(
        CentralHeadData("least-squares", x, t),
        CertifiedRemovalParams(loss="least-squares", noise="none", lam=1e-2, mode=mode),
    )
    head.fit()
    keep = np.ones(len(x), dtype=bool)
    for ids in ([0], [5, 7], [11], [20, 21, 22]):
        certificate = head.remove(ids)
        keep[ids] = False
        expected = _exact_minimizer_least_squares(x[keep], t[keep], 1e-2, head.perturbation)
        np.testing.assert_allclose(head.weights, expected, rtol=1e-9, atol=1e-12)
        assert certificate.certified and not certificate.retrained
        assert certificate.step_bound < 1e-9


def test_the_budget_forces_a_retrain_exactly_when_it_should(tmp_path):
    x, labels, cls = _problem(1, 120, 5)
    ledger = tmp_path / "ledger.jsonl"
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls)),
        # A small sigma gives a small budget: several retrains in 60 removals.
        CertifiedRemovalParams(sigma=0.02, lam=1e-2, bound="corollary", gamma="paper"),
        rng=np.random.default_rng(4),
        ledger=ledger,
    )
    head.fit()
    retrains = 0
    for i in range(60):
        c = head.remove([i])
        would_exceed = c.beta_before + c.step_bound > c.budget
        assert c.retrained == would_exceed
        assert c.beta_after <= c.budget and c.certified
        if c.retrained:
            retrains += 1
            # A retrain lands on the exact minimiser of L_b on D' with a fresh b.
            assert c.beta_after == pytest.approx(head.residual(), abs=1e-12)
            assert head.residual() < 1e-8
        else:
            assert c.beta_after == pytest.approx(c.beta_before + c.step_bound)
    assert retrains >= 2
    records = read_ledger(ledger)
    assert [r["kind"] for r in records] == ["train"] + ["remove"] * 60
    assert sum(r["retrained"] for r in records[1:]) == retrains
    assert records[5]["ids"] == [4] and records[5]["n_before"] == 116


def test_a_retrain_draws_a_fresh_perturbation():
    x, labels, cls = _problem(2, 80, 4)
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls)),
        CertifiedRemovalParams(sigma=0.01, lam=1e-2, bound="corollary", gamma="paper"),
    )
    head.fit()
    before = head.perturbation.copy()
    for i in range(40):
        if head.remove([i]).retrained:
            assert not np.array_equal(before, head.perturbation)
            return
    pytest.fail("no retrain happened; make the budget smaller")


def test_newton_reaches_the_requested_relative_tolerance():
    x, labels, cls = _problem(5, 300, 10, classes=4)
    data = CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls))
    head = CertifiedHead(data, CertifiedRemovalParams(sigma=5.0, tol=1e-10))
    certificate = head.fit()
    g0 = np.linalg.norm(
        data.sums(np.zeros_like(head.weights), hessian=False).gradient + head.perturbation
    )
    assert head.residual() <= 1e-10 * g0
    assert certificate.beta_after == pytest.approx(head.residual(), rel=1e-6, abs=1e-14)


def test_fast_factor_solves_the_downdated_shifted_system():
    rng = np.random.default_rng(0)
    d = 7
    a = rng.normal(size=(30, d))
    matrix = a.T @ a
    u = rng.normal(size=(d, 3)) * 0.3
    eig, q = np.linalg.eigh(matrix)
    factor = _FastFactor(q, eig, q.T @ u)
    rhs = rng.normal(size=d)
    mu = 2.5
    v, residual = factor.solve(rhs, mu)
    np.testing.assert_allclose(
        v, np.linalg.solve(matrix + mu * np.eye(d) - u @ u.T, rhs), rtol=1e-10
    )
    assert residual < 1e-10
    np.testing.assert_allclose(
        cholesky_solve(matrix + mu * np.eye(d), rhs), np.linalg.solve(matrix + mu * np.eye(d), rhs)
    )


def test_budget_and_noise_follow_theorem_3():
    assert removal_budget("gaussian", 10.0, 1.0, 1e-4) == pytest.approx(2.2803, abs=1e-4)
    assert gaussian_c(1e-4) == pytest.approx(math.sqrt(2 * math.log(1.5e4)))
    assert removal_budget("gamma", 3.0, 0.5, 1e-4) == pytest.approx(1.5)
    rng = np.random.default_rng(0)
    gaussian = sample_perturbation("gaussian", 2.0, (4000,), rng)
    assert np.std(gaussian) == pytest.approx(2.0, rel=0.05)
    # Density ~ exp(-||b|| / sigma) in D dimensions: ||b|| ~ Gamma(D, sigma), mean D sigma.
    norms = [np.linalg.norm(sample_perturbation("gamma", 0.5, (3, 4), rng)) for _ in range(3000)]
    assert np.mean(norms) == pytest.approx(12 * 0.5, rel=0.03)
    assert np.var(norms) == pytest.approx(12 * 0.25, rel=0.15)


def test_worst_case_bound_is_theorem_4_and_dominates_the_data_dependent_one():
    assert worst_case_bound(0.1, 101, 1, gamma=0.25) == pytest.approx(4 * 0.25 / (0.01 * 100))
    assert worst_case_bound(0.1, 102, 2, gamma=0.25) == pytest.approx(4 * 0.25 * 4 / (0.01 * 100))
    x, labels, cls = _problem(7, 100, 5)
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls)),
        CertifiedRemovalParams(sigma=0.001, lam=1.0, bound="corollary", gamma="paper", epsilon=1e9),
    )
    head.fit()
    for i in range(10):
        certificate = head.remove([i])
    assert certificate.worst_case >= certificate.beta_after - certificate.beta_before
    assert certificate.worst_case >= head.residual()


def test_dp_extractor_composes_into_the_certificate():
    x, labels, cls = _problem(8, 50, 3)
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls)),
        CertifiedRemovalParams(sigma=1.0, epsilon=0.5, delta=1e-5),
        dp_epsilon=2.0,
        dp_delta=1e-6,
    )
    certificate = head.fit()
    assert certificate.total_epsilon == pytest.approx(2.5)
    assert certificate.total_delta == pytest.approx(1.1e-5)


def test_unnormalised_features_are_refused_with_a_clear_error():
    x = np.array([[0.6, 0.8], [1.0, 1.0]])
    with pytest.raises(FeatureNormError, match=r"row 1 has norm 1.41"):
        CentralHeadData("logistic", x, np.ones((2, 1)))
    np.testing.assert_allclose(np.linalg.norm(normalize_features(x * 7), axis=1), 1.0)


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"loss": "hinge"}, "loss"),
        ({"mode": "slow"}, "mode"),
        ({"bound": "theorem-9"}, "bound"),
        ({"gamma": "half"}, "gamma"),
        ({"lam": 0.0}, "lam"),
        ({"sigma": -1.0}, "sigma"),
        ({"noise": "none"}, "noise"),
        ({"delta": 2.0}, "delta"),
        ({"noise": "laplace"}, "noise"),
    ],
)
def test_bad_settings_name_the_parameter(changes, parameter):
    with pytest.raises(ConfigError) as error:
        CertifiedRemovalParams(**changes).validate()
    assert error.value.parameter == parameter


def test_bad_removal_requests_are_refused_and_change_nothing():
    x, labels, cls = _problem(9, 40, 3)
    data = CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls))
    head = CertifiedHead(data, CertifiedRemovalParams(sigma=1.0))
    head.fit()
    head.remove([3])
    weights = head.weights.copy()
    for ids, match in (
        ([3], "these were removed"),
        ([40], r"\[0, 40\)"),
        ([], "non-empty"),
        ([1, 1], "at most once"),
    ):
        with pytest.raises(ConfigError, match=match):
            head.remove(ids)
    np.testing.assert_array_equal(head.weights, weights)
    assert data.count() == 39


def test_cli_prints_the_ledger_and_refuses_a_missing_one(tmp_path, capsys):
    from fedunlearn.cli import main

    x, labels, cls = _problem(11, 60, 4)
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, cls)),
        CertifiedRemovalParams(sigma=1.0, lam=1e-2),
        ledger=tmp_path / "certified_removal.jsonl",
    )
    head.fit()
    for i in range(3):
        head.remove([i])
    assert main(["certificates", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 certificate(s), 0 retrain(s)" in out and out.count("| remove |") == 3
    assert main(["certificates", str(tmp_path / "nowhere")]) == 2
    assert "certified_removal.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["logistic", "least-squares"])
@pytest.mark.parametrize("heads", [1, 4])
def test_class_probabilities_are_distributions_that_predict_like_the_head(loss, heads):
    from fedunlearn.linear_losses import class_probabilities, predict_labels

    rng = np.random.default_rng(heads)
    scores = rng.normal(scale=3.0, size=(200, heads))
    classes = [0, 1] if heads == 1 else list(range(heads))
    probabilities = class_probabilities(loss, scores)
    assert probabilities.shape == (200, len(classes))
    assert np.all(probabilities >= 0)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    np.testing.assert_array_equal(
        np.asarray(classes)[probabilities.argmax(axis=1)], predict_labels(scores, classes)
    )
    # A larger score for a class never lowers its probability.
    raised = scores.copy()
    raised[:, -1] += 1.0
    assert np.all(class_probabilities(loss, raised)[:, -1] >= probabilities[:, -1])
