"""A data-dependent removal bound from cached statistics, never reading X per request.

Guo et al. (ICML 2020) bound the gradient residual after a Newton removal step ``v = H^{-1} Delta``
by their Corollary 1, ``gamma ||X'||_2 ||v|| ||X' v||``. The fast mode
(:mod:`fedunlearn.certified.removal`) solves with the Hessian cached at an anchor ``w0``, so the
residual's data part is (:mod:`fedunlearn.certified.certificate`)

    X'^T (e * X'v),   |e_i| <= gamma (|a_i| + |b_i| / 2),   a_i = x_i^T (w - w0),  b_i = x_i^T v,

and ``||X'^T (e * X'v)|| <= ||X'||_2 max_i |e_i| ||X'v||``, so

    ||residual|| <= gamma ||X'||_2 R ||X'v|| + ||solve's residual||,
    R >= max_{i in D'} (|a_i| + |b_i| / 2)                                  ("cached" bound)

-- Corollary 1 with ``||v||`` replaced by R (``R <= ||w - w0|| + ||v|| / 2`` since ``||x_i|| <= 1``:
with ``w0 = w`` that is half of Corollary 1's factor, the ``1/2`` of ``int_0^1 t dt``). Each
factor comes from statistics cached across requests, in O(d^2 + n k) per request, not O(n d):

* ``||X'v||^2 = v^T K' v`` with ``K' = X'^T X'`` downdated by the removed rows
  (:class:`GramCache`: ``K'`` is a base Gram matrix less ``R^T R`` for the rows removed since,
  folded into the base every :data:`FOLD_ROWS` rows);
* ``||X'||_2^2 <= lambda_max`` of any earlier ``K`` (removing rows can only lower it), recomputed
  from the cache (:meth:`GramCache.top_eigenvalue_upper`), never from X;
* R from a rank-k sketch of the rows (:class:`RowSketch`): for any basis V (d, k), stored
  ``z_i`` and ``r_i = x_i - V z_i`` (an identity, whatever the rounding of ``z_i``),
  ``|x_i^T u| <= |z_i^T V^T u| + ||r_i|| ||u||``: one (n, k) product per request, k << d. Without
  a sketch (a federation) R is ``max ||x_i|| (||w - w0|| + ||v|| / 2)``.

Floating point (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Lemma 3.3 and
eq. (3.5): a float64 dot product of length k errs by at most ``gamma_k |x|^T |y|``,
``gamma_k = k u / (1 - k u)``, ``u = 2^-53``): every cached quantity carries an a priori bound of
its rounding error and the bounds add it, so each factor above is an upper bound of its exact
value. The Gram cache's error coefficient ``E`` (``|v^T (K^ - K) v| <= E ||v||^2``) starts at
``2 gamma_{N+2} sum ||x_i||^2`` (N rows summed) and grows with each fold; eigenvalues of ``K^``
are within ``||K^ - K||_2 <= E`` of ``K``'s (Weyl) and LAPACK's ``eigvalsh`` within
:data:`EIGEN_RELATIVE` ``d u ||K^||_F``. The few float64 operations that combine the factors
(relative error ``< 20 u``) are covered by :data:`COMBINE_MARGIN`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedunlearn.certified.staleness import rounding_gamma

#: Unit roundoff of IEEE float64 (round to nearest).
UNIT_ROUNDOFF_DOUBLE = 2.0**-53
#: Removed rows held beside the base Gram matrix before they are folded into it.
FOLD_ROWS = 256
#: ``eigvalsh``'s eigenvalues are taken to be exact for a matrix within this times
#: ``d u ||K||_F`` of K (LAPACK's backward error is a small multiple of ``u ||K||_2``).
EIGEN_RELATIVE = 8.0
#: Relative inflation of the combined bound: the handful of float64 products and sums that join
#: the factors err by less than ``20 u = 2.2e-15``.
COMBINE_MARGIN = 1e-12


def gamma64(length: int) -> float:
    """Higham's ``gamma_k`` for float64 (:func:`fedunlearn.certified.staleness.rounding_gamma`)."""
    return rounding_gamma(length, UNIT_ROUNDOFF_DOUBLE)


