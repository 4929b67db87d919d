"""The "cached" removal bound (fedunlearn.certified.cached_bound): each cached factor bounds its
exact value from above, and over adversarial removal streams the true gradient residual never
exceeds beta, without reading X per request."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fedunlearn.certified.cached_bound import GramCache, reach_bounds, row_sketch
from fedunlearn.certified.certificate import CertifiedRemovalParams, worst_case_bound
from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import normalize_features, one_vs_rest_targets
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.errors import ConfigError

EXACT = np.longdouble  # the reference arithmetic (80-bit on x86; float64's errors are far larger)


def _rows(seed: int, n: int, d: int, condition: float = 1.0) -> np.ndarray:
    """Unit-norm rows; ``condition`` > 1 squeezes all but one direction (badly conditioned X)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) + 0.3
    x[:, 1:] /= condition
    return normalize_features(x)


def _exact_norm(rows: np.ndarray, vector: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(rows.astype(EXACT) @ vector.astype(EXACT)))))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 60),
    d=st.integers(1, 12),
    condition=st.sampled_from([1.0, 1e3, 1e7]),
    removed=st.integers(0, 59),
    fold=st.booleans(),
)
def test_the_downdated_gram_bounds_norms_and_the_top_eigenvalue_from_above(
    seed, n, d, condition, removed, fold
):
    x = _rows(seed, n, d, condition)
    removed = min(removed, n - 1)
    gone = np.random.default_rng(seed).permutation(n)[:removed]
    keep = np.setdiff1d(np.arange(n), gone)
    cache = GramCache.from_gram(x.T @ x, n, float(n))
    for index in gone:  # one request per row, as the engine does
        cache = cache.with_rows(x[[index]])
    if fold:
        cache = cache.folded()
    vectors = (
        np.random.default_rng(seed + 1).normal(size=(3, d)) * 10.0 ** np.arange(-3, 3, 2)[:, None]
    )
    vectors[0] = np.linalg.svd(x[keep])[2][-1]  # the remaining rows' weakest direction
    upper = cache.norm_upper(vectors)
    for k, vector in enumerate(vectors):
        exact = _exact_norm(x[keep], vector)
        assert exact <= upper[k]
    top = np.linalg.svd(x[keep], compute_uv=False)[0] ** 2
    assert top <= cache.top_eigenvalue_upper()


def test_the_gram_bound_is_tight_and_a_federations_gram_folds_the_same():
    x = _rows(3, 400, 20)
    cache = GramCache.from_gram(x.T @ x, 400, 400.0)
    by_rows = cache.with_rows(x[:30])
    by_gram = cache.with_gram(x[:30].T @ x[:30], 30)
    v = np.random.default_rng(0).normal(size=(1, 20))
    exact = _exact_norm(x[30:], v[0])
    for downdated in (by_rows, by_gram):
        assert exact <= downdated.norm_upper(v)[0] <= exact * (1 + 1e-9)
    # the removed rows matter: the un-downdated cache is a different (larger) number
    assert cache.norm_upper(v)[0] > exact * (1 + 1e-6)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 50),
    d=st.integers(1, 10),
    rank=st.integers(0, 10),
    basis=st.sampled_from(["eigen", "random", "scaled"]),
    heads=st.integers(1, 3),
)
def test_the_sketch_bounds_every_present_rows_projection(seed, n, d, rank, basis, heads):
    """For any basis (orthonormal or not) the sketch's bound is at least the exact
    max_i (|x_i^T u| + |x_i^T v| / 2) over the rows present, and its drift-free part at least
    max_i |x_i^T v| / 2."""
    rng = np.random.default_rng(seed)
    x = _rows(seed, n, d, rng.choice([1.0, 1e4]))
    rank = min(rank, d)
    if basis == "eigen":
        v = np.linalg.eigh(x.T @ x)[1][:, ::-1][:, :rank]
    else:
        v = rng.normal(size=(d, rank)) * (1.0 if basis == "random" else 1e3)
    sketch = row_sketch(x, v)
    present = rng.random(n) < 0.7
    present[rng.integers(n)] = True
    drift = rng.normal(size=(heads, d)) * rng.choice([1e-6, 1.0, 1e3])
    step = rng.normal(size=(heads, d)) * rng.choice([1e-6, 1.0, 1e3])
    full, own = reach_bounds(sketch, present, drift, step)
    exact_x = x[present].astype(EXACT)
    for h in range(heads):
        a = np.abs(exact_x @ drift[h].astype(EXACT))
        b = np.abs(exact_x @ step[h].astype(EXACT))
        assert float(np.max(a + b / 2)) <= full[h]
        assert float(np.max(b / 2)) <= own[h]
        # never above the sketch-free bound max ||x_i|| (||u|| + ||v|| / 2)
        trivial = np.linalg.norm(drift[h]) + np.linalg.norm(step[h]) / 2
        assert full[h] <= trivial * (1 + 1e-9)


