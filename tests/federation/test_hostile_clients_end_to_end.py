"""End to end (in-process simulation, digits): four hostile clients, one refusal each.

One node replies NaN weights, one a wrong shape, one claims 1e12 examples, one spoofs another
partition id. The run finishes with a finite model equal, bit for bit, to a run in which those nodes
simply failed in those rounds; the store holds no non-finite tensor; ``metrics.csv`` counts the
refusals and the log names each node.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from fake_grid import shorten
from flwr.app import ArrayRecord, MetricRecord
from safetensors.torch import load_file

from fedunlearn.store.update_store import UpdateStore

#: partition -> (round it misbehaves in, what it does)
HOSTILE = {0: (2, "nan"), 1: (2, "wrong-shape"), 2: (3, "huge-examples"), 3: (3, "spoof")}


def tamper(reply, kind: str, partition: int) -> None:
    content = reply.content
    if kind in ("nan", "wrong-shape"):
        state = content["arrays"].to_torch_state_dict()
        name = next(iter(state))
        if kind == "nan":
            state[name].view(-1)[0] = float("nan")
        else:
            state[name] = torch.zeros(3, 1)
        content["arrays"] = ArrayRecord(state)
    else:
        metrics = dict(content["metrics"])
        if kind == "huge-examples":
            metrics["num-examples"] = 10**12
        else:
            metrics["partition-id"] = (partition + 1) % 6
        content["metrics"] = MetricRecord(metrics)


def misbehave(how: str):
    """A Flower mod: in its round, a hostile partition tampers with its training reply
    (``how="tamper"``) or fails instead (``how="fail"``: the reference run)."""

    def mod(msg, context, call_next):
        partition = int(context.node_config["partition-id"])
        if msg.metadata.message_type != "train" or partition not in HOSTILE:
            return call_next(msg, context)
        when, kind = HOSTILE[partition]
        if int(msg.content["config"]["server-round"]) != when:
            return call_next(msg, context)
        if how == "fail":
            raise RuntimeError("this node fails in this round")
        reply = call_next(msg, context)
        tamper(reply, kind, partition)
        return reply

    return mod


def overrides(tmp_path, name: str) -> dict:
    return {
        "num-clients": 6,
        "rounds": 4,
        "local-epochs": 1,
        "retain-interval": 1,
        "output-dir": str(tmp_path),
        "run-name": name,
        "node-wait-seconds": 60,
        "unlearn-clients": "",
    }


def test_hostile_replies_are_refused_and_the_run_equals_one_without_them(tmp_path, simulate, capfd):
    simulate(overrides(tmp_path, "hostile"), num_supernodes=6, client_mods=[misbehave("tamper")])
    console = capfd.readouterr().out
    simulate(overrides(tmp_path, "reference"), num_supernodes=6, client_mods=[misbehave("fail")])

    hostile, reference = tmp_path / "hostile", tmp_path / "reference"
    final = load_file(str(hostile / "model_final.safetensors"))
    expected = load_file(str(reference / "model_final.safetensors"))
    assert all(torch.isfinite(v).all() for v in final.values())
    assert all(torch.equal(final[k], expected[k]) for k in expected)

    metrics = pd.read_csv(hostile / "metrics.csv").set_index("round")
    assert list(metrics.loc[[1, 2, 3, 4], "refused"]) == [0, 2, 2, 0]
    assert list(metrics.loc[[1, 2, 3, 4], "clients_replied"]) == [6, 4, 4, 6]
    assert (metrics["check_seconds"] >= 0).all()

    refusals = [json.loads(line) for line in (hostile / "refused_replies.jsonl").open()]
    assert sorted((r["client"], r["round"]) for r in refusals) == sorted(
        (p, when) for p, (when, _) in HOSTILE.items()
    )
    for record in refusals:
        assert f"node {record['node']} (client {record['client']})" in console
    reasons = " ".join(r["reason"] for r in refusals)
    assert "non-finite" in reasons and "shape" in reasons
    assert "num-examples = 1000000000000" in reasons and "partition-id" in reasons

    store = UpdateStore(hostile / "store", readonly=True)
    for server_round in store.rounds():
        retained = store.read_round(server_round)
        tensors = [retained.global_model, *retained.updates.values()]
        assert all(torch.isfinite(t).all() for state in tensors for t in state.values())
    assert store.clients(2) == [2, 3, 4, 5] and store.clients(3) == [0, 1, 4, 5]
    summary = json.loads((hostile / "summary.json").read_text())
    assert summary["refused_replies"] == 4 and summary["dropped_clients"] == {}


def nan_after_training(run_dir, partition: int):
    """A Flower mod: once training finished (``summary.json`` written), ``partition`` answers
    every training request (FedRecover's exact rounds, FedRetrain's) with a NaN weight."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        mine = int(context.node_config["partition-id"]) == partition
        if mine and msg.metadata.message_type == "train" and (run_dir / "summary.json").exists():
            tamper(reply, "nan", partition)
        return reply

    return mod


