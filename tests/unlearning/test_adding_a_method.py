"""docs/adding-a-method.md, run: a method with its own retention policy and state is one module,
one registry line (and its config keys, here none) and this test. Registered, it is trained for,
run, tabulated, and forgetting a client takes the client out of its policy's state."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import StoreCorruptionError
from fedunlearn.registry import UNLEARNING, retention_policies, run_retention
from fedunlearn.store.history import forget_clients, load_policy, policy_state_problems
from fedunlearn.store.retention import STATE_KEY, RetentionPolicy, Selection
from fedunlearn.store.update_store import UpdateStore


# ------------------------------------------------------------------ the toy method (the doc's)
class Snapshots(RetentionPolicy):
    """Keeps the global model every Δt rounds, and in its state how many rounds each client
    took part in (a state that names clients)."""

    name = "snapshots"
    keeps_updates = False

    def __init__(self, every: int, rounds: dict[int, int] | None = None) -> None:
        self.every, self.rounds = every, dict(rounds or {})

    @classmethod
    def from_config(cls, config):
        return cls(config.retain_interval)

    @classmethod
    def from_state(cls, state):
        return cls(state["every"], {int(k): int(v) for k, v in state["rounds"].items()})

    def select(self, server_round, global_state, updates, num_examples, *, loss=None):
        for client in updates:
            self.rounds[client] = self.rounds.get(client, 0) + 1
        return Selection((server_round - 1) % self.every == 0, frozenset())

    def state_dict(self):
        return {"every": self.every, "rounds": {str(k): v for k, v in self.rounds.items()}}

    def load_state_dict(self, state):
        self.rounds = Snapshots.from_state(state).rounds

    def forget(self, clients):
        self.rounds = {k: v for k, v in self.rounds.items() if k not in set(clients)}


def first_snapshot(context, name):
    """Forget by rolling back to the first kept global model, M^1: no client's data is in it."""
    history = context.history(name)
    first = history.rounds()[0]
    return history.read_global(first), {"did": f"rolled back to round {first}"}


# ------------------------------------------------------------------ the claims
def test_the_registered_policy_is_what_a_run_of_the_method_keeps():
    with UNLEARNING.registered("first-snapshot", first_snapshot, retention=Snapshots):
        assert retention_policies()["snapshots"] is Snapshots
        config = ExperimentConfig.from_run_config(
            {"unlearn-methods": "fedretrain,first-snapshot", "retain-interval": 2}
        )
        [policy] = run_retention(config)
        assert isinstance(policy, Snapshots) and policy.every == 2
    assert "snapshots" not in retention_policies()


def test_forgetting_refuses_a_state_no_registered_policy_can_restore(tmp_path):
    store = UpdateStore(tmp_path / "store")
    with store.begin_round(1, {"w": torch.zeros(2)}):
        pass
    store.set_metadata(**{STATE_KEY: {"1": {"snapshots": {"every": 1, "rounds": {"4": 1}}}}})
    with pytest.raises(StoreCorruptionError, match="snapshots"):
        forget_clients(store, [4], retention_policies())
    assert store.metadata[STATE_KEY]["1"]["snapshots"]["rounds"] == {"4": 1}  # nothing half-done
    with UNLEARNING.registered("first-snapshot", first_snapshot, retention=Snapshots):
        forget_clients(store, [4], retention_policies())
        assert load_policy(store, Snapshots).rounds == {}
        assert policy_state_problems(store.metadata, retention_policies()) == []


def _toy_on_clients():
    """Clients validate the run config in their own processes: they need the name only."""

    def mod(message, context, call_next):
        from fedunlearn.registry import UNLEARNING

        if "first-snapshot" not in UNLEARNING:
            UNLEARNING.register("first-snapshot", "test_adding_a_method:first_snapshot")
        return call_next(message, context)

    return mod


def test_a_toy_method_with_its_own_retention_trains_forgets_and_loses_the_client(
    tmp_path, simulate
):
    overrides = {
        "num-clients": 3,
        "rounds": 3,
        "retain-interval": 2,
        "output-dir": str(tmp_path),
        "run-name": "toy",
        "node-wait-seconds": 60,
        "unlearn-clients": "1",
        "unlearn-methods": "fedretrain,first-snapshot",
        "keep-original": True,
    }
    with UNLEARNING.registered("first-snapshot", first_snapshot, retention=Snapshots):
        simulate(overrides, num_supernodes=3, client_mods=[_toy_on_clients()])
        run = tmp_path / "toy"
        table = pd.read_csv(run / "unlearning.csv").set_index("method")
        assert table.loc["first-snapshot", "did"] == "rolled back to round 1"
        original = UpdateStore(run / "original-1" / "store", readonly=True)
        states = original.metadata[STATE_KEY]
        assert states and all("1" not in saved["snapshots"]["rounds"] for saved in states.values())
        assert all(saved["snapshots"]["rounds"] for saved in states.values())  # the others stay
        assert 1 not in original.clients()
        adopted = UpdateStore(run / "store", readonly=True)
        assert load_policy(adopted, Snapshots).rounds.keys() == {0, 2}  # retrained without 1
        [entry] = [json.loads(line) for line in (run / "unlearning_log.jsonl").open()]
        assert entry["methods"] == ["fedretrain", "first-snapshot"]


def test_the_documented_toy_behaves_as_this_one():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "adding-a-method.md").read_text()
    [block] = [b.split("```", 1)[0] for b in doc.split("```python\n") if "class Snapshots" in b]
    namespace: dict = {}
    exec(compile(block, "adding-a-method.md", "exec"), namespace)
    states = []
    for policy in (namespace["Snapshots"](2), Snapshots(2)):
        for server_round in range(1, 5):
            policy.select(server_round, {}, {0: {}, 3: {}, 5: {}}, {0: 1, 3: 1, 5: 1})
        states.append(type(policy).forget_in_state(policy.state_dict(), [3]))
    assert states[0] == states[1] == {"every": 2, "rounds": {"0": 4, "5": 4}}
