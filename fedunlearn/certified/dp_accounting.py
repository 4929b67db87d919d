"""Privacy accounting for a body trained with DP-FedAvg, and its composition with certified removal.

Guo et al., *Certified Data Removal from Machine Learning Models* (ICML 2020), Theorem 5: if the
feature extractor phi (here the model's ``body``) is the output of an (ε_DP, δ_DP)-differentially
private mechanism, and the removal mechanism for the linear model on top of phi (the ``head``) is
(ε_CR, δ_CR)-certified removal, then the whole procedure is (ε_DP + ε_CR, δ_DP + δ_CR)-certified
removal. :func:`compose_certificates` is that sum.

The body's (ε_DP, δ_DP) comes from DP-FedAvg (McMahan et al., *Learning Differentially Private
Recurrent Language Models*, ICLR 2018), the federated form of DP-SGD (Abadi et al., *Deep Learning
with Differential Privacy*, CCS 2016): each round the sampled clients' model updates are clipped to
L2 norm C, summed, and Gaussian noise of standard deviation z·C is added to the sum (z is the noise
multiplier; Flower's central-DP wrappers add z·C/n to the mean of n clipped updates, the same
thing). One round is a sampled Gaussian mechanism with sampling rate q; ``rounds`` rounds compose.
:func:`dp_fedavg_epsilon` accounts for that composition in Rényi differential privacy (Mironov,
*Rényi Differential Privacy*, CSF 2017; the sampled Gaussian bound of Mironov, Talwar and Zhang 2019)
with Opacus's :class:`opacus.accountants.RDPAccountant`, which converts RDP to (ε, δ)-DP with
Theorem 21 of Balle et al. 2020.

Notes
-----
* DP-FedAvg gives *client-level* DP: neighbouring datasets differ in one client's entire data. That
  covers removing any part of one client's data, a single sample included.
* The RDP bound of the sampled Gaussian mechanism assumes Poisson sampling of clients at rate q.
  With full participation (every client every round, ``sample_rate=1``) the bound is exact for
  the plain Gaussian mechanism; Flower's ``FedAvg`` samples a fixed number of clients without
  replacement, for which the Poisson bound with q = n/N is the usual approximation, not a proof.
* The sensitivity z·C is that of an unweighted sum: the mean must use equal client weights (or the
  fixed denominator of McMahan et al.), not weights proportional to ``num-examples``.

Nothing here imports ``flwr``; Opacus is imported only when an ε is computed.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence

from fedunlearn.errors import ConfigError

__all__ = ["compose_certificates", "dp_fedavg_epsilon"]


def _rdp_accountant_class():
    """Opacus's RDP accountant, imported on first use (Opacus is an optional dependency).

    Opacus configures the root logger when it is imported (``logging.basicConfig`` in
    ``opacus/utils/module_utils.py``), after which every library's log records, Flower's included,
    are printed a second time in its format; the root logger's handlers are put back as they were.
    """
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        from opacus.accountants import RDPAccountant
    except ImportError as exc:  # pragma: no cover - exercised with a patched import
        raise ImportError(
            "fedunlearn.certified.dp_accounting needs Opacus for its RDP accountant; "
            "install it with `pip install opacus`"
        ) from exc
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
    return RDPAccountant


def _real(parameter: str, value: object) -> float:
    """``value`` as a finite float, or a ConfigError naming ``parameter``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(parameter, value, "a real number")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(parameter, value, "a finite number")
    return number


def dp_fedavg_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    rounds: int,
    delta: float,
    *,
    alphas: Sequence[float] | None = None,
) -> float:
    """ε of central DP-FedAvg after ``rounds`` rounds, at ``delta``, by RDP accounting.

    Each round is the sampled Gaussian mechanism of Abadi et al. (2016) and McMahan et al. (2018):
    clients sampled with probability ``sample_rate``, their updates clipped to norm C and summed,
    plus N(0, (noise_multiplier·C)² I). The RDP of one round (Mironov 2017; Mironov et al. 2019)
    is multiplied by ``rounds`` and converted to (ε, δ)-DP by Opacus's ``RDPAccountant``.

    Parameters
    ----------
    noise_multiplier : float
        z, the ratio of the noise's standard deviation to the clipping norm; > 0.
    sample_rate : float
        q, the probability that a client takes part in a round, in (0, 1]; 1 for full
        participation (every client every round).
    rounds : int
        T, the number of rounds (compositions), >= 1.
    delta : float
        δ_DP of the guarantee, in (0, 1); typically below 1 / (number of clients).
    alphas : sequence of float, optional
        RDP orders to optimise over; default Opacus's ``RDPAccountant.DEFAULT_ALPHAS``.

    Returns
    -------
    float
        ε_DP such that the trained model is (ε_DP, ``delta``)-DP at client level.

    Raises
    ------
    ConfigError
        If a parameter is out of range; the error names it.
    ImportError
        If Opacus is not installed.

    Examples
    --------
    >>> round(dp_fedavg_epsilon(4.0, 0.01, 10_000, 1e-5), 2)  # doctest: +SKIP
    1.04
    """
    z = _real("noise_multiplier", noise_multiplier)
    if z <= 0:
        raise ConfigError("noise_multiplier", noise_multiplier, "a number > 0")
    q = _real("sample_rate", sample_rate)
    if not 0 < q <= 1:
        raise ConfigError("sample_rate", sample_rate, "a number in (0, 1]")
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral):
        raise ConfigError("rounds", rounds, "an integer >= 1")
    if rounds < 1:
        raise ConfigError("rounds", rounds, "an integer >= 1")
    d = _real("delta", delta)
    if not 0 < d < 1:
        raise ConfigError("delta", delta, "a number in (0, 1)")
    if alphas is not None:
        orders = [_real("alphas", a) for a in alphas]
        if not orders or any(a <= 1 for a in orders):
            raise ConfigError("alphas", alphas, "a non-empty sequence of RDP orders > 1")
    else:
        orders = None

    accountant = _rdp_accountant_class()()
    accountant.history = [(z, q, int(rounds))]
    return float(accountant.get_epsilon(delta=d, alphas=orders))


def compose_certificates(
    eps_dp: float, delta_dp: float, eps_cr: float, delta_cr: float
) -> tuple[float, float]:
    """(ε_DP + ε_CR, δ_DP + δ_CR): certified removal on top of a DP body (Guo et al. 2020, Thm. 5).

    Parameters
    ----------
    eps_dp, delta_dp : float
        The body's differential-privacy guarantee, e.g. from :func:`dp_fedavg_epsilon`; >= 0.
    eps_cr, delta_cr : float
        The head's certified-removal guarantee; >= 0.

    Returns
    -------
    tuple of float
        (ε, δ) of the combined certified removal.

    Raises
    ------
    ConfigError
        If an input is negative or not finite, or a δ exceeds 1; the error names it.
    """
    values = {"eps_dp": eps_dp, "delta_dp": delta_dp, "eps_cr": eps_cr, "delta_cr": delta_cr}
    checked = {}
    for name, value in values.items():
        number = _real(name, value)
        if number < 0:
            raise ConfigError(name, value, "a number >= 0")
        if name.startswith("delta") and number > 1:
            raise ConfigError(name, value, "a probability in [0, 1]")
        checked[name] = number
    return (
        checked["eps_dp"] + checked["eps_cr"],
        checked["delta_dp"] + checked["delta_cr"],
    )
