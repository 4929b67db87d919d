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

* ``|b_i - b^_i| <= gamma_{d+2} ||x_i|| ||v||`` (rounding X and v to float32 adds the ``+2``);
  likewise ``a = X'(w - w0)``, and ``s = s0 + a`` with ``s0 = X'w0`` in float64;
* ``|dc_i - dc^_i| <= gamma ||x_i|| eps_a`` (``gamma`` the Lipschitz constant of ``l''``);
* ``||S - S^|| <= ||X'||_F (||eta|| + gamma_{k+3} ||dc^ * b^||)`` with
  ``eta_i = gamma eps_a,i |b|_i + |dc^_i| eps_b,i`` and k the rows per float32 block (blocks are
  summed in float64).

Float64 arithmetic is taken as exact, as everywhere in the certified head: its relative rounding
(1e-16) is twelve orders below the terms bounded here.
"""

from __future__ import annotations

import numpy as np

from fedunlearn.certified.losses import lipschitz_gamma, second_derivative
from fedunlearn.errors import ConfigError

#: Unit roundoff of IEEE float32 (round to nearest).
UNIT_ROUNDOFF_SINGLE = 2.0**-24

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
) -> dict[str, np.ndarray]:
    """The step's per-sample terms at ``w`` and the stale vector S, from float32 passes.

    ``features_single`` is X in float32 (n, d); ``row_norms`` ``||x_i||`` in float64;
    ``anchor_scores`` ``X w0^T`` (n, K) in float64 (and ``anchor_curvature`` ``l''`` there, when
    known); ``present`` (n,) bool marks D'. Returns, per head, upper bounds ``b4 >= sum_{i in D'}
    b_i^4`` and ``b2 >= sum b_i^2``, the float32 value ``stale`` of S (K, d) and
    ``stale_error >= ||S - stale||`` (module docstring). X is read once: each block of
    :data:`STALE_BLOCK` rows gives its ``b`` and ``a`` and then, still in cache, its share of S.
    """
    n, d = features_single.shape
    heads = len(step)
    if anchor_curvature is None:
        anchor_curvature = second_derivative(loss, anchor_scores, targets)
    directions = np.ascontiguousarray(np.concatenate([step, weights - anchor]).astype(np.float32).T)
    b_hat = np.empty((n, heads))
    change = np.empty((n, heads))
    stale = np.zeros((heads, d))
    for start in range(0, n, STALE_BLOCK):
        block = slice(start, start + STALE_BLOCK)
        rows = features_single[block]
        projected = rows @ directions  # b^ and a^ of the block, float32
        keep = present[block, None]
        b_hat[block] = projected[:, :heads] * keep
        scores = anchor_scores[block] + projected[:, heads:]
        change[block] = (
            second_derivative(loss, scores, targets[block]) - anchor_curvature[block]
        ) * keep
        product = (change[block] * b_hat[block]).astype(np.float32)
        stale += product.T @ rows  # float32 within the block, float64 across blocks
    return _with_rounding_bounds(
        loss, row_norms, present, weights, anchor, step, b_hat, change, stale
    )


def _with_rounding_bounds(loss, row_norms, present, weights, anchor, step, b_hat, change, stale):
    """The float32 results with the bounds of the module docstring applied."""
    n, d = len(b_hat), stale.shape[1]
    keep = present[:, None]
    g_dot = rounding_gamma(d + 2)
    eps_b = g_dot * row_norms[:, None] * np.linalg.norm(step, axis=1)
    eps_a = g_dot * row_norms[:, None] * np.linalg.norm(weights - anchor, axis=1)
    b_abs = (np.abs(b_hat) + eps_b) * keep
    gamma = lipschitz_gamma(loss, "exact")
    eta = (gamma * eps_a * b_abs + np.abs(change) * eps_b) * keep
    frobenius = float(np.sqrt(np.sum(np.square(row_norms[present]))))
    g_block = rounding_gamma(min(STALE_BLOCK, n) + 3)
    stale_error = frobenius * (
        np.linalg.norm(eta, axis=0) + g_block * np.linalg.norm(change * b_hat, axis=0)
    )
    b_squared = np.square(b_abs)
    return {
        "b4": np.sum(np.square(b_squared), axis=0),
        "b2": np.sum(b_squared, axis=0),
        "stale": stale,
        "stale_error": stale_error,
    }
