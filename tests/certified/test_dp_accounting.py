"""ε of DP-FedAvg by RDP accounting (Mironov 2017; Abadi et al. 2016) and Guo et al.'s Theorem 5."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import pytest

from fedunlearn.certified.dp_accounting import compose_certificates, dp_fedavg_epsilon
from fedunlearn.errors import ConfigError

needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="opacus is not installed"
)

DELTA = 1e-5


def _gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float, orders) -> float:
    """Full participation, computed by hand: RDP of the Gaussian mechanism is α / (2σ²) per round
    (Mironov 2017, Prop. 7), composed additively, converted with Balle et al. 2020, Thm. 21."""
    best = math.inf
    for a in orders:
        rdp = rounds * a / (2 * noise_multiplier**2)
        eps = rdp - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a)
        best = min(best, eps)
    return best


@needs_opacus
@pytest.mark.parametrize("q, rounds", [(0.01, 1000), (0.1, 100), (1.0, 20)])
def test_epsilon_decreases_as_the_noise_grows(q, rounds):
    eps = [dp_fedavg_epsilon(z, q, rounds, DELTA) for z in (0.8, 1.0, 1.5, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps


@needs_opacus
@pytest.mark.parametrize("z, q", [(1.1, 0.01), (1.0, 0.2), (2.0, 1.0)])
def test_epsilon_grows_with_the_rounds(z, q):
    eps = [dp_fedavg_epsilon(z, q, t, DELTA) for t in (1, 10, 100, 1000)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


@needs_opacus
@pytest.mark.parametrize("z, rounds", [(1.1, 1000), (2.0, 100)])
def test_epsilon_grows_with_the_sample_rate(z, rounds):
    eps = [dp_fedavg_epsilon(z, q, rounds, DELTA) for q in (0.001, 0.01, 0.1, 0.5, 1.0)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


@needs_opacus
def test_smaller_delta_costs_more_epsilon():
    assert dp_fedavg_epsilon(1.1, 0.05, 200, 1e-7) > dp_fedavg_epsilon(1.1, 0.05, 200, 1e-3)


@needs_opacus
def test_matches_opacus_rdp_accountant_called_directly():
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(300):
        accountant.step(noise_multiplier=1.3, sample_rate=0.05)
    assert accountant.history == [(1.3, 0.05, 300)]
    expected = accountant.get_epsilon(delta=DELTA)
    assert dp_fedavg_epsilon(1.3, 0.05, 300, DELTA) == pytest.approx(expected, rel=1e-12)


@needs_opacus
@pytest.mark.parametrize("z, rounds", [(1.0, 1), (1.0, 50), (3.0, 200), (0.7, 5)])
def test_full_participation_is_the_gaussian_mechanism_composed(z, rounds):
    from opacus.accountants import RDPAccountant

    expected = _gaussian_epsilon(z, rounds, DELTA, RDPAccountant.DEFAULT_ALPHAS)
    assert dp_fedavg_epsilon(z, 1.0, rounds, DELTA) == pytest.approx(expected, rel=1e-9)


@needs_opacus
def test_abadi_et_al_example_is_reproduced_or_tightened():
    """Abadi et al. 2016, Sec. 3.1: q = 0.01, σ = 4, δ = 1e-5, T = 10000 gives ε ≈ 1.26 with the
    moments accountant. RDP with Balle et al.'s conversion is at least as tight: opacus gives ≈ 1.04."""
    eps = dp_fedavg_epsilon(4.0, 0.01, 10_000, DELTA)
    assert 0.9 < eps <= 1.26


@needs_opacus
def test_dp_sgd_mnist_tutorial_ballpark():
    """σ = 1.1, batch 256 of 60000, 60 epochs, δ = 1e-5: the TF-Privacy / Opacus MNIST setting,
    ε ≈ 3 with the older RDP conversion; opacus's tighter conversion gives ≈ 2.6."""
    steps = 60 * 60_000 // 256
    eps = dp_fedavg_epsilon(1.1, 256 / 60_000, steps, DELTA)
    assert 2.0 < eps < 3.1


@needs_opacus
def test_little_noise_and_many_rounds_give_a_large_epsilon():
    # q = 0.01, σ = 1.1, 10000 steps is *not* in the 2-4 band: opacus gives ≈ 5.6.
    eps = dp_fedavg_epsilon(1.1, 0.01, 10_000, DELTA)
    assert 5.0 < eps < 6.5
    assert dp_fedavg_epsilon(0.5, 1.0, 100, DELTA) > 100


