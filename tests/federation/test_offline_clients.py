"""Clients lost during training and offline at an unlearning request, through the real ClientApp
in this process (no Ray): a client that dies mid-round costs that round its reply, the next
rounds go on without it (no hang in Flower's min_available_nodes wait); the request waits
reply-timeout for its offline clients, then FedEraser calibrates and FedRetrain retrains with
the clients there, and a method that needs every client is refused, naming the offline ones. The
forgotten client and the offline ones receive nothing during the request."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from federation_grid import ClientAppGrid, K

from fedunlearn.config import ExperimentConfig
from fedunlearn.messages import CALIBRATE, TRAIN
from server.training.original import train_federated
from server.unlearning.request import LOG_NAME, run_unlearning

pytestmark = pytest.mark.usefixtures("flower_task_identity")

REPLY_TIMEOUT = 3.0
VALUES = {
    "num-clients": K,
    "rounds": 4,
    "local-epochs": 1,
    "retain-interval": 1,
    "min-reply-fraction": 0.5,
    "reply-timeout": REPLY_TIMEOUT,
    "node-wait-seconds": 5,
    "unlearn-clients": "0",
    "unlearn-methods": "federaser,fedretrain,rapid-retraining",
    "unlearn-adopt": "fedretrain",
}


class ChurnGrid(ClientAppGrid):
    """Nodes 100 + partition; ``dies[round] = node``: that node receives its training message of
    that round and never answers, and is offline from then on (``offline``: hidden from
    ``get_node_ids``, never answering). Records each message as (phase, node, type)."""

    def __init__(self, run_config: dict, dies: dict[int, int]):
        super().__init__(run_config)
        self.dies, self.offline, self.phase, self.sent = dict(dies), set(), "training", []

    def get_node_ids(self):
        return [n for n in super().get_node_ids() if n not in self.offline]

    def answer(self, message):
        node = message.metadata.dst_node_id
        self.sent.append((self.phase, node, message.metadata.message_type))
        config = message.content.config_records.get("config")
        server_round = int(config.get("server-round", 0)) if config is not None else 0
        if message.metadata.message_type == TRAIN and self.dies.get(server_round) == node:
            if self.phase == "training":
                self.offline.add(node)  # killed while it trains: no reply, ever
        if node in self.offline:
            return None
        return super().answer(message)


def test_training_goes_on_without_a_lost_client_and_the_request_without_offline_ones(tmp_path):
    values = {**VALUES, "output-dir": str(tmp_path), "run-name": "churn"}
    grid = ChurnGrid(values, dies={3: 103})
    lines: list[str] = []
    outcome = train_federated(grid, ExperimentConfig.from_run_config(values), log=lines.append)

    # Round 3 asked node 103, which died: the round waited reply-timeout, then went on with 3 of
    # 4 (min-reply-fraction 0.5); round 4 did not ask it.
    trained = [(node, kind) for phase, node, kind in grid.sent if kind == TRAIN]
    assert [n for n, _ in trained].count(103) == 3  # rounds 1-3
    metrics = pd.read_csv(outcome.run.path / "metrics.csv").set_index("round")
    assert list(metrics.loc[[1, 2, 3, 4], "clients_replied"]) == [4, 4, 3, 3]
    assert [outcome.store.clients(r) for r in (1, 3, 4)] == [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2]]
    assert any("round 4: client(s) 3 (node(s) 103) offline; going on with the 3 of 4" in line
               for line in lines), lines  # fmt: skip

    # The request: client 2's SuperNode is offline too. It waits reply-timeout for 2 and 3.
    grid.offline.add(102)
    grid.phase = "request"
    started = time.monotonic()
    table = run_unlearning(grid, outcome, [0], log=lines.append)
    assert time.monotonic() - started >= REPLY_TIMEOUT
    assert list(table["method"]) == ["fedavg", "federaser", "fedretrain"]
    asked = {(node, kind) for phase, node, kind in grid.sent if phase == "request"}
    assert asked == {(101, CALIBRATE), (101, TRAIN)}  # only the client there; no target, no offline
    [entry] = [json.loads(line) for line in (outcome.run.path / LOG_NAME).read_text().splitlines()]
    assert entry["offline_clients"] == [2, 3]
    assert list(entry["refused_methods"]) == ["rapid-retraining"]
    assert entry["refused_methods"]["rapid-retraining"].startswith(
        "client(s) 2, 3 (node(s) 102, 103) offline; it needs every remaining client"
    )
    said = "\n".join(lines)
    assert "waiting up to 3s (reply-timeout) for client(s) 2, 3 (node(s) 102, 103)" in said
    assert "going on without them: federaser, fedretrain" in said
    assert "rapid-retraining refused for this request" in said


@pytest.mark.parametrize("key", ["certified-head", "scrub", "mia"])
def test_a_phase_that_needs_every_client_is_refused_on_a_partial_federation(key):
    """Their sums would silently leave the unconnected clients out."""
    from pathlib import Path
    from types import SimpleNamespace

    from fedunlearn.errors import ConfigError
    from server.federation.members import FederationMembers
    from server.training.loading import _check_whole_federation

    flags = {"certified_head": False, "scrub": False, "mia": False}
    config = SimpleNamespace(**{**flags, key.replace("-", "_"): True})
    partial = FederationMembers({0: 100, 2: 102}, {0: 5, 2: 5}, 0, unconnected=frozenset({1, 3}))
    with pytest.raises(ConfigError, match=r"false while client\(s\) 1, 3 are offline") as info:
        _check_whole_federation(config, partial)
    assert info.value.parameter == key
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert f"| `{key}` |" in page  # the key a user sets
    _check_whole_federation(config, FederationMembers({0: 100}, {0: 5}, 0))  # whole: no refusal
    _check_whole_federation(SimpleNamespace(**flags), partial)  # nothing that needs everyone
