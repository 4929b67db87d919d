"""The certified head's numerical pieces (:class:`fedunlearn.certified.removal.CertifiedHead`): the
Cholesky solve of exact mode, the fast mode's factors and solves, the top eigenvalue of K', the
BLAS thread limit of a request, and the numerical failures no certificate may rest on."""

from __future__ import annotations

import contextlib

import numpy as np
import scipy.linalg
from threadpoolctl import ThreadpoolController

from fedunlearn.certified.fast_factor import FastFactor
from fedunlearn.certified.statistics import HeadSums
from fedunlearn.errors import FedUnlearnError


class NotConvergedError(FedUnlearnError, RuntimeError):
    """Newton's method did not reach the requested gradient tolerance."""


class NonFiniteSumsError(FedUnlearnError, ArithmeticError):
    """The data returned NaN or infinite sums: no certificate can be computed from them."""


def joint_norm(per_head: np.ndarray) -> float:
    """The joint residual norm of one-vs-rest heads: the root of their squared norms' sum."""
    return float(np.sqrt(np.sum(np.square(per_head))))


def check_finite(what: str, *arrays: np.ndarray | None) -> None:
    """Refuse NaN or infinite sums (:class:`NonFiniteSumsError`): no certificate rests on them."""
    for array in arrays:
        if array is not None and not np.all(np.isfinite(array)):
            raise NonFiniteSumsError(
                f"{what} contain NaN or infinite values; no certificate can rest on them (check "
                "the features, the targets' scale and the clients)"
            )


def cholesky_solve(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``matrix^{-1} rhs`` for a symmetric positive definite matrix, by Cholesky (no inverse formed).

    The factor comes from NumPy's LAPACK, the two triangular solves (O(d^2)) from SciPy: keeping the
    O(d^3) work in the BLAS that also forms the Hessians avoids two BLAS thread pools fighting over
    the cores (SciPy and NumPy each ship an OpenBLAS).
    """
    lower = np.linalg.cholesky(matrix)
    return scipy.linalg.solve_triangular(
        lower.T,
        scipy.linalg.solve_triangular(lower, rhs, lower=True, check_finite=False),
        lower=False,
        check_finite=False,
    )


def top_eigenvalue(matrix: np.ndarray) -> float:
    """λ_max of a symmetric matrix, at least 0 (||X'||_2^2 from K = X'^T X')."""
    return max(float(np.linalg.eigvalsh(matrix)[-1]), 0.0)


def factorise(sums: HeadSums, mu: float) -> tuple[FastFactor, ...]:
    """The fast mode's factor of each head's Hessian at the anchor."""
    return tuple(FastFactor.from_hessian(hessian, mu) for hessian in sums.hessian)


_BLAS: list[ThreadpoolController] = []


def blas_threads(threads: int):
    """A context limiting the BLAS to ``threads`` threads (0: no limit)."""
    if not threads:
        return contextlib.nullcontext()
    if not _BLAS:  # inspecting the loaded libraries takes milliseconds: once per process
        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=threads, user_api="blas")


def fast_solve(factors, delta: np.ndarray, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """Each head's step from its factor, and the solve's residual norms."""
    solved = [factor.solve(delta[k], mu) for k, factor in enumerate(factors)]
    return np.stack([v for v, _ in solved]), np.asarray([r for _, r in solved])