@dataclass(frozen=True)
class GramCache:
    """``K' = X'^T X'`` as ``base - rows^T rows`` with ``|v^T (K^ - K') v| <= error ||v||^2``.

    ``base`` (d, d) is a Gram matrix as computed (``K^``), ``rows`` (m, d) the rows removed since,
    ``error`` the rounding coefficient of ``base`` (module docstring), ``frobenius`` ``||base||_F``
    and ``row_mass`` ``sum ||rows_j||^2``. Immutable: a request builds a new one, so a failed
    request leaves the cached one untouched.
    """

    base: np.ndarray
    rows: np.ndarray
    error: float
    frobenius: float
    row_mass: float

    @classmethod
    def from_gram(cls, gram: np.ndarray, summed_rows: int, mass: float) -> GramCache:
        """The cache of a Gram matrix formed in float64 from ``summed_rows`` rows (any order, a
        difference of two such sums included) of total squared norm at most ``mass``."""
        error = 2.0 * gamma64(summed_rows + 2) * mass
        d = len(gram)
        return cls(gram, np.zeros((0, d)), error, _frobenius(gram), 0.0)

    def with_rows(self, rows: np.ndarray) -> GramCache:
        """The cache after removing samples whose features are ``rows`` (m, d)."""
        rows = np.concatenate([self.rows, np.asarray(rows, dtype=np.float64)])
        mass = self.row_mass + float(np.sum(np.square(rows[len(self.rows) :])))
        cache = GramCache(self.base, rows, self.error, self.frobenius, mass)
        return cache.folded() if len(rows) > FOLD_ROWS else cache

    def with_gram(self, gram: np.ndarray, summed_rows: int) -> GramCache:
        """The cache after removing samples whose Gram matrix ``gram`` (d, d) was formed from
        ``summed_rows`` rows (a federation's clients ship it): folded at once. Its own rounding
        (``gamma_m`` times its trace, doubled for the trace's rounding) and the subtraction's
        (``u (|B| + |G|)``) join ``error``."""
        cache = self.folded() if len(self.rows) else self
        base = cache.base - gram
        error = (
            cache.error
            + 2.0 * gamma64(summed_rows + 2) * abs(float(np.trace(gram)))
            + gamma64(2) * (cache.frobenius + _frobenius(gram))
        )
        return GramCache(base, cache.rows, error, _frobenius(base), 0.0)

    def folded(self) -> GramCache:
        """``base - rows^T rows`` as the new base; the subtraction's rounding joins ``error``:
        ``|fl(B - R^T R) - (B - R^T R)| <= gamma_{m+1} (|B| + |R|^T |R|)`` elementwise."""
        m = len(self.rows)
        base = self.base - self.rows.T @ self.rows
        error = self.error + gamma64(m + 2) * (self.frobenius + self.row_mass)
        return GramCache(base, self.rows[:0], error, _frobenius(base), 0.0)

    def _error(self, length: int) -> float:
        """The coefficient of ``||v||^2`` bounding the error of ``v^T K^ v`` computed as below."""
        m = len(self.rows)
        computed = gamma64(2 * length + m + 4) * (self.frobenius + self.row_mass)
        return self.error + computed

    def norm_upper(self, vectors: np.ndarray) -> np.ndarray:
        """Upper bounds of ``||X' v_k||`` for the rows ``v_k`` of ``vectors`` (K, d): O(d^2 + m d)."""
        vectors = np.atleast_2d(vectors)
        quadratic = np.einsum("kd,kd->k", vectors @ self.base, vectors)
        if len(self.rows):
            quadratic = quadratic - np.sum(np.square(vectors @ self.rows.T), axis=1)
        slack = self._error(vectors.shape[1]) * np.sum(np.square(vectors), axis=1)
        return np.sqrt(np.maximum(quadratic + slack, 0.0)) * (1.0 + COMBINE_MARGIN)

    def top_eigenvalue_upper(self) -> float:
        """An upper bound of ``lambda_max(K') = ||X'||_2^2`` from the cache (no X): Weyl's
        inequality with the cache's error and ``eigvalsh``'s backward error."""
        cache = self.folded() if len(self.rows) else self
        d = len(cache.base)
        top = float(np.linalg.eigvalsh(cache.base)[-1])
        slack = cache.error + EIGEN_RELATIVE * d * UNIT_ROUNDOFF_DOUBLE * cache.frobenius
        return max(top + slack, 0.0) * (1.0 + COMBINE_MARGIN)


def _frobenius(matrix: np.ndarray) -> float:
    """``||matrix||_F``, rounded up (its own rounding is below ``gamma_{d^2}``)."""
    return float(np.linalg.norm(matrix)) * (1.0 + gamma64(matrix.size + 1))


@dataclass(frozen=True)
class RowSketch:
    """A rank-k sketch of the rows: ``basis`` V (d, k), ``scores`` z (n, k) in float32 (the
    sketch's own values: ``r_i = x_i - V z_i`` is formed from them, so the identity is exact) and, per row,
    ``residual`` >= ``||x_i - V z_i||`` (exactly, rounding included); ``score_max`` >= max
    ``||z_i||``, ``basis_frobenius`` >= ``||V||_F``, ``row_max`` >= max ``||x_i||``."""

    basis: np.ndarray
    scores: np.ndarray
    residual: np.ndarray
    score_max: float
    basis_frobenius: float
    row_max: float


