"""Poisoning attacks: only the malicious clients' samples change, as the attack says, the same for
every party; a scaled update is the update boosted λ times; the success readout counts what the
attacker wants."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data, poisoned_data
from fedunlearn.data.poisoning import (
    AttackPlan,
    flip_labels,
    poisoning_success_rate,
    scaled_update,
)
from fedunlearn.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BASE = {"num-clients": 5, "unlearn-clients": ""}


def _load(**attack):
    values = {**BASE, **{key.replace("_", "-"): value for key, value in attack.items()}}
    return load_federated_data(ExperimentConfig.from_run_config(values))


def _changed(poisoned, clean, client):
    a, b = poisoned.client_split(client), clean.client_split(client)
    return (a.x != b.x).flatten(1).any(dim=1), a.y != b.y


def test_a_backdoor_is_planted_in_the_attackers_samples_only():
    clean = _load()
    data = _load(
        attack_clients="1,3", attack="backdoor", attack_fraction=0.5, attack_target_class=4
    )
    plan = data.attack
    assert (plan.attack, plan.clients, plan.target_class) == ("backdoor", (1, 3), 4)
    for client in (1, 3):
        inputs, labels = _changed(data, clean, client)
        assert torch.equal(inputs, labels)  # every triggered sample is relabelled, and only they
        n = len(clean.partitions[client])
        assert int(inputs.sum()) == round(0.5 * n)
        assert set(data.client_split(client).y[inputs].tolist()) == {4}
        assert not (clean.client_split(client).y[inputs] == 4).any()
        assert torch.all(
            data.client_split(client).x[inputs][..., -3:, -3:] == plan.trigger.values[0]
        )
    for client in (0, 2, 4):
        inputs, labels = _changed(data, clean, client)
        assert not inputs.any() and not labels.any()
    assert torch.equal(data.splits.test.x, clean.splits.test.x)
    assert torch.equal(data.splits.test.y, clean.splits.test.y)
    changed = torch.nonzero(data.splits.train.y != clean.splits.train.y).flatten()
    assert torch.equal(plan.poisoned, changed)


def test_label_flip_maps_every_label_of_an_attacker_to_c_minus_1_minus_y():
    clean = _load()
    data = _load(attack_clients="2", attack="label-flip")
    poisoned, honest = data.client_split(2), clean.client_split(2)
    assert torch.equal(poisoned.y, 9 - honest.y) and torch.equal(poisoned.x, honest.x)
    assert len(data.attack.poisoned) == len(honest.y)
    for client in (0, 1, 3, 4):
        assert torch.equal(data.client_split(client).y, clean.client_split(client).y)


def test_label_flip_of_a_fraction_flips_that_many_drawn_by_the_seed():
    y = torch.arange(100) % 3  # C = 3: class 1 maps to itself and is never drawn
    flipped_y, flipped = flip_labels(y, num_classes=3, fraction=0.3, seed=5)
    assert len(flipped) == 30 and not (y[flipped] == 1).any()
    assert torch.equal(flipped_y[flipped], 2 - y[flipped])
    untouched = torch.ones(100, dtype=torch.bool)
    untouched[flipped] = False
    assert torch.equal(flipped_y[untouched], y[untouched])
    assert torch.equal(flip_labels(y, num_classes=3, fraction=0.3, seed=5)[1], flipped)
    assert not torch.equal(flip_labels(y, num_classes=3, fraction=0.3, seed=6)[1], flipped)
    with pytest.raises(ConfigError) as refused:
        flip_labels(torch.ones(10, dtype=torch.long), num_classes=3, fraction=1.0, seed=0)
    assert refused.value.parameter == "attack-fraction"


def test_scaled_update_leaves_the_samples_alone_and_records_lambda():
    clean = _load()
    data = _load(attack_clients="0", attack="scaled-update", attack_scale=7.5)
    assert data.attack.scale == 7.5 and len(data.attack.poisoned) == 0
    assert data.splits is clean.splits


def test_a_backdoor_too_small_to_plant_names_the_attack_fraction():
    data = _load()
    with pytest.raises(ConfigError) as refused:
        poisoned_data(data, "backdoor", (0,), fraction=1e-6, target_class=0, scale=1.0, seed=0)
    assert refused.value.parameter == "attack-fraction"


def _digest(data) -> str:
    train = data.splits.train
    return hashlib.sha256(train.x.numpy().tobytes() + train.y.numpy().tobytes()).hexdigest()


def test_another_process_poisons_the_same_samples():
    """The server and every client load the data in their own process: the poisoned partitions
    follow from the run configuration alone."""
    values = {**BASE, "attack-clients": "1,4", "attack": "backdoor", "attack-fraction": 0.3}
    here = _digest(load_federated_data(ExperimentConfig.from_run_config(values)))
    script = (
        "import hashlib; from fedunlearn.config import ExperimentConfig;"
        "from fedunlearn.data.federated_data import load_federated_data;"
        f"t = load_federated_data(ExperimentConfig.from_run_config({values!r})).splits.train;"
        "print(hashlib.sha256(t.x.numpy().tobytes() + t.y.numpy().tobytes()).hexdigest())"
    )
    there = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert there == here
    other_seed = _digest(
        load_federated_data(ExperimentConfig.from_run_config({**values, "seed": 1}))
    )
    assert other_seed != here


def test_scaled_update_is_the_global_model_plus_lambda_times_the_update():
    sent = {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    trained = {"w": torch.tensor([1.5, 1.0]), "steps": torch.tensor(5)}
    reply = scaled_update(sent, trained, 10.0)
    assert torch.allclose(reply["w"], torch.tensor([6.0, -8.0]))
    assert reply["steps"] == 5  # an integer buffer is the client's own, not scaled
    assert torch.equal(scaled_update(sent, trained, 1.0)["w"], trained["w"])
    with pytest.raises(ConfigError):
        scaled_update(sent, {"w": trained["w"]}, 10.0)


def _success(model, data):
    return poisoning_success_rate(model, data.attack, data.splits.test)


class _Always(nn.Module):
    """A classifier that answers ``label`` whatever the input."""

    def __init__(self, label: int, classes: int = 10):
        super().__init__()
        self.label, self.classes = label, classes
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        logits = torch.zeros(len(x), self.classes)
        logits[:, self.label] = 1.0
        return logits


def test_backdoor_success_is_the_share_of_triggered_inputs_labelled_the_target():
    data = _load(attack_clients="1", attack="backdoor", attack_target_class=6)
    assert _success(_Always(6), data) == 1.0
    assert _success(_Always(2), data) == 0.0


def test_label_flip_success_is_the_share_of_test_samples_predicted_as_c_minus_1_minus_y():
    data = _load(attack_clients="1", attack="label-flip")
    test_y = data.splits.test.y
    # Always answering 9 is what the attacker wants exactly for the test samples of class 0.
    assert _success(_Always(9), data) == pytest.approx(float((test_y == 0).mean(dtype=torch.float)))


def test_no_attack_and_scaled_update_have_no_success_rate():
    assert torch.isnan(torch.tensor(_success(_Always(0), _load())))
    data = _load(attack_clients="1", attack="scaled-update")
    assert torch.isnan(torch.tensor(_success(_Always(0), data)))


def test_an_unknown_attack_is_refused_by_name():
    with pytest.raises(ConfigError) as refused:
        AttackPlan("trim", (0,), 10)
    assert refused.value.parameter == "attack"
