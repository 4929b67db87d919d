"""Client sampling per round (``fraction-train``): Flower's size rule, a draw that depends on the
seed, the phase, the round and the set of clients only, and the methods that hold under it; the
others refused before training, by name and reason."""

from __future__ import annotations

import pytest

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING
from fedunlearn.training.sampling import round_seed, sample_partitions, sample_size


@pytest.mark.parametrize(
    ("available", "fraction", "minimum", "expected"),
    [
        (10, 0.5, 2, 5),
        (10, 0.1, 2, 2),
        (10, 0.15, 1, 1),
        (3, 0.5, 2, 2),
        (1, 0.5, 2, 1),
        (7, 1.0, 2, 7),
    ],
)
def test_a_round_trains_flowers_number_of_clients_never_more_than_there_are(
    available, fraction, minimum, expected
):
    # Flower's FedAvg: max(int(n * fraction_train), min_train_nodes); ours caps it at n
    assert sample_size(available, fraction, minimum) == expected


def test_the_draw_is_the_seeds_not_the_orders_and_differs_between_rounds_and_phases():
    clients = list(range(20))
    first = sample_partitions(clients, 0.25, 2, round_seed(0, "train", 1))
    assert len(first) == 5 and first == sorted(first) and set(first) <= set(clients)
    assert sample_partitions(reversed(clients), 0.25, 2, round_seed(0, "train", 1)) == first
    draws = {
        tuple(sample_partitions(clients, 0.25, 2, round_seed(seed, phase, r)))
        for seed in (0, 1)
        for phase in ("train", "fedretrain")
        for r in range(1, 6)
    }
    assert len(draws) > 15  # 20 draws of 5 of 20 clients: collisions are rare, not the rule


def test_every_client_is_drawn_about_as_often_as_the_others():
    counts = dict.fromkeys(range(10), 0)
    for r in range(1, 401):
        for p in sample_partitions(range(10), 0.3, 1, round_seed(7, "train", r)):
            counts[p] += 1
    assert sum(counts.values()) == 400 * 3
    assert all(90 <= c <= 150 for c in counts.values()), counts  # 120 expected each


@pytest.mark.parametrize(("fraction", "minimum"), [(0.0, 2), (1.5, 2), (0.5, 0)])
def test_a_fraction_or_minimum_out_of_range_is_refused_by_name(fraction, minimum):
    with pytest.raises(ConfigError) as refused:
        sample_size(10, fraction, minimum)
    assert refused.value.parameter in ("fraction-train", "min-train-clients")


def test_the_config_refuses_a_sampled_run_with_a_method_that_needs_every_client():
    ok = ExperimentConfig.from_run_config(
        {"fraction-train": 0.5, "unlearn-methods": "federaser,fedaccum,fedretrain"}
    )
    assert ok.fraction_train == 0.5 and ok.min_train_clients == 2
    for spec in UNLEARNING:
        if spec.sampling:  # FedEraser, FedAccum, FedRetrain, FedRecover, Crab, SIFU: accepted
            values = {"fraction-train": 0.5, "unlearn-methods": f"{spec.name},fedretrain"}
            assert ExperimentConfig.from_run_config(values).fraction_train == 0.5
            continue
        values = {
            "fraction-train": 0.5,
            "unlearn-methods": f"{spec.name},fedretrain",
            "allow-target-participation": True,
            "retain-mode": "full",
        }
        with pytest.raises(ConfigError) as refused:
            ExperimentConfig.from_run_config(values)
        assert refused.value.parameter == "fraction-train"
        assert f"{spec.name}: {spec.sampling_note}" in str(refused.value)
        assert "e.g. 'fedretrain'" in str(refused.value)
        # at fraction-train 1 (the default) the same methods run
        ExperimentConfig.from_run_config({**values, "fraction-train": 1.0})


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"dp-noise-multiplier": 1.0}, "DP-FedAvg"),
        ({"judge-models": 4}, "a judge run"),
        ({"num-clients": 3, "min-train-clients": 4}, r"at most num-clients \(3\)"),
        (  # 10 clients, one forgotten: FedRetrain's rounds train int(9 x 0.5) = 4 <= 2f + 2
            {
                "num-clients": 10,
                "strategy": "krum",
                "krum-malicious": 1,
                "unlearn-methods": "fedretrain",
            },
            "Krum's condition n > 2f [+] 2 .* would train 4 clients",
        ),
    ],
)
def test_sampling_is_refused_where_every_client_every_round_is_assumed(extra, says):
    with pytest.raises(ConfigError, match=says):
        ExperimentConfig.from_run_config({"fraction-train": 0.5, **extra})
    ExperimentConfig.from_run_config({"fraction-train": 1.0, **extra})  # not refused at 1


def test_krum_with_sampling_runs_when_every_round_keeps_its_condition():
    values = {"num-clients": 10, "strategy": "krum", "krum-malicious": 1}
    config = ExperimentConfig.from_run_config(
        {**values, "unlearn-methods": "fedretrain", "fraction-train": 0.6}
    )
    assert config.fraction_train == 0.6  # int(9 x 0.6) = 5 > 2f + 2 = 4
