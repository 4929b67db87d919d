"""Retention around every Flower aggregation (``strategy``), and the run config's refusals of a
method under an aggregation its math does not assume."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from test_retaining_fedavg import _grid, _reply, _state

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.registry import AGGREGATIONS, UNLEARNING, WEIGHTED_MEAN
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.local import train_epochs
from fedunlearn.unlearning.federaser import IntervalRetention
from strategies.aggregation import aggregation_strategy
from strategies.retaining import Retaining


@pytest.fixture(autouse=True)
def _in_a_run(flower_task_identity):
    yield


def _config(**overrides):
    return ExperimentConfig.from_run_config(
        {"num-clients": 5, "unlearn-methods": "fedretrain", **overrides}
    )


def _one_round(strategy, global_state, clients, sizes):
    list(strategy.configure_train(1, ArrayRecord(global_state), ConfigRecord(), _grid(range(5))))
    replies = [_reply(s, n, k, 100 + k) for k, (s, n) in enumerate(zip(clients, sizes))]
    arrays, _ = strategy.aggregate_train(1, replies)
    return arrays.to_torch_state_dict()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_every_aggregation_retains_what_each_client_sent(tmp_path, aggregation):
    """The store keeps U_k = M_k - M^t of every client, whatever the aggregation did with the
    replies (FedMedian pops the arrays it read)."""
    store = UpdateStore(tmp_path / "store")
    config = _config(strategy=aggregation)
    strategy = Retaining(aggregation_strategy(config), store, [IntervalRetention(1)])
    start = _state(0)
    clients, sizes = [_state(k + 1) for k in range(5)], [10, 20, 30, 40, 50]
    model = _one_round(strategy, start, clients, sizes)
    assert store.clients(1) == [0, 1, 2, 3, 4]
    for k, client in enumerate(clients):
        kept = store.read_update(1, k)
        for key in client:
            assert torch.allclose(kept[key], client[key] - start[key], atol=1e-6)
    stacked = {key: torch.stack([c[key] for c in clients]) for key in start}
    if aggregation == "fedmedian":
        expected = {key: value.median(dim=0).values for key, value in stacked.items()}
        # an odd count: numpy's median is the middle value, as torch's
    elif aggregation in WEIGHTED_MEAN:
        weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
        expected = {
            key: (v * weights.view(-1, *[1] * (v.dim() - 1))).sum(0) for key, v in stacked.items()
        }
    else:
        return  # trimmed mean and Krum: Flower's own tests check their arithmetic
    for key in expected:
        assert torch.allclose(model[key], expected[key], atol=1e-5)


@pytest.mark.parametrize("method", UNLEARNING.names())
@pytest.mark.parametrize("aggregation", ("fedmedian", "fedtrimmedavg", "krum"))
def test_a_method_under_an_aggregation_it_does_not_assume_is_refused_naming_both(
    method, aggregation
):
    spec = UNLEARNING[method]
    listed = method if UNLEARNING[method].adoptable else f"{method},fedretrain"
    overrides = {"strategy": aggregation, "unlearn-methods": listed}
    if spec.target_participates:
        overrides["allow-target-participation"] = True
    if spec.aggregations is None or aggregation in spec.aggregations:
        assert _config(**overrides).strategy == aggregation
        return
    with pytest.raises(ConfigError) as refused:
        _config(**overrides)
    assert refused.value.parameter == "strategy"
    assert method in str(refused.value) and aggregation in str(refused.value)


def test_methods_assuming_a_weighted_mean_are_the_history_rebuilders():
    """FedEraser's eq. 2, FedAccum's eq. 5, FedRecover's estimates, Crab's calibration and SIFU's
    bound all assume FedAvg's weighted mean; FedRetrain retrains with the run's own aggregation."""
    for name in ("federaser", "fedaccum", "fedrecover", "crab", "sifu"):
        assert UNLEARNING[name].aggregations == WEIGHTED_MEAN
    assert UNLEARNING["fedretrain"].aggregations is None


def test_krum_needs_more_than_twice_f_plus_two_clients():
    assert _config(strategy="krum", **{"krum-malicious": 1}).krum_malicious == 1
    with pytest.raises(ConfigError, match="krum-malicious=2"):
        _config(strategy="krum", **{"krum-malicious": 2})


def test_fedprox_is_refused_for_a_judge_stack():
    with pytest.raises(ConfigError, match="strategy='fedprox'"):
        _config(strategy="fedprox", **{"judge-models": 4, "num-clients": 8})


def test_the_proximal_term_pulls_local_training_toward_the_global_model():
    """FedProx (Li et al. 2020, eq. 2): with a large mu the client ends nearer w^t than with none;
    mu = 0 is plain SGD, bit for bit."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))

    def distance(mu):
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 3)
        start = [p.detach().clone() for p in model.parameters()]
        train_epochs(model, x, y, epochs=5, lr=0.5, batch_size=16, seed=3, proximal_mu=mu)
        return sum((p - s).pow(2).sum() for p, s in zip(model.parameters(), start)).item()

    assert distance(1.0) < 0.5 * distance(0.0)
    with pytest.raises(ConfigError, match="proximal_mu"):
        distance(-1.0)
