"""The loss perturbation b of certified removal (Guo et al. 2020, Algorithm 1 and Theorem 3).

A certificate's guarantee holds over the randomness of b: whoever knows b can tell a Newton-removed
head from a retrained one by its gradient residual ``||grad L_b(w; D')||``. So b is drawn from the
operating system's cryptographic randomness (``os.urandom``), never from a generator seeded with a
number that a run config, a log or a file could reveal, and is never written anywhere.

Uniforms are 53-bit integers ``k`` from ``os.urandom`` mapped to ``(k + 1/2) / 2^53`` (strictly
inside (0, 1), so every inverse CDF is finite); a normal is ``Phi^{-1}(u)`` and a Gamma(D, sigma) norm is
``sigma P^{-1}(D, u)`` with ``P`` the regularised lower incomplete gamma function (SciPy's
``ndtri`` and ``gammaincinv``). Tests may pass a :class:`numpy.random.Generator` instead: the same
transforms then read its 53-bit integers.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.special

from fedunlearn.errors import ConfigError

#: Theorem 3's two densities, and no perturbation (least squares only).
NOISES = ("gaussian", "gamma", "none")

_BITS = 53


def uniforms(size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``size`` independent uniforms in the open interval (0, 1) with 53 random bits each, from
    ``os.urandom`` (``rng=None``) or from ``rng`` (tests)."""
    if rng is None:
        words = np.frombuffer(os.urandom(8 * size), dtype="<u8")
        integers = words >> np.uint64(64 - _BITS)
    else:
        integers = rng.integers(0, 2**_BITS, size=size, dtype=np.uint64)
    return (integers.astype(np.float64) + 0.5) / float(2**_BITS)


def standard_normals(size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """``size`` independent N(0, 1) draws by the inverse CDF of :func:`uniforms`."""
    return scipy.special.ndtri(uniforms(size, rng))


def gamma_norm(dimension: int, scale: float, rng: np.random.Generator | None = None) -> float:
    """One Gamma(dimension, scale) draw: the norm of b with density ``~ exp(-||b|| / scale)`` in
    ``dimension`` dimensions (Theorem 3's epsilon-CR mechanism)."""
    return float(scale * scipy.special.gammaincinv(dimension, uniforms(1, rng)[0]))


def check_generator(rng: object) -> np.random.Generator | None:
    """``rng`` if it is ``None`` (OS randomness) or a NumPy Generator; an integer seed is refused."""
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ConfigError(
            "rng",
            rng,
            "None (b from the operating system's randomness) or a numpy.random.Generator for "
            "tests; a seed would let anyone who knows it compute b and void the certificate",
        )
    return rng


def sample_perturbation(
    noise: str, sigma: float, shape: tuple[int, ...], rng: np.random.Generator | None = None
) -> np.ndarray:
    """The perturbation b of Algorithm 1, shape ``shape``: Gaussian N(0, sigma^2) entries
    ((epsilon, delta)-CR), or a uniform direction times a Gamma(D, sigma) norm (epsilon-CR,
    D = prod(shape)); zeros for ``noise="none"``. ``rng=None`` draws from ``os.urandom``."""
    if noise not in NOISES:
        raise ConfigError("noise", noise, f"one of {', '.join(NOISES)}")
    check_generator(rng)
    size = int(np.prod(shape))
    if noise == "gaussian":
        return sigma * standard_normals(size, rng).reshape(shape)
    if noise == "gamma":
        direction = standard_normals(size, rng)
        direction /= np.linalg.norm(direction)
        return (gamma_norm(size, sigma, rng) * direction).reshape(shape)
    return np.zeros(shape)
