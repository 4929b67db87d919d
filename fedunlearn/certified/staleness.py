"""A stale Hessian's error on one removal step, measured in float32 with proven rounding bounds.

The fast removal mode (:mod:`fedunlearn.certified.removal`) solves the Newton step of Guo et al.
(Algorithm 2) with the Hessian's data part cached at an anchor ``w0``,
``A0 = sum_{i in D'} l''(x_i^T w0) x_i x_i^T``. With ``b = X'v`` and ``s = X'w``, the step's linear
error against the Hessian at the current ``w`` splits exactly into the cached model's own error and

    S = sum_{i in D'} (l''(s_i) - l''(s0_i)) b_i x_i = X'^T (dc * b)                  (stale vector)

so the residual after the step is ``r_prev + [M v - Delta] + S + int_0^1 (H'(w + t v) - H'(w)) v dt``
and the integral is bounded as at ``w0 = w``: ``|b_i| gamma / 2`` per point, the per-point bound
``gamma ||X'|| sqrt(sum b_i^4) / 2`` (Guo et al. Corollary 1 with the per-sample terms). S is not
bounded through ``||X'||``: it is computed, which is what keeps the bound near exact mode's without
re-forming the Hessian.

S is small (it is a difference of curvatures), so it can be computed in float32 without the
cancellation that forbids a float32 ``H'(w) v - Delta``: two passes over a float32 copy of X (half
the bytes of float64). Each float32 result carries an a priori bound on its rounding error
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. (3.5) and Lemma 3.3: a dot
product of length k in any summation order, with or without FMA, errs by at most
``gamma_k |x|^T |y|``, ``gamma_k = k u / (1 - k u)``, ``u = 2^-24``), and the bounds use the
inflated values, so every number the certificate adds is an upper bound of its exact counterpart:

* ``|b_i - b^_i| <= gamma_{d+2} ||x_i|| ||v|| + tau(x_i, v)`` (rounding X and v to float32 adds
  the ``+2``); likewise ``a = X'(w - w0)``, and ``s = s0 + a`` with ``s0 = X'w0`` in float64;
* ``|dc_i - dc^_i| <= gamma ||x_i|| eps_a`` (``gamma`` the Lipschitz constant of ``l''``);
* ``||S - S^|| <= ||X'||_F (||eta|| + gamma_{k+3} ||dc^ * b^||)`` with
  ``eta_i = gamma eps_a,i |b|_i + |dc^_i| eps_b,i`` and k the rows per float32 block (blocks are
  summed in float64), plus ``sqrt(d) tau`` per block.

Underflow: a float32 operation whose result falls below the smallest normal number ``2^-126``
errs by at most that much in absolute terms (also where the CPU flushes subnormals to zero), so
each dot product of length k adds ``tau(x, y) = 2^-125 (||x||_1 + ||y||_1 + k)``: the inputs'
conversions and the k products. It matters only for values below 1e-30, which the relative terms
cannot cover (a product of 1e-62 becomes 0 in float32).

Float64 arithmetic is taken as exact, as everywhere in the certified head: its relative rounding
(1e-16) is twelve orders below the terms bounded here.
"""

from __future__ import annotations

import numpy as np

from fedunlearn.certified.losses import lipschitz_gamma, second_derivative
from fedunlearn.errors import ConfigError

#: Unit roundoff of IEEE float32 (round to nearest).
UNIT_ROUNDOFF_SINGLE = 2.0**-24
#: Twice the smallest normal float32: bounds the absolute error of an underflowing operation, with
#: or without flush-to-zero, and of the conversion feeding it (module docstring, "Underflow").
_UNDERFLOW = 2.0**-125

#: Rows per block: small enough to stay in cache between X's two uses, and the length of each
#: float32 dot product of ``X'^T y`` (Higham's gamma grows with it).
STALE_BLOCK = 2048


