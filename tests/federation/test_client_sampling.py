"""Clients sampled per round (``fraction-train = 0.5``), through the real ClientApp in this process
(no Ray): each round trains the seeded draw of partitions, whatever node ids the clients have; the
store records who took part; FedRetrain draws from the remaining clients; FedEraser calibrates each
retained round over that round's remaining participants; the forgotten client receives nothing."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch
from fake_grid import stamp
from federation_grid import ClientAppGrid, K

from fedunlearn.config import ExperimentConfig
from fedunlearn.messages import CALIBRATE
from fedunlearn.progress import parse_progress
from fedunlearn.store.retention import PARTICIPANTS_KEY
from fedunlearn.training.sampling import round_seed, sample_partitions
from server.training.original import train_federated
from server.unlearning.request import run_unlearning

pytestmark = pytest.mark.usefixtures("flower_task_identity")

VALUES = {
    "num-clients": K,
    "rounds": 4,
    "local-epochs": 1,
    "retain-interval": 1,
    "fraction-train": 0.5,
    "min-train-clients": 2,
    "unlearn-clients": "0",
    "unlearn-methods": "federaser,fedaccum,fedretrain",
    "node-wait-seconds": 5,
}


class SampledGrid(ClientAppGrid):
    """The real ClientApp behind node ids ``first + step * partition``; records each message as
    (phase, partition, message type, round)."""

    def __init__(self, run_config: dict, first: int = 100, step: int = 1):
        super().__init__(run_config)
        self.first, self.step, self.phase, self.sent = first, step, "training", []

    def get_node_ids(self):
        return [self.first + self.step * k for k in range(K)]

    def answer(self, message):
        partition = (message.metadata.dst_node_id - self.first) // self.step
        config = message.content.config_records.get("config")
        server_round = int(config.get("server-round", 0)) if config is not None else 0
        self.sent.append((self.phase, partition, message.metadata.message_type, server_round))
        message.metadata.dst_node_id = 100 + partition  # the parent's node numbering
        reply = super().answer(message)
        stamp(reply.metadata, src_node_id=self.first + self.step * partition)
        return reply


def _draw(phase: str, server_round: int, clients) -> list[int]:
    return sample_partitions(clients, 0.5, 2, round_seed(0, phase, server_round))


def _by_round(sent, phase: str) -> dict[int, list[int]]:
    """The partitions each round's training messages of ``phase`` went to (Flower sends a round's
    messages in an order of its own)."""
    rounds: dict[int, list[int]] = {}
    for when, partition, kind, server_round in sent:
        if when == phase and kind == "train":
            rounds.setdefault(server_round, []).append(partition)
    return {r: sorted(p) for r, p in rounds.items()}


#: TensorBoard and MLflow (a SQLite store in the run directory) log what metrics.csv and the
#: comparison hold
TRACKING = {"log-tensorboard": True, "log-mlflow": "run"}


def tracked_as_written(run, table) -> None:
    """The TensorBoard events and the MLflow run of ``run`` hold every round of its metrics.csv
    and every method's row of its comparison ``table``."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics = run.metrics
    events = EventAccumulator(str(run.path / "tensorboard")).Reload()
    for column in ("test_accuracy", "train_loss", "round_seconds", "store_bytes"):
        logged = {e.step: e.value for e in events.Scalars(f"train/{column}")}
        # round 0 (the initial model) has no train loss: a blank is not logged
        written = {r: v for r, v in zip(metrics["round"], metrics[column]) if pd.notna(v)}
        assert logged.keys() == written.keys() and set(range(1, 5)) <= logged.keys()
        assert all(v == pytest.approx(written[r], rel=1e-6) for r, v in logged.items())
    assert [e.step for e in events.Scalars("train/test_accuracy")] == list(range(5))
    for method, accuracy in zip(table["method"], table["test_accuracy"]):
        scalars = events.Scalars(f"unlearning/{method}/test_accuracy")
        assert [(e.step, e.value) for e in scalars] == [(1, pytest.approx(accuracy))]
    kept = json.loads((run.path / "mlflow.json").read_text())
    client = MlflowClient(kept["tracking_uri"])
    history = client.get_metric_history(kept["run_id"], "train/test_accuracy")
    assert sorted((m.step, m.value) for m in history) == list(
        zip(metrics["round"], metrics["test_accuracy"].map(pytest.approx))
    )
    logged = client.get_run(kept["run_id"]).data
    assert logged.params["rounds"] == "4" and logged.params["log-mlflow"] == "run"
    for row in table.to_dict("records"):  # accuracies, time, distance; fedavg has no time
        for column in ("test_accuracy", "target_accuracy", "seconds", "l2_to_fedretrain"):
            name = f"unlearning/{row['method']}/{column}"
            if pd.isna(row[column]):
                assert name not in logged.metrics
            else:
                assert logged.metrics[name] == pytest.approx(row[column])
        assert logged.tags[f"unlearning.{row['method']}.did"] == row["did"]