@needs_opacus
def test_custom_orders_are_used():
    # Very little privacy loss: the best of opacus's default orders is the largest, 63, and opacus
    # says so; larger orders give a tighter ε.
    with pytest.warns(UserWarning, match="largest alpha"):
        default = dp_fedavg_epsilon(8.0, 0.001, 10, DELTA)
    wider = dp_fedavg_epsilon(
        8.0, 0.001, 10, DELTA, alphas=[1.5, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
    )
    assert wider < default / 2
    with pytest.raises(ConfigError) as info:
        dp_fedavg_epsilon(1.0, 0.1, 10, DELTA, alphas=[0.5, 2])
    assert info.value.parameter == "alphas"


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"noise_multiplier": "1.0"}, "noise_multiplier"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"sample_rate": float("inf")}, "sample_rate"),
        ({"rounds": 0}, "rounds"),
        ({"rounds": 2.5}, "rounds"),
        ({"rounds": True}, "rounds"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -1e-5}, "delta"),
    ],
)
def test_invalid_inputs_name_the_parameter(kwargs, parameter):
    args = {"noise_multiplier": 1.0, "sample_rate": 0.1, "rounds": 10, "delta": DELTA} | kwargs
    with pytest.raises(ConfigError) as info:
        dp_fedavg_epsilon(**args)
    assert info.value.parameter == parameter
    assert parameter in str(info.value)
    assert isinstance(info.value, ValueError)


@needs_opacus
def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    assert dp_fedavg_epsilon(np.float64(1.1), np.float32(0.5), np.int64(3), 1e-5) == pytest.approx(
        dp_fedavg_epsilon(1.1, 0.5, 3, 1e-5), rel=1e-6
    )


def test_compose_certificates_sums_both_guarantees():
    eps, delta = compose_certificates(2.5, 1e-5, 1.0, 1e-4)
    assert eps == pytest.approx(3.5)
    assert delta == pytest.approx(1.1e-4)
    assert compose_certificates(0, 0, 0, 0) == (0.0, 0.0)


@needs_opacus
def test_compose_with_an_accounted_body():
    eps_dp = dp_fedavg_epsilon(1.0, 1.0, 20, 1e-5)
    eps, delta = compose_certificates(eps_dp, 1e-5, 0.1, 1e-6)
    assert eps == pytest.approx(eps_dp + 0.1)
    assert delta == pytest.approx(1.1e-5)


@pytest.mark.parametrize(
    "args, parameter",
    [
        ((-0.1, 0.0, 1.0, 0.0), "eps_dp"),
        ((1.0, -1e-5, 1.0, 0.0), "delta_dp"),
        ((1.0, 0.0, -1.0, 0.0), "eps_cr"),
        ((1.0, 0.0, 1.0, -1e-9), "delta_cr"),
        ((1.0, 0.0, 1.0, 2.0), "delta_cr"),
        ((float("nan"), 0.0, 1.0, 0.0), "eps_dp"),
        ((1.0, 0.0, None, 0.0), "eps_cr"),
    ],
)
def test_compose_rejects_bad_inputs_by_name(args, parameter):
    with pytest.raises(ConfigError) as info:
        compose_certificates(*args)
    assert info.value.parameter == parameter


@needs_opacus
def test_missing_opacus_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    with pytest.raises(ImportError, match="pip install opacus"):
        dp_fedavg_epsilon(1.0, 0.1, 10, DELTA)


def test_module_imports_neither_flower_nor_opacus():
    code = (
        "import sys, fedunlearn.certified.dp_accounting; "
        "bad = [m for m in ('flwr', 'opacus') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_accountant_leaves_the_processs_logging_as_it_was():
    """Opacus calls logging.basicConfig when imported; after the accountant is loaded, Flower's log
    records must not reach a second, root handler (the run's console would print each twice)."""
    script = (
        "import logging\n"
        "from fedunlearn.certified.dp_accounting import dp_fedavg_epsilon\n"
        "dp_fedavg_epsilon(1.0, 1.0, 5, 1e-5)\n"
        "print(len(logging.getLogger().handlers))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "0"
