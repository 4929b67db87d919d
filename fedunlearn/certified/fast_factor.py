"""The fast removal mode's cached Hessian: an eigendecomposition, downdated by Woodbury.

Guo et al.'s removal step (Algorithm 2) solves ``H' v = Delta`` with
``H' = A - U U^T + mu I``: ``A`` the data part of the Hessian at an anchor ``w0``, ``U``'s columns
``sqrt(l''(x_j^T w0)) x_j`` of the samples removed since, ``mu = lambda n'`` with ``n'`` the
remaining count. With ``A = Q diag(eig) Q^T`` and ``P = Q^T U`` this is, in the eigenbasis,
``(D_mu - P P^T) c = Q^T Delta``, ``D_mu = diag(eig + mu)``, ``v = Q c``.

Woodbury's identity solves it through the capacitance ``C = I - P^T D^{-1} P`` (r x r, positive
definite because ``D - P P^T`` is a Hessian). ``C`` is kept at one shift ``mu_c`` and its Cholesky
factor is bordered when samples are removed (O(r^2 m + d r m) per m rows), so a request never
re-forms it; the remaining count's shift ``mu != mu_c`` is reached by iterative refinement in the
eigenbasis, which contracts by ``|mu - mu_c| / mu_c`` (``lambda_min(D_c - P P^T) >= mu_c``) per
iteration; past :data:`MAX_SHIFT_RATIO` the capacitance is re-formed at ``mu`` instead. The
residual returned with each solution is the exact system's, ``||(D_mu - P P^T) c - Q^T Delta||``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

#: Largest ``|mu - mu_c| / mu_c`` refined over; beyond it the capacitance is re-formed at mu.
MAX_SHIFT_RATIO = 0.05
#: Refinement stops at this relative residual (float64 rounding) or after :data:`MAX_REFINE` steps.
REFINE_TOLERANCE = 1e-15
MAX_REFINE = 12


@dataclass(frozen=True)
class FastFactor:
    """``A = q diag(eig) q^T`` at the anchor, ``p = q^T U`` (d, r) for the removed rows, and the
    lower Cholesky factor ``chol`` of the capacitance at shift ``mu``. Immutable: a request builds
    new factors, so a failed request leaves the cached ones untouched."""

    q: np.ndarray
    eig: np.ndarray
    p: np.ndarray
    mu: float
    chol: np.ndarray

    @classmethod
    def from_hessian(cls, hessian: np.ndarray, mu: float) -> FastFactor:
        """The factor of a data Hessian ``A`` (d, d) with no row removed, shifted by ``mu``."""
        eig, q = np.linalg.eigh(hessian)
        d = len(eig)
        return cls(q, eig, np.zeros((d, 0)), float(mu), np.zeros((0, 0)))

    @property
    def rank(self) -> int:
        return self.p.shape[1]

    def _inverse_diagonal(self) -> np.ndarray:
        return 1.0 / (self.eig + self.mu)

    def with_rows(self, rows: np.ndarray, mu: float) -> FastFactor:
        """The factor after removing samples whose Hessian factor rows are ``rows`` (m, d), for
        solves at shift ``mu``. Raises ``numpy.linalg.LinAlgError`` when rounding leaves the
        bordered capacitance indefinite (the caller refactors the Hessian)."""
        new = self.q.T @ rows.T
        p = np.concatenate([self.p, new], axis=1)
        if abs(mu - self.mu) > MAX_SHIFT_RATIO * self.mu:
            return self._reshifted(p, mu)
        scaled = self._inverse_diagonal()[:, None] * new
        corner = np.eye(new.shape[1]) - new.T @ scaled
        if self.rank:
            lower = scipy.linalg.solve_triangular(
                self.chol, -(self.p.T @ scaled), lower=True, check_finite=False
            ).T
            corner = corner - lower @ lower.T
        else:
            lower = np.zeros((new.shape[1], 0))
        tail = np.linalg.cholesky(corner)
        chol = np.block([[self.chol, np.zeros((self.rank, new.shape[1]))], [lower, tail]])
        return FastFactor(self.q, self.eig, p, self.mu, chol)

    def _reshifted(self, p: np.ndarray, mu: float) -> FastFactor:
        scaled = p / (self.eig + mu)[:, None]
        chol = np.linalg.cholesky(np.eye(p.shape[1]) - p.T @ scaled)
        return FastFactor(self.q, self.eig, p, float(mu), chol)

    def _apply_inverse(self, z: np.ndarray) -> np.ndarray:
        """``(D_c - P P^T)^{-1} z`` by Woodbury at the capacitance's shift."""
        scaled = self._inverse_diagonal() * z
        if not self.rank:
            return scaled
        inner = scipy.linalg.cho_solve((self.chol, True), self.p.T @ scaled, check_finite=False)
        return scaled + self._inverse_diagonal() * (self.p @ inner)

    def _residual(self, coef: np.ndarray, rhs: np.ndarray, mu: float) -> np.ndarray:
        return (self.eig + mu) * coef - self.p @ (self.p.T @ coef) - rhs

    def solve(self, rhs: np.ndarray, mu: float) -> tuple[np.ndarray, float]:
        """v with ``(A + mu I - U U^T) v = rhs`` and the norm of that system's residual."""
        y = self.q.T @ rhs
        coef = self._apply_inverse(y)
        residual = self._residual(coef, y, mu)
        norm = float(np.linalg.norm(residual))
        target = REFINE_TOLERANCE * float(np.linalg.norm(y))
        for _ in range(MAX_REFINE if mu != self.mu else 0):
            if norm <= target:
                break
            trial = coef - self._apply_inverse(residual)
            trial_residual = self._residual(trial, y, mu)
            trial_norm = float(np.linalg.norm(trial_residual))
            if trial_norm >= norm:
                break
            coef, residual, norm = trial, trial_residual, trial_norm
        return self.q @ coef, norm