def test_a_full_rank_sketch_is_nearly_exact():
    x = _rows(4, 300, 8)
    sketch = row_sketch(x, np.linalg.eigh(x.T @ x)[1])
    u, v = np.ones((1, 8)), np.arange(8.0)[None, :]
    full, _ = reach_bounds(sketch, np.ones(300, bool), u, v)
    exact = np.max(np.abs(x @ u[0]) + np.abs(x @ v[0]) / 2)
    assert exact <= full[0] <= exact * (1 + 1e-5)  # the products are float32


# ------------------------------------------------------------------ the engine, adversarially


def _problem(kind: str, seed: int):
    """(X, labels, classes) of an adversarial kind."""
    rng = np.random.default_rng(seed)
    if kind == "near-duplicates":
        base = rng.normal(size=(6, 5)) + 0.3
        x = np.repeat(base, 10, axis=0) + 1e-9 * rng.normal(size=(60, 5))
    elif kind == "tiny-n":
        x = rng.normal(size=(9, 7)) + 0.3  # n close to d
    elif kind == "ill-conditioned":
        x = rng.normal(size=(60, 6)) + 0.3
        x[:, 1:] *= 1e-5
    else:
        x = rng.normal(size=(60, 6)) * rng.uniform(0.05, 1.0, size=(60, 1)) + 0.3
    x = x / np.max(np.linalg.norm(x, axis=1))  # norms <= 1, not all equal
    classes = 3 if kind == "multiclass" else 2
    labels = np.argmax(x @ rng.normal(size=(x.shape[1], classes)), axis=1)
    labels[:classes] = np.arange(classes)
    return x, labels, list(range(classes))


def _order(kind: str, x: np.ndarray, labels: np.ndarray, seed: int) -> np.ndarray:
    """The removal stream: the adversary's order of the rows."""
    if kind == "largest-norm":
        return np.argsort(-np.linalg.norm(x, axis=1))
    if kind == "leverage":
        q = np.linalg.qr(x)[0]
        return np.argsort(-np.sum(q**2, axis=1))
    if kind == "one-class":
        return np.concatenate([np.flatnonzero(labels == 0), np.flatnonzero(labels != 0)])
    return np.random.default_rng(seed).permutation(len(x))


KINDS = ["random", "largest-norm", "leverage", "one-class", "near-duplicates", "tiny-n",
         "ill-conditioned", "multiclass"]  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 10_000),
    lam=st.sampled_from([1e-3, 1e-2, 1e-1]),
    sigma=st.sampled_from([0.05, 1.0, 10.0]),
    rank=st.sampled_from([0, 2, 64]),
    share=st.sampled_from([0.05, 0.75, 1e9]),
    batch=st.integers(1, 3),
    noise=st.sampled_from(["gaussian", "gamma"]),
)
# found by this test in CI (2026-12-06): n = 8 rows in d = 7, where beta passes Theorem 1's bound
@example(kind="tiny-n", seed=415, lam=0.1, sigma=10.0, rank=0, share=0.05, batch=1, noise="gamma")
def test_the_true_residual_never_exceeds_beta_over_adversarial_streams(
    kind, seed, lam, sigma, rank, share, batch, noise
):
    """After every removal of an adversarial stream (largest norms first, highest leverage first,
    a whole class first, near-duplicates, n close to d, an ill-conditioned X, several heads):
    ||grad L_b(w; D')|| <= beta; and, but with n close to d, beta is below the data-independent
    bound of Theorems 1/4. With n close to d it is not, for the default per-point bound either
    (n = 8, d = 7, seed 415: per-point 8.21 against 6.80 at the first removal, cached 8.56
    against 7.78; the true residual 0.001); why was not analysed, and soundness does not
    depend on it."""
    x, labels, classes = _problem(kind, seed)
    data = CentralHeadData("logistic", x, one_vs_rest_targets(labels, classes))
    params = CertifiedRemovalParams(
        lam=lam, sigma=sigma, noise=noise, mode="fast", bound="cached", sketch_rank=rank,
        cached_refresh_share=share, max_rank=7,
    )  # fmt: skip
    head = CertifiedHead(data, params, rng=np.random.default_rng(seed))
    head.fit()
    order = _order(kind, x, labels, seed)
    n, worst, removed = len(x), 0.0, 0
    while removed + batch <= n - 2:
        certificate = head.remove(order[removed : removed + batch].tolist())
        worst = (
            0.0
            if certificate.retrained
            else worst
            + np.sqrt(len(classes)) * worst_case_bound(lam, n - removed, batch, gamma=head.gamma)
        )
        removed += batch
        residual = head.residual()
        # The residual is itself computed in floating point: allow rounding of its own size.
        assert residual <= head.beta * (1 + 1e-7) + 1e-10, (residual, head.beta, certificate)
        assert head.beta <= head.budget
        if not certificate.retrained and kind != "tiny-n":
            assert head.beta - certificate.beta_before < worst