def rounding_gamma(length: int, unit: float = UNIT_ROUNDOFF_SINGLE) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)`` (eq. (3.8)): the relative error bound of a sum of k
    products in precision u."""
    if length * unit >= 1.0:
        raise ConfigError("length", length, f"fewer than {1.0 / unit:.0f} terms per float32 sum")
    return length * unit / (1.0 - length * unit)


def stale_terms(
    loss: str,
    features_single: np.ndarray,
    row_norms: np.ndarray,
    targets: np.ndarray,
    present: np.ndarray,
    anchor_scores: np.ndarray,
    weights: np.ndarray,
    anchor: np.ndarray,
    step: np.ndarray,
    *,
    anchor_curvature: np.ndarray | None = None,
    drift: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The step's per-sample terms at ``w`` and the stale vector S, from float32 passes.

    ``features_single`` is X in float32 (n, d); ``row_norms`` ``||x_i||`` in float64;
    ``anchor_scores`` ``X w0^T`` (n, K) in float64 (and ``anchor_curvature`` ``l''`` there, when
    known); ``present`` (n,) bool marks D'. ``drift``, when known, is ``(a^, e)``: ``a^`` (n, K)
    approximates ``a = X (w - w0)^T`` with ``|a - a^| <= e`` elementwise (the previous request's
    ``next_drift``); otherwise it is computed. Returns, per head, upper bounds ``b4 >= sum_{i in D'}
    b_i^4`` and ``b2 >= sum b_i^2``, the float32 value ``stale`` of S (K, d), ``stale_error >=
    ||S - stale||`` (module docstring), and ``next_drift``, the ``drift`` of ``w + v``. X is read
    once: each block of :data:`STALE_BLOCK` rows gives its ``b`` and then, still in cache, its share
    of S.
    """
    n, d = features_single.shape
    heads = len(step)
    if anchor_curvature is None:
        anchor_curvature = second_derivative(loss, anchor_scores, targets)
    if drift is None:
        moved = weights - anchor
        drift = (_products(features_single, moved.astype(np.float32)), _dot_error(row_norms, moved))
    a_hat, eps_a = drift
    direction = step.astype(np.float32)
    b_hat = np.empty((n, heads))
    change = np.empty((n, heads))
    stale = np.zeros((heads, d))
    for start in range(0, n, STALE_BLOCK):
        block = slice(start, start + STALE_BLOCK)
        rows = features_single[block]
        b_hat[block] = _products(rows, direction)
        scores = anchor_scores[block] + a_hat[block]
        change[block] = second_derivative(loss, scores, targets[block]) - anchor_curvature[block]
        change[block] *= present[block, None]
        product = (change[block] * b_hat[block]).astype(np.float32)
        stale += _products(rows.T, product.T).T  # float32 in the block, float64 across
    eps_b = _dot_error(row_norms, step)
    terms = _with_rounding_bounds(loss, row_norms, present, eps_a, eps_b, b_hat, change, stale)
    terms["next_drift"] = (a_hat + b_hat, eps_a + eps_b)
    return terms


def _products(matrix: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``matrix @ vectors^T`` (float32 -> float64) for a few vectors, one matrix-vector product
    each (a GEMM with two or three columns is slower than as many GEMVs in OpenBLAS)."""
    return np.stack([(matrix @ v).astype(np.float64) for v in vectors], axis=-1)


def _dot_error(row_norms: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """(n, K) bounds of ``|x_i^T v_k - fl32(x_i)^T fl32(v_k)|`` computed in float32: Higham's
    ``gamma_{d+2} ||x_i|| ||v_k||`` plus underflow ``tau`` (``||x_i||_1 <= sqrt(d) ||x_i||``)."""
    d = vectors.shape[1]
    relative = rounding_gamma(d + 2) * np.outer(row_norms, np.linalg.norm(vectors, axis=1))
    one_norms = np.sum(np.abs(vectors), axis=1)
    return relative + _UNDERFLOW * (np.sqrt(d) * row_norms[:, None] + one_norms + d)


def _with_rounding_bounds(loss, row_norms, present, eps_a, eps_b, b_hat, change, stale):
    """The float32 results with the bounds of the module docstring applied; ``eps_a``/``eps_b``
    (n, K) bound the errors of ``a^``/``b^``."""
    n, d = len(b_hat), stale.shape[1]
    keep = present[:, None]
    b_abs = (np.abs(b_hat) + eps_b) * keep
    gamma = lipschitz_gamma(loss, "exact")
    eta = (gamma * eps_a * b_abs + np.abs(change) * eps_b) * keep
    frobenius = float(np.sqrt(np.sum(np.square(row_norms[present]))))
    g_block = rounding_gamma(min(STALE_BLOCK, n) + 3)
    product = change * b_hat
    underflow = np.sqrt(d) * _UNDERFLOW * (2 * n + np.sum(np.abs(product), axis=0))
    stale_error = (
        frobenius * (np.linalg.norm(eta, axis=0) + g_block * np.linalg.norm(product, axis=0))
        + underflow
    )
    b_squared = np.square(b_abs)
    return {
        "b4": np.sum(np.square(b_squared), axis=0),
        "b2": np.sum(b_squared, axis=0),
        "stale": stale,
        "stale_error": stale_error,
    }
