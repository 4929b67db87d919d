"""Malicious clients, through the real ClientApp in this process (no Ray): a client trains on the
poisoned partition the server computes, a scaled-update attacker replies M + λ (M_k − M), and a
federation with a backdoored client learns the backdoor."""

from __future__ import annotations

import pytest
import torch
from federation_grid import ClientAppGrid, K, node_context
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from clients.client_app import create_client_app
from clients.client_state import client_setup
from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data, run_settings
from fedunlearn.data.poisoning import poisoning_success_rate
from fedunlearn.seeding import derive_seed
from fedunlearn.training.local import evaluate
from fedunlearn.training.models import build_dataset_model
from server.training.original import train_federated
from server.training.rounds import train_config_record

pytestmark = pytest.mark.usefixtures("flower_task_identity")

CLEAN = {"num-clients": K, "unlearn-clients": ""}
BACKDOOR = {**CLEAN, "attack-clients": "1", "attack": "backdoor"}


def _context(partition: int, run_config: dict) -> Context:
    return node_context(partition, K, run_config)


def test_a_client_trains_on_the_poisoned_partition_the_server_computes():
    config = ExperimentConfig.from_run_config(BACKDOOR)
    server_side = load_federated_data(config)
    for partition in range(K):
        client = client_setup(_context(partition, BACKDOOR)).data
        assert torch.equal(client.x, server_side.client_split(partition).x)
        assert torch.equal(client.y, server_side.client_split(partition).y)
    clean = load_federated_data(ExperimentConfig.from_run_config(CLEAN)).client_split(1)
    assert not torch.equal(client_setup(_context(1, BACKDOOR)).data.y, clean.y)


def test_a_short_request_poisons_as_the_trained_run_did():
    """An unlearn-only request's run config lacks the attack keys: the message's run settings
    carry them, so a client still holds the partition it was trained on."""
    config = ExperimentConfig.from_run_config(BACKDOOR)
    message = Message(
        RecordDict({"config": ConfigRecord(run_settings(config))}),
        dst_node_id=101,
        message_type="query.describe",
    )
    short = {"unlearn-only": True, "run-name": "poisoned", "unlearn-clients": "1"}
    setup = client_setup(_context(1, short), msg=message)
    assert setup.config.attack_targets == [1] and setup.config.attack == "backdoor"
    assert torch.equal(setup.data.y, load_federated_data(config).client_split(1).y)


def _train_reply(run_config: dict, partition: int, model: dict) -> dict[str, torch.Tensor]:
    """What client ``partition`` replies to round 1's training message, under ``run_config``."""
    config = ExperimentConfig.from_run_config(run_config)
    message = Message(
        RecordDict(
            {
                "arrays": ArrayRecord(model),
                "config": ConfigRecord({**train_config_record(config), "server-round": 1}),
            }
        ),
        dst_node_id=100 + partition,
        message_type="train",
    )
    reply = create_client_app()(message, _context(partition, run_config))
    return reply.content["arrays"].to_torch_state_dict()


def test_a_scaled_update_attacker_replies_the_global_model_plus_lambda_times_its_update():
    clean = {**CLEAN, "local-epochs": 1}
    scaled = {**clean, "attack-clients": "1", "attack": "scaled-update", "attack-scale": 10.0}
    model = build_dataset_model("auto", "digits", (1, 8, 8), 10, seed=derive_seed(0, "m"))
    state = model.state_dict()
    honest = _train_reply(clean, 1, state)  # M_k: what client 1 sends without the attack
    boosted = _train_reply(scaled, 1, state)
    for name, start in state.items():
        if start.is_floating_point():
            expected = start + 10.0 * (honest[name] - start)
            torch.testing.assert_close(boosted[name], expected, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(boosted[k], honest[k]) for k in state)
    # An honest client of the same run replies what it would without an attack.
    bystander, unattacked = _train_reply(scaled, 0, state), _train_reply(clean, 0, state)
    assert all(torch.equal(bystander[k], unattacked[k]) for k in state)


def _trained(tmp_path, run_config: dict, name: str):
    values = {
        **run_config,
        "rounds": 4,
        "local-epochs": 2,
        "retain": False,
        "output-dir": str(tmp_path),
        "run-name": name,
        "node-wait-seconds": 5,
    }
    outcome = train_federated(
        ClientAppGrid(values), ExperimentConfig.from_run_config(values), log=lambda _: None
    )
    model = outcome.new_model()
    model.load_state_dict(outcome.final_state)
    return model, outcome.data


def test_a_backdoored_client_plants_its_backdoor_in_the_global_model(tmp_path):
    attacked, data = _trained(tmp_path, BACKDOOR, "attacked")
    clean, _ = _trained(tmp_path, CLEAN, "clean")
    test = data.splits.test
    attack_success = poisoning_success_rate(attacked, data.attack, test)
    baseline = poisoning_success_rate(clean, data.attack, test)  # the same triggered test inputs
    assert attack_success > 0.4 and baseline < 0.05, (attack_success, baseline)
    # A backdoor, not a collapse: the poisoned model still classifies clean inputs.
    assert evaluate(attacked, test.x, test.y).accuracy > 0.8
