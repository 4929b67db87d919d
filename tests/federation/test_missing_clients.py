"""The one account of who is missing after training (server.federation.missing), the methods it
refuses (server.unlearning.going_on) and the method loop that refuses a method which cannot go on
(server.method_runner), on stand-ins: no federation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from fedunlearn.registry import UNLEARNING
from fedunlearn.unlearning.fedrecover import NotEnoughReplies
from server.federation.availability import OfflineClients
from server.federation.members import FederationMembers
from server.federation.missing import DROPPED, LATER, OFFLINE, REFUSED, MissingClients
from server.method_runner import MethodRunner
from server.unlearning.going_on import going_on_without, refusal_rule

NODES = {p: 100 + p for p in range(4)}


def members(**kwargs) -> FederationMembers:
    return FederationMembers(dict(NODES), dict.fromkeys(NODES, 10), 0, **kwargs)


def screen(refused: dict[int, int]) -> SimpleNamespace:
    return SimpleNamespace(refused=sum(refused.values()), refused_clients=dict(refused))


def refuse(stand_in: SimpleNamespace, partition: int, times: int = 1) -> None:
    stand_in.refused += times
    stand_in.refused_clients[partition] = stand_in.refused_clients.get(partition, 0) + times


def test_each_missing_client_is_named_once_under_its_first_cause():
    run = members(unconnected=frozenset({3}))
    replies = screen({})
    missing = MissingClients(run, replies)
    missing.offline = {1: 101}
    run.dropped[2] = "3 refused replies in a row"
    refuse(replies, 2, 3)  # dropped: named as dropped, not again as refused
    refuse(replies, 0)
    assert missing.causes() == {
        OFFLINE: {1: 101, 3: None},
        DROPPED: {2: 102},
        REFUSED: {0: 100},
    }
    assert missing.missing() == [0, 1, 2, 3]
    assert missing.missing(excluded=[0, 3]) == [1, 2]
    assert missing.describe(missing.causes(excluded=[0, 3])) == (
        f"client(s) 1 (node(s) 101) {OFFLINE}; client(s) 2 (node(s) 102) {DROPPED}"
    )
    assert "1 never connected in this run" in missing.describe(missing.causes())


def test_only_what_happened_after_training_is_the_requests_but_a_training_drop_is_missing():
    run = members()
    run.dropped[1] = "dropped in training"
    replies = screen({0: 2, 1: 3})  # training's refusals
    missing = MissingClients(run, replies)
    assert missing.refused_replies() == 0 and missing.refused_clients() == {}
    assert missing.dropped_since() == {}
    assert missing.causes() == {DROPPED: {1: 101}}  # still missing: every later phase misses it
    refuse(replies, 0)
    run.dropped[3] = "dropped in the request"
    assert missing.refused_replies() == 1 and missing.refused_clients() == {0: 1}
    assert missing.dropped_since() == {3: "dropped in the request"}


def test_a_method_that_needs_every_remaining_client_is_refused_for_an_offline_or_dropped_one():
    run, replies = members(), screen({})
    missing = MissingClients(run, replies)
    fedrecover, federaser = UNLEARNING["fedrecover"], UNLEARNING["federaser"]
    fedaccum = UNLEARNING["fedaccum"]
    refuse(replies, 2)  # refused once, still a member: still asked, no refusal
    assert missing.refuses_method(fedrecover, excluded=[0]) is None
    run.dropped[0] = "the target, dropped in training"
    assert missing.refuses_method(fedrecover, excluded=[0]) is None  # not a remaining client
    run.dropped[3] = "dropped by FedEraser's calibration"
    why = missing.refuses_method(fedrecover, excluded=[0])
    assert why.startswith(f"client(s) 3 (node(s) 103) {DROPPED}; it needs every remaining client")
    assert missing.refuses_method(federaser, [0]) is None  # goes on with the clients there
    assert missing.refuses_method(fedaccum, [0]) is None  # asks no client


def test_a_client_dropped_in_training_refuses_the_methods_that_need_everyone_at_the_request():
    run = members()
    run.dropped[2] = "dropped in training"
    lines: list[str] = []
    specs, refused = going_on_without(
        ["federaser", "fedrecover", "fedretrain"], MissingClients(run), [0], lines.append
    )
    assert [s.name for s in specs] == ["federaser", "fedretrain"]
    assert refused["fedrecover"].startswith(f"client(s) 2 (node(s) 102) {DROPPED}")
    assert f"client(s) 2 (node(s) 102) {DROPPED}; going on without them: federaser, fedretrain" in (
        lines
    )
    assert going_on_without(["fedrecover"], MissingClients(members()), [0], print)[1] == {}


def test_the_rule_before_each_method_sees_drops_of_earlier_methods_and_a_refused_budget():
    run = members()
    missing = MissingClients(run)
    outcome = SimpleNamespace(members=run)
    context = SimpleNamespace(outcome=outcome, excluded=[0], remaining_nodes=[101, 102, 103])
    config = SimpleNamespace(keep_training_budget="fedrecover", keep_training_rounds=0)
    refused: dict[str, str] = {}
    rule = refusal_rule(config, missing, context, refused)
    assert rule(UNLEARNING["fedrecover"]) is None
    run.dropped[3] = "dropped by an earlier method"
    assert "client(s) 3 (node(s) 103)" in rule(UNLEARNING["fedrecover"])
    assert context.remaining_nodes == [101, 102]  # FedRetrain trains those left
    refused["fedrecover"] = "it could not go on"
    assert rule(UNLEARNING["keep-training"]).startswith("its budget is fedrecover's")


def test_a_phase_that_needs_every_client_is_refused_by_name_and_recorded():
    run, replies = members(), screen({})
    missing = MissingClients(run, replies)
    lines: list[str] = []
    assert missing.allows("certified-head", lines.append) and not lines
    refuse(replies, 1)
    assert not missing.allows("scrub", lines.append)
    assert lines == [
        f"scrub refused for this run: client(s) 1 (node(s) 101) {REFUSED}; it needs every "
        "client's answer, and would silently leave them out"
    ]
    assert list(missing.account()["refused_phases"]) == ["scrub"]


class _Run:
    def __init__(self, path):
        self.path = path

    def write_json(self, name, obj):
        (self.path / name).write_text(json.dumps(obj))


def test_summary_counts_the_requests_beside_training_once_each(tmp_path):
    (tmp_path / "summary.json").write_text(
        json.dumps({"refused_replies": 4, "dropped_clients": {"1": "in training"}})
    )
    run, replies = members(), screen({})
    missing = MissingClients(run, replies)
    missing.key = "request 1"
    missing.write_summary(_Run(tmp_path))  # nothing to say: left as it was
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "refused_replies": 4,
        "dropped_clients": {"1": "in training"},
    }
    refuse(replies, 2, 3)
    run.dropped[2] = "in the request"
    for _ in range(2):  # a phase served again writes its account again, not twice
        missing.write_summary(_Run(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["refused_replies"] == 7
    assert summary["dropped_clients"] == {"1": "in training", "2": "in the request"}
    assert summary["training_account"]["refused_replies"] == 4
    assert summary[LATER]["request 1"]["refused_clients"] == {"2": 3}


class _Saving:
    def save_model(self, name, state):
        pass


def _spec(name: str, implementation):
    return SimpleNamespace(name=name, resolve=lambda: implementation, model_file=None, needs=())


@pytest.mark.parametrize(
    "stopped",
    [
        NotEnoughReplies("FedRecover round 1: 1 of 3 clients sent a usable exact update"),
        OfflineClients("fedretrain round 2: 1 of its 3 clients connected", {2: 102}),
    ],
)
def test_a_method_that_cannot_go_on_is_refused_and_the_others_run(stopped):
    def cannot(context, name):
        raise stopped

    def fine(context, name):
        return {"w": torch.zeros(1)}

    lines: list[str] = []
    runner = MethodRunner(_Saving(), log=lines.append)
    context = SimpleNamespace()
    specs = [_spec("first", cannot), _spec("second", fine)]
    runner.run_all(specs, context, refusal=lambda spec: None)
    assert list(runner.models) == ["second"]
    assert runner.refused == {"first": f"it could not go on with the replies it got: {stopped}"}
    assert f"first refused: it could not go on with the replies it got: {stopped}" in lines
    with pytest.raises(type(stopped)):  # without a refusal rule (scrubbing, the judge): it ends
        MethodRunner(_Saving(), log=print).run_all(specs, context)


def test_a_method_the_rule_refuses_is_never_called():
    called = []
    runner = MethodRunner(_Saving(), log=print)
    spec = _spec("refused", lambda context, name: called.append(name))
    runner.run_all([spec], SimpleNamespace(), refusal=lambda spec: "client 2 dropped")
    assert called == [] and runner.refused == {"refused": "client 2 dropped"}
    assert not runner.models
