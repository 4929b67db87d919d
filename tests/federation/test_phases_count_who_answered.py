"""Phases count who answered, end to end (digits, the real ServerApp and ClientApp in this
process): an ``unlearn-only`` request in which two of four clients turn hostile.

Clients 2 and 3 answer every FedEraser calibration with a NaN weight: refused three rounds in a
row, they are dropped. FedRecover, which needs every remaining client, is then refused for the
request, naming them, and FedEraser's row is kept; the certified head, scrubbing and the
membership audit, which need every client's answer, are refused naming them, instead of training
on the two clients left; the request's log record and ``summary.json`` count the refusals and
drops. When FedRecover runs first and cannot go on (two of its three clients refused), it alone
is refused, and the request goes on.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from flwr.app import ArrayRecord, MetricRecord

from fedunlearn.messages import CALIBRATE, TRAIN

HOSTILE = (2, 3)
TRAINED = {
    "num-clients": 4,
    "rounds": 5,
    "local-epochs": 1,
    "retain-interval": 1,
    "unlearn-clients": "",
    "unlearn-methods": "federaser,fedrecover",
    "fedrecover-warmup": 3,
    "fedrecover-correction-period": 2,
    "fedrecover-final-tuning": 1,
    "node-wait-seconds": 60,
}


def hostile(message_types: str, seen: list, clients=HOSTILE, how: str = "nan"):
    """A Flower mod: ``clients`` answer the ``message_types`` (comma-separated) with a NaN weight
    (``how="nan"``) or a claim of 10**12 examples (``"lie"``); every message a client receives is
    recorded in ``seen`` as (partition, message type)."""

    def mod(msg, context, call_next):
        partition, kind = int(context.node_config["partition-id"]), msg.metadata.message_type
        seen.append((partition, kind))
        reply = call_next(msg, context)
        if partition not in clients or kind not in message_types.split(",") or reply.has_error():
            return reply
        if how == "nan":
            state = reply.content["arrays"].to_torch_state_dict()
            next(iter(state.values())).view(-1)[0] = float("nan")
            reply.content["arrays"] = ArrayRecord(state)
        else:
            reply.content["metrics"] = MetricRecord(
                {**dict(reply.content["metrics"]), "num-examples": 10**12}
            )
        return reply

    return mod


def train_then_request(tmp_path, simulate, methods: str, mod, **later) -> None:
    """Train the run, then serve an unlearn-only request forgetting client 0."""
    common = {**TRAINED, "output-dir": str(tmp_path), "run-name": "run"}
    simulate(common, num_supernodes=4)
    request = {**common, "unlearn-only": True, "unlearn-clients": "0"}
    request |= {"unlearn-methods": methods, "unlearn-adopt": "federaser", **later}
    simulate(request, num_supernodes=4, client_mods=[mod])


def request_log(run_dir) -> dict:
    (entry,) = [json.loads(line) for line in (run_dir / "unlearning_log.jsonl").open()]
    return entry


def test_clients_dropped_in_calibration_refuse_fedrecover_and_the_phases_that_need_everyone(
    tmp_path, simulate, capfd
):
    seen: list = []
    phases = {"certified-head": True, "certified-remove-clients": "0", "mia": True}
    phases |= {"scrub": True, "scrub-forget": "client:0"}
    mod = hostile(CALIBRATE, seen)
    train_then_request(tmp_path, simulate, "federaser,fedrecover,fedretrain", mod, **phases)
    out = capfd.readouterr().out
    run_dir = tmp_path / "run"
    who = "client(s) 2, 3 (node(s) 102, 103) dropped from the run"

    # Dropped in FedEraser's calibration of retained rounds 2, 3 and 4; FedEraser went on with
    # client 1 (round 5), FedRecover was refused naming them, FedRetrain trained client 1 (it
    # goes on with the clients there), and neither node was asked anything after.
    table = pd.read_csv(run_dir / "unlearning.csv")
    assert table["method"].tolist() == ["fedavg", "federaser", "fedretrain"]
    entry = request_log(run_dir)
    assert list(entry["refused_methods"]) == ["fedrecover"]
    assert entry["refused_methods"]["fedrecover"].startswith(who)
    assert "it needs every remaining client" in entry["refused_methods"]["fedrecover"]
    assert entry["refused_replies"] == 6
    assert entry["refused_clients"] == {"2": 3, "3": 3}
    assert sorted(entry["dropped_clients"]) == ["2", "3"]
    assert "max-refusals=3" in entry["dropped_clients"]["2"]
    assert entry["missing_clients"] == [2, 3]
    assert entry["details"]["fedretrain"]["clients"] == 1  # it says whom it trained
    asked = [t for p, t in seen if p in HOSTILE and not t.startswith("query.")]
    assert asked == [CALIBRATE] * 6  # three rounds each
    assert "fedrecover refused: " + who in out

    # The later phases that need every client: refused by name, nothing written.
    for phase in ("certified-head", "scrub", "mia"):
        assert f"{phase} refused for this run: {who}" in out, out
    assert not (run_dir / "certified_removal.jsonl").exists()
    assert not (run_dir / "certified_summary.json").exists()
    assert not (run_dir / "scrubbing.csv").exists() and not (run_dir / "mia.csv").exists()
    assert all(t != "query.certified_head" for _, t in seen)

    # summary.json counts them beside training's (none), by request.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["refused_replies"] == 6
    assert sorted(summary["dropped_clients"]) == ["2", "3"]
    assert summary["training_account"] == {"refused_replies": 0, "dropped_clients": {}}
    account = summary["after_training"]["request 1"]
    assert sorted(account["refused_phases"]) == ["certified-head", "mia", "scrub"]
    assert list(account["refused_methods"]) == ["fedrecover"]


def test_fedrecover_that_cannot_go_on_is_refused_and_the_request_goes_on(tmp_path, simulate, capfd):
    """Two of FedRecover's three clients answer its exact rounds with NaN: too few usable
    replies (NotEnoughReplies). FedRecover alone is refused, FedEraser runs; the two clients,
    refused once each and not dropped, still refuse the certified head."""
    seen: list = []
    train_then_request(
        tmp_path, simulate, "fedrecover,federaser", hostile(TRAIN, seen), **{"certified-head": True}
    )
    out = capfd.readouterr().out
    run_dir = tmp_path / "run"
    table = pd.read_csv(run_dir / "unlearning.csv")
    assert table["method"].tolist() == ["fedavg", "federaser"]
    entry = request_log(run_dir)
    why = entry["refused_methods"]["fedrecover"]
    assert why.startswith("it could not go on with the replies it got: FedRecover round 1: ")
    assert "min-reply-fraction" in why
    assert entry["dropped_clients"] == {} and entry["refused_clients"] == {"2": 1, "3": 1}
    assert entry["adopted"] == "federaser"
    assert (
        "certified-head refused for this run: client(s) 2, 3 (node(s) 102, 103) sent replies "
        "that were refused" in out
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["refused_replies"] == 2 and summary["dropped_clients"] == {}


def test_one_client_dropped_during_fedretrains_rounds_refuses_what_comes_after(
    tmp_path, simulate, capfd
):
    """A drop in another phase than calibration, by one hostile client: FedRetrain goes on with
    the two others, FedRecover after it is refused, and so is the certified head."""
    seen: list = []
    later = {"unlearn-adopt": "fedretrain", "certified-head": True}
    mod = hostile(TRAIN, seen, clients=(3,))
    train_then_request(tmp_path, simulate, "fedretrain,fedrecover", mod, **later)
    out = capfd.readouterr().out
    run_dir = tmp_path / "run"
    entry = request_log(run_dir)
    assert pd.read_csv(run_dir / "unlearning.csv")["method"].tolist() == ["fedavg", "fedretrain"]
    assert "the last in fedretrain round 3" in entry["dropped_clients"]["3"]
    assert entry["refused_methods"]["fedrecover"].startswith(
        "client(s) 3 (node(s) 103) dropped from the run"
    )
    assert "certified-head refused for this run: client(s) 3 (node(s) 103) dropped" in out
    assert [t for p, t in seen if p == 3 and t == TRAIN] == [TRAIN] * 3


def test_when_every_remaining_client_is_hostile_every_method_is_refused_and_so_is_adoption(
    tmp_path, simulate, capfd
):
    """Clients 1, 2 and 3 claim 10**12 examples in every training and calibration reply: FedEraser's
    calibration gets no answer and FedRetrain's rounds too few; each is refused with why, and the
    request, with nothing to adopt, is refused naming them, not ended by the first."""
    from fedunlearn.unlearning.verdicts import AdoptionRefused

    mod = hostile(f"{TRAIN},{CALIBRATE}", [], clients=(1, 2, 3), how="lie")
    with pytest.raises(AdoptionRefused, match="federaser has no model in this request"):
        train_then_request(tmp_path, simulate, "federaser,fedretrain", mod)
    out = capfd.readouterr().out
    assert (
        "federaser refused: it could not go on with the replies it got: no client answered the "
        "calibration of round 2" in out
    )
    assert (
        "fedretrain refused: it could not go on with the replies it got: fedretrain round 1: "
        in (out)
    )


def test_a_client_dropped_in_training_is_missing_at_the_request_and_after(
    tmp_path, simulate, capfd
):
    """Client 3 is hostile from the first round: dropped in training (max-refusals 2). The
    request, in the same run, refuses FedRecover and the certified head, naming it."""
    values = {**TRAINED, "output-dir": str(tmp_path), "run-name": "run", "max-refusals": 2}
    values |= {"unlearn-clients": "0", "unlearn-methods": "federaser,fedrecover"}
    values |= {"unlearn-adopt": "federaser", "certified-head": True}
    simulate(values, num_supernodes=4, client_mods=[hostile(TRAIN, [], clients=(3,))])
    out = capfd.readouterr().out
    run_dir = tmp_path / "run"
    entry = request_log(run_dir)
    who = "client(s) 3 (node(s) 103) dropped from the run"
    assert entry["refused_methods"]["fedrecover"].startswith(who)
    assert entry["dropped_clients"] == {} and entry["missing_clients"] == [3]  # training's drop
    assert f"certified-head refused for this run: {who}" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["dropped_clients"]) == ["3"] and summary["refused_replies"] == 2
    assert summary["after_training"]["request 1"]["refused_phases"].keys() == {"certified-head"}


def test_a_client_dropped_in_scrubbings_reference_retraining_refuses_the_scrubs_after_it(
    tmp_path, simulate, capfd
):
    """Scrubbing itself counts who answered: client 3 answers the reference retraining's rounds
    with NaN once training is over, and is dropped; the Newton scrub, whose sums would leave it
    out, is refused by name, and summary.json counts it (a run with no request)."""
    run_dir = tmp_path / "run"

    def after_training(msg, context, call_next):
        if (run_dir / "summary.json").exists():
            return hostile(TRAIN, [], clients=(3,))(msg, context, call_next)
        return call_next(msg, context)

    values = {**TRAINED, "output-dir": str(tmp_path), "run-name": "run"}
    values |= {"scrub": True, "scrub-forget": "class:3", "scrub-methods": "newton"}
    simulate(values, num_supernodes=4, client_mods=[after_training])
    out = capfd.readouterr().out
    who = "client(s) 3 (node(s) 103) dropped from the run"
    assert f"scrub newton refused: {who}" in out
    (scrubbed,) = [json.loads(line) for line in (run_dir / "scrubbing.jsonl").open()]
    assert list(scrubbed["refused_methods"]) == ["newton"]
    assert "newton" not in pd.read_csv(run_dir / "scrubbing.csv")["method"].tolist()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["dropped_clients"]) == ["3"] and summary["refused_replies"] == 3
    assert summary["after_training"]["no request"]["refused_clients"] == {"3": 3}