def test_a_nan_reply_during_fedrecovers_exact_rounds_is_refused_and_the_recovery_goes_on(
    tmp_path, simulate, capfd
):
    values = {
        "num-clients": 4,
        "rounds": 6,
        "local-epochs": 1,
        "output-dir": str(tmp_path),
        "run-name": "nan-recovery",
        "unlearn-clients": "0",
        "unlearn-methods": "fedrecover,fedretrain",
        "fedrecover-warmup": 3,
        "fedrecover-correction-period": 2,
        "fedrecover-final-tuning": 1,
        "node-wait-seconds": 60,
    }
    run_dir = tmp_path / "nan-recovery"
    simulate(values, num_supernodes=4, client_mods=[nan_after_training(run_dir, 1)])
    out = capfd.readouterr().out
    assert "fedrecover: round 1, no usable exact update from client(s) 1 (node " in out
    table = pd.read_csv(run_dir / "unlearning.csv").set_index("method")
    assert table.loc["fedrecover", "test_accuracy"] > 0.5  # went on, with clients 2 and 3
    (request,) = [json.loads(line) for line in (run_dir / "unlearning_log.jsonl").open()]
    missing = request["details"]["fedrecover"]["missing_exact_updates"]
    assert missing and all(clients == [1] for clients in missing.values())
    refused = [json.loads(line) for line in (run_dir / "refused_replies.jsonl").open()]
    assert any(
        r.get("client") == 1 and r.get("phase") == "fedrecover" and "non-finite" in r["reason"]
        for r in refused
        if "reason" in r
    )


def undecodable(message_type: str, partition: int):
    """A Flower mod: ``partition`` answers ``message_type`` with a stats array that declares its
    shape and dtype truthfully but is 8 bytes short (it does not decode)."""

    def mod(msg, context, call_next):
        reply = call_next(msg, context)
        mine = int(context.node_config["partition-id"]) == partition
        if mine and msg.metadata.message_type == message_type and not reply.has_error():
            shorten(reply.content)
        return reply

    return mod


@pytest.mark.parametrize(
    ("message_type", "methods"),
    [("query.scrub_stats", "newton"), ("query.prune_stats", "class-pruning")],
)
def test_an_undecodable_array_during_scrubbing_or_pruning_stops_the_run_with_one_line(
    tmp_path, simulate, capfd, message_type, methods
):
    from fedunlearn.errors import FedUnlearnError

    values = {
        **overrides(tmp_path, "undecodable"),
        "num-clients": 3,
        "rounds": 2,
        "scrub": True,
        "scrub-forget": "class:3",
        "scrub-methods": methods,
    }
    with pytest.raises(FedUnlearnError, match="does not decode") as refused:
        simulate(values, num_supernodes=3, client_mods=[undecodable(message_type, 1)])
    out = capfd.readouterr().out
    (line,) = [line for line in out.splitlines() if "[fedunlearn] error:" in line]
    assert "node " in line and "does not decode" in line and "Traceback" not in out
    assert str(refused.value) in line