def test_beta_depends_on_the_data_removed():
    """Two streams over the same head differ in their bounds: beta is data-dependent."""
    x, labels, classes = _problem("largest-norm", 1)
    betas = []
    for order in (np.argsort(-np.linalg.norm(x, axis=1)), np.argsort(np.linalg.norm(x, axis=1))):
        data = CentralHeadData("logistic", x, one_vs_rest_targets(labels, classes))
        params = CertifiedRemovalParams(lam=1e-2, sigma=10.0, mode="fast", bound="cached")
        head = CertifiedHead(data, params, rng=np.random.default_rng(0))
        head.fit(perturbation=np.ones((1, x.shape[1])))
        for index in order[:10]:
            head.remove([int(index)])
        betas.append(head.beta)
    assert betas[0] > 2 * betas[1] > 0  # removing the largest rows costs more of the budget


class NoReadsOfX(CentralHeadData):
    """Central data whose per-request reads of X (sums, step terms, Gram) are counted."""

    reads = 0

    def sums(self, *args, **kwargs):
        self.reads += 1
        return super().sums(*args, **kwargs)

    def step(self, *args, **kwargs):
        self.reads += 1
        return super().step(*args, **kwargs)

    def gram(self):
        self.reads += 1
        return super().gram()


def test_a_removal_never_reads_x_between_refreshes():
    x, labels, classes = _problem("random", 2)
    data = NoReadsOfX("logistic", x, one_vs_rest_targets(labels, classes))
    params = CertifiedRemovalParams(
        lam=0.5, sigma=100.0, mode="fast", bound="cached", cached_refresh_share=1e9, max_rank=100,
        spectral_every=1,
    )  # fmt: skip
    head = CertifiedHead(data, params, rng=np.random.default_rng(0))
    head.fit()
    data.reads = 0
    for index in range(40):
        certificate = head.remove([index])
        assert not certificate.refreshed and not certificate.retrained
    assert data.reads == 0  # ||X'|| was recomputed (spectral_every=1) from the cache, not X
    assert head.residual() <= head.beta


class FederationLike(CentralHeadData):
    """Ships the removed rows' Gram matrix, not their rows, and keeps no sketch."""

    reach_bounds = None

    def removed(self, ids, weights, anchor):
        parts = super().removed(ids, weights, anchor)
        parts.gram, parts.rows = parts.rows.T @ parts.rows, None
        return parts


def test_without_rows_or_sketch_the_bound_uses_grams_and_unit_norms_and_holds():
    x, labels, classes = _problem("multiclass", 3)
    results = []
    for kind in (CentralHeadData, FederationLike):
        data = kind("logistic", x, one_vs_rest_targets(labels, classes))
        params = CertifiedRemovalParams(lam=1e-2, sigma=10.0, mode="fast", bound="cached")
        head = CertifiedHead(data, params, rng=np.random.default_rng(0))
        head.fit(perturbation=np.full((3, x.shape[1]), 0.5))
        for index in range(3, 23):
            head.remove([index])
            assert head.residual() <= head.beta
        results.append(head.beta)
    assert results[0] < results[1]  # the sketch tightens max_i |x_i^T u|


def test_the_cached_bound_needs_the_fast_mode():
    with pytest.raises(ConfigError) as error:
        CertifiedRemovalParams(mode="exact", bound="cached").validate()
    assert error.value.parameter == "bound"


@pytest.mark.parametrize("share", [0.02, 1e9])
@pytest.mark.parametrize("kind", KINDS)
def test_every_adversarial_stream_is_certified_by_steps_not_retrains(kind, share):
    """The same streams with a budget that never forces a retrain: every certificate is a
    Newton step (refreshes allowed), and the true residual stays under beta after each."""
    x, labels, classes = _problem(kind, 7)
    data = CentralHeadData("logistic", x, one_vs_rest_targets(labels, classes))
    lam = 5.0 if kind == "tiny-n" else 0.5  # n close to d: lambda n is small, steps large
    params = CertifiedRemovalParams(
        lam=lam, sigma=100.0, mode="fast", bound="cached", cached_refresh_share=share, max_rank=2
    )
    head = CertifiedHead(data, params, rng=np.random.default_rng(7))
    head.fit()
    refreshes = 0
    for index in _order(kind, x, labels, 7)[: len(x) // 2]:
        certificate = head.remove([int(index)])
        assert not certificate.retrained
        refreshes += certificate.refreshed
        assert head.residual() <= head.beta * (1 + 1e-7) + 1e-10
    assert refreshes > 0  # max_rank=2 forces some