def _trained(tmp_path, name: str, tracking: dict | None = None, **grid):
    values = {**VALUES, "output-dir": str(tmp_path), "run-name": name, **(tracking or {})}
    spy = SampledGrid(values, **grid)
    outcome = train_federated(spy, ExperimentConfig.from_run_config(values), log=lambda _: None)
    return spy, outcome


def test_each_round_trains_the_seeded_draw_and_the_store_records_it(tmp_path):
    spy, outcome = _trained(tmp_path, "sampled")
    assert _by_round(spy.sent, "training") == {r: _draw("train", r, range(K)) for r in range(1, 5)}
    recorded = outcome.store.metadata[PARTICIPANTS_KEY]
    assert recorded == {str(r): _draw("train", r, range(K)) for r in range(1, 5)}
    assert len({tuple(v) for v in recorded.values()}) > 1  # not the same two every round
    for r in range(1, 5):  # FedEraser's retained rounds hold exactly who took part
        assert outcome.store.clients(r) == recorded[str(r)]
    # other node ids (the SuperNodes' random ids of another run): the same clients, the same model
    _, again = _trained(tmp_path, "renumbered", first=9000, step=37)
    assert again.store.metadata[PARTICIPANTS_KEY] == recorded
    assert all(torch.equal(again.final_state[k], v) for k, v in outcome.final_state.items())


def test_unlearning_draws_from_the_remaining_and_calibrates_over_each_rounds_participants(
    tmp_path,
):
    spy, outcome = _trained(tmp_path, "forget", TRACKING)
    recorded = outcome.store.metadata[PARTICIPANTS_KEY]
    spy.phase, lines = "unlearn", []
    table = run_unlearning(spy, outcome, [0], log=lines.append).set_index("method")
    assert not [s for s in spy.sent if s[0] == "unlearn" and s[1] == 0]  # the target: nothing
    # FedEraser: round 1's remaining updates uncalibrated, then one calibration per retained
    # round, asked of exactly its remaining participants; a round with none is skipped
    steps = [
        (int(m[1]), int(m[2]))
        for line in lines
        if (m := re.match(r"federaser: retained round (\d+), (\d+) client", line))
    ]
    remaining = {r: [p for p in recorded[str(r)] if p != 0] for r in range(1, 5)}
    assert steps == [(r, len(remaining[r])) for r in range(1, 5) if remaining[r]]
    first = next(r for r in range(1, 5) if remaining[r])
    calibrated = sorted(p for phase, p, kind, _ in spy.sent if kind == CALIBRATE)
    assert calibrated == sorted(p for r in range(first + 1, 5) for p in remaining[r])
    # FedRetrain: its own draw, from the three remaining clients, two a round
    assert _by_round(spy.sent, "unlearn") == {
        r: _draw("fedretrain", r, [1, 2, 3]) for r in range(1, 5)
    }
    assert "0.5 of them a round" in table.loc["fedretrain", "did"]
    # a progress line with an ETA for the request's methods and each method's rounds, each
    # task ending at 100%
    ended = {p.task: p for p in map(parse_progress, lines) if p is not None and p.finished}
    assert {t: (p.done, p.eta) for t, p in ended.items()} == {
        "unlearning": (3, 0.0),
        "federaser": (4, 0.0),
        "fedretrain": (4, 0.0),
    }
    tracked_as_written(outcome.run, table.reset_index())
    assert (
        table.loc["federaser", "test_accuracy"] > 0.3
        and table.loc["fedaccum", "client_epochs"] == 0
    )