def row_sketch(features: np.ndarray, basis: np.ndarray) -> RowSketch:
    """The :class:`RowSketch` of ``features`` (n, d) on ``basis`` (d, k), in O(n d k).

    ``r^ = fl(x - fl(V z))`` errs by ``gamma_{k+1} (|x| + |V| |z|)`` elementwise, so
    ``||r|| <= ||r^|| + gamma_{k+1} (||x|| + ||V||_F ||z||)``, and the norm's own rounding is
    covered by ``gamma_{d+1}``."""
    features = np.asarray(features, dtype=np.float64)
    basis = np.ascontiguousarray(basis, dtype=np.float64)
    d, k = basis.shape
    scores = (features @ basis).astype(np.float32)  # half the bytes read per request
    basis_frobenius = _frobenius(basis)
    exact_scores = scores.astype(np.float64)
    score_norms = np.linalg.norm(exact_scores, axis=1) * (1.0 + gamma64(k + 1))
    computed = np.linalg.norm(features - exact_scores @ basis.T, axis=1) * (1.0 + gamma64(d + 1))
    rows = np.linalg.norm(features, axis=1) * (1.0 + gamma64(d + 1))
    residual = computed + gamma64(k + 1) * (rows + basis_frobenius * score_norms)
    score_max = float(np.max(score_norms)) if len(score_norms) else 0.0
    row_max = float(np.max(rows)) if len(rows) else 0.0
    residual = residual * (1.0 + COMBINE_MARGIN)
    return RowSketch(basis, scores, residual, score_max, basis_frobenius, row_max)


def reach_bounds(
    sketch: RowSketch, present: np.ndarray, drift: np.ndarray, step: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per head k, upper bounds of ``max_{i in D'} (|x_i^T u_k| + |x_i^T v_k| / 2)`` and of
    ``max_{i in D'} |x_i^T v_k| / 2`` (its part without the drift), for ``u = drift = w - w0``
    and ``v = step`` (K, d), from the sketch in O(n k) (module docstring); the (n, k) product is
    in float32, with the a priori bound of its rounding added.

    ``|x_i^T u| <= |fl(z_i^T c^)| + ||z_i|| (gamma_k ||c^|| + gamma_d ||V||_F ||u||) + rho_i ||u||``
    with ``c^ = fl(V^T u)``: ``c^`` errs by ``gamma_d |V|^T |u|`` and the product by
    ``gamma_k |z_i|^T |c^|``."""
    drift = np.atleast_2d(drift)
    step = np.atleast_2d(step)
    d, k = sketch.basis.shape
    both = np.concatenate([drift, step])  # (2K, d)
    coefficients = both @ sketch.basis  # (2K, k)
    single = coefficients.astype(np.float32)
    projected = np.abs(sketch.scores @ single.T).astype(np.float64)  # (n, 2K), float32 products
    norms = np.linalg.norm(both, axis=1)
    # float32: rounding c^ to float32 and a k-term dot product (Higham gamma_{k+1}, u = 2^-24),
    # plus underflow 2^-125 (||z||_1 + ||c||_1 + k) (fedunlearn.certified.staleness)
    coefficient_norms = np.linalg.norm(coefficients, axis=1)
    single_error = rounding_gamma(
        k + 2
    ) * sketch.score_max * coefficient_norms * 1.01 + 2.0**-125 * (
        np.sqrt(k) * sketch.score_max + np.sum(np.abs(coefficients), axis=1) + k + 1
    )
    slack = single_error + sketch.score_max * (
        gamma64(k + 1) * coefficient_norms + gamma64(d + 1) * sketch.basis_frobenius * norms
    )
    heads = len(step)
    full, own = np.empty(heads), np.empty(heads)
    residual = sketch.residual[present]
    for h in range(heads):
        u_part = projected[present, h] + residual * norms[h]
        v_part = projected[present, heads + h] + residual * norms[heads + h]
        v_max = float(np.max(v_part)) if len(v_part) else 0.0
        full[h] = (float(np.max(u_part + 0.5 * v_part)) if len(v_part) else 0.0) + slack[h]
        own[h] = 0.5 * (v_max + slack[heads + h])
        full[h] += 0.5 * slack[heads + h]
    # Never above the sketch-free bound max ||x_i|| (||u|| + ||v|| / 2).
    full = np.minimum(full, sketch.row_max * (norms[:heads] + 0.5 * norms[heads:]))
    own = np.minimum(own, sketch.row_max * 0.5 * norms[heads:])
    margin = 1.0 + COMBINE_MARGIN
    return full * margin, own * margin


def cached_bound(gamma: float, spectral_norm: float, reach: float, xv_norm: float) -> float:
    """``gamma ||X'||_2 R ||X'v||`` (module docstring; Guo et al. Corollary 1 with ``||v||`` -> R)."""
    return gamma * spectral_norm * reach * xv_norm * (1.0 + COMBINE_MARGIN)