def test_fedrecover_asks_each_round_only_of_its_remaining_participants(tmp_path):
    """FedRecover with half the clients a round: its history holds each round's participants,
    and each exact update it asks for round t goes to a remaining participant of round t, never
    to the target (a participant that has no L-BFGS pair yet included)."""
    values = {
        **VALUES,
        "output-dir": str(tmp_path),
        "run-name": "fedrecover",
        "unlearn-methods": "fedrecover,fedretrain",
        "fedrecover-warmup": 2,
        "fedrecover-buffer": 1,
        "fedrecover-final-tuning": 1,
    }
    spy = SampledGrid(values)
    outcome = train_federated(spy, ExperimentConfig.from_run_config(values), log=lambda _: None)
    recorded = outcome.store.metadata[PARTICIPANTS_KEY]
    spy.phase, lines = "unlearn", []
    table = run_unlearning(spy, outcome, [0], log=lines.append).set_index("method")
    assert not [s for s in spy.sent if s[0] == "unlearn" and s[1] == 0]  # the target: nothing
    asked = _by_round(spy.sent, "unlearn")
    for r in range(1, 5):  # less FedRetrain's own draw of each round: FedRecover's asks
        for partition in _draw("fedretrain", r, [1, 2, 3]):
            asked[r].remove(partition)
    remaining = {r: [p for p in recorded[str(r)] if p != 0] for r in range(1, 5)}
    assert asked[1] == remaining[1] and asked[2] == remaining[2]  # the warm-up: all of them
    for server_round, partitions in asked.items():
        assert set(partitions) <= set(remaining[server_round])
    assert "fedrecover" in table.index
    assert not str(table.loc["fedrecover", "flag"]).startswith("diverged")


def _unlearned_with(tmp_path, methods: str, **extra):
    """Train with half the clients a round, forget client 0 with ``methods`` and FedRetrain;
    returns (each round's participants, the table, the training messages of the request by round
    less FedRetrain's own draw: the method's)."""
    values = {**VALUES, "output-dir": str(tmp_path), "run-name": methods, **extra}
    values["unlearn-methods"] = f"{methods},fedretrain"
    spy = SampledGrid(values)
    outcome = train_federated(spy, ExperimentConfig.from_run_config(values), log=lambda _: None)
    recorded = outcome.store.metadata[PARTICIPANTS_KEY]
    spy.phase = "unlearn"
    table = run_unlearning(spy, outcome, [0], log=lambda _: None).set_index("method")
    assert not [s for s in spy.sent if s[0] == "unlearn" and s[1] == 0]  # the target: nothing
    asked = _by_round(spy.sent, "unlearn")
    for r in range(1, 5):
        for partition in _draw("fedretrain", r, [1, 2, 3]):
            asked[r].remove(partition)
    return recorded, table, {r: p for r, p in asked.items() if p}


def test_crab_renews_each_kept_round_over_its_kept_remaining_participants(tmp_path):
    recorded, table, asked = _unlearned_with(tmp_path, "crab", **{"crab-client-ratio": 1.0})
    assert asked, "Crab renewed no round"
    for server_round, partitions in asked.items():  # renewal: that round's participants only
        assert set(partitions) <= set(recorded[str(server_round)]) - {0}
    assert "crab" in table.index
    assert str(table.loc["crab", "did"]).startswith("rolled back to round")


def test_sifu_bounds_over_participants_and_retrains_sampling_the_remaining(tmp_path):
    recorded, table, asked = _unlearned_with(
        tmp_path, "sifu", **{"sifu-expansion": "non-expansive", "sifu-sigma": 0.05}
    )
    did = str(table.loc["sifu", "did"])  # "rolled back to round T of 5, ..."
    first = int(re.match(r"rolled back to round (\d+) of", did)[1])
    assert first < 5, did  # the budget sent it back: something is retrained
    # its retraining from the rollback round draws half of the three remaining clients a round
    assert asked == {r: _draw("sifu", r, [1, 2, 3]) for r in range(first, 5)}
