"""A hostile reply is refused: never aggregated, never retained, named, counted; a node refused
``max-refusals`` rounds in a row is dropped from the run."""

from __future__ import annotations

import math
from unittest.mock import Mock

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.config import ExperimentConfig
from fedunlearn.reply_checks import (
    RefusedReply,
    check_evaluate_reply,
    check_training_reply,
)
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.federaser import IntervalRetention
from server.federation.members import FederationMembers
from server.federation.reply_screening import ReplyScreen
from strategies.retaining import RetainingFedAvg

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODES = {0: 101, 1: 102, 2: 103}
SIZES = {0: 40, 1: 50, 2: 60}
MODEL = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}


def members() -> FederationMembers:
    return FederationMembers(dict(NODES), dict(SIZES), 0)


def honest_content(partition: int, step: float = 0.1) -> dict:
    return {
        "arrays": {k: v + step * (partition + 1) for k, v in MODEL.items()},
        "metrics": {
            "num-examples": SIZES[partition],
            "partition-id": partition,
            "train-loss": 0.5,
            "calibration": 0,
        },
    }


def reply(node: int, content: dict, *, error: bool = False) -> Message:
    message = Mock(spec=Message)
    message.has_error.return_value = error
    message.metadata.src_node_id = node
    records = {}
    if "arrays" in content:
        arrays = content["arrays"]
        records["arrays"] = (
            arrays
            if isinstance(arrays, ArrayRecord)
            else ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
        )
    if "metrics" in content:
        records["metrics"] = MetricRecord(content["metrics"])
    records.update(content.get("other", {}))
    message.content = RecordDict(records)
    return message


def hostile(kind: str, partition: int = 1) -> dict:
    content = honest_content(partition)
    arrays, metrics = content["arrays"], content["metrics"]
    if kind == "nan":
        arrays["w"][0, 0] = float("nan")
    elif kind == "inf":
        arrays["b"][1] = float("-inf")
    elif kind == "broadcastable":
        arrays["b"] = torch.zeros(1, 3)
    elif kind == "scalar":
        arrays["b"] = torch.tensor(0.5)
    elif kind == "wrong-shape":
        arrays["w"] = torch.zeros(3, 2)
    elif kind == "float64":
        arrays["w"] = arrays["w"].double()
    elif kind == "missing-array":
        del arrays["b"]
    elif kind == "extra-array":
        arrays["c"] = torch.zeros(1)
    elif kind == "missing-key":
        del metrics["num-examples"]
    elif kind == "extra-metric":
        metrics["evil"] = 1.0
    elif kind == "zero-examples":
        metrics["num-examples"] = 0
    elif kind == "negative-examples":
        metrics["num-examples"] = -5
    elif kind == "nan-examples":
        metrics["num-examples"] = float("nan")
    elif kind == "float-examples":
        metrics["num-examples"] = 12.0
    elif kind == "huge-examples":
        metrics["num-examples"] = 10**12
    elif kind == "above-declared":
        metrics["num-examples"] = SIZES[partition] + 1
    elif kind == "spoofed-partition":
        metrics["partition-id"] = 2
    elif kind == "nan-loss":
        metrics["train-loss"] = float("nan")
    elif kind == "list-metric":
        metrics["train-loss"] = [1.0, 2.0]
    elif kind == "no-arrays":
        del content["arrays"]
    elif kind == "extra-record":
        content["other"] = {"config": ConfigRecord({"x": 1})}
    else:
        raise AssertionError(kind)
    return content


HOSTILE = [
    "nan", "inf", "broadcastable", "scalar", "wrong-shape", "float64", "missing-array",
    "extra-array", "missing-key", "extra-metric", "zero-examples", "negative-examples",
    "nan-examples", "float-examples", "huge-examples", "above-declared", "spoofed-partition",
    "nan-loss", "list-metric", "no-arrays", "extra-record",
]  # fmt: skip


@pytest.mark.parametrize("kind", HOSTILE)
def test_every_hostile_training_reply_is_refused_with_its_node_named(kind, tmp_path):
    lines: list[str] = []
    screen = ReplyScreen(members(), max_refusals=3, log=lines.append)
    sent = ArrayRecord(MODEL)
    replies = [
        reply(101, honest_content(0)),
        reply(102, hostile(kind)),
        reply(103, honest_content(2)),
    ]
    kept = screen.training("train", 4, sent, replies)
    assert [r.metadata.src_node_id for r in kept] == [101, 103]
    assert screen.refused == 1
    assert len(lines) == 1 and "node 102 (client 1)" in lines[0] and "round 4" in lines[0]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_refused_reply_is_neither_aggregated_nor_retained(kind, tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = RetainingFedAvg(store, [IntervalRetention(1)])
    screen = ReplyScreen(members(), max_refusals=3, log=lambda _: None)
    sent = ArrayRecord(MODEL)
    strategy._sent_arrays = {1: sent}
    honest = [reply(101, honest_content(0)), reply(103, honest_content(2))]
    kept = screen.training("train", 1, sent, [honest[0], reply(102, hostile(kind)), honest[1]])
    arrays, _ = strategy.aggregate_train(1, kept)
    expected = {k: (v + 0.1 * 40 / 100 + 0.3 * 60 / 100) for k, v in MODEL.items()}
    got = arrays.to_torch_state_dict()
    assert all(torch.allclose(got[k], expected[k]) for k in MODEL)
    assert store.clients(1) == [0, 2]
    for client in (0, 2):
        assert all(torch.isfinite(v).all() for v in store.read_update(1, client).values())


def test_error_replies_pass_as_failures_not_refusals():
    screen = ReplyScreen(members(), max_refusals=1, log=lambda _: None)
    kept = screen.training("train", 1, ArrayRecord(MODEL), [reply(102, {}, error=True)])
    assert kept == [] and screen.refused == 0 and not screen.members.dropped


def test_a_stranger_and_a_dropped_node_are_refused():
    fed = members()
    screen = ReplyScreen(fed, max_refusals=3, log=lambda _: None)
    assert screen.training("train", 1, ArrayRecord(MODEL), [reply(999, honest_content(0))]) == []
    fed.dropped[1] = "test"
    assert screen.training("train", 1, ArrayRecord(MODEL), [reply(102, honest_content(1))]) == []
    assert screen.refused == 2


def test_a_node_refused_max_refusals_rounds_in_a_row_is_dropped_and_gets_no_message():
    lines: list[str] = []
    fed = members()
    screen = ReplyScreen(fed, max_refusals=2, log=lines.append)
    sent = ArrayRecord(MODEL)
    screen.training("train", 1, sent, [reply(102, hostile("nan"))])
    screen.training("train", 2, sent, [reply(102, honest_content(1))])  # a good round resets
    screen.training("train", 3, sent, [reply(102, hostile("nan"))])
    assert not fed.dropped
    screen.training("calibrate", 4, sent, [reply(102, hostile("spoofed-partition"))])
    assert list(fed.dropped) == [1] and "max-refusals=2" in fed.dropped[1]
    assert any("dropped node 102 (client 1)" in line for line in lines)
    assert fed.partition_ids == [0, 2] and fed.nodes() == [101, 103]
    outgoing = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in NODES.values()]
    assert [m.metadata.dst_node_id for m in screen.active(outgoing)] == [101, 103]


def test_refusals_are_logged_in_the_run_directory(tmp_path):
    from fedunlearn.store.run_directory import RunDirectory

    run = RunDirectory.create(tmp_path / "run", {})
    screen = ReplyScreen(members(), max_refusals=1, log=lambda _: None, run=run)
    screen.training("train", 7, ArrayRecord(MODEL), [reply(102, hostile("huge-examples"))])
    [refusal, drop] = run.read_log("refused_replies.jsonl")
    assert refusal["node"] == 102 and refusal["client"] == 1 and refusal["round"] == 7
    assert "num-examples" in refusal["reason"] and "dropped" in drop


@pytest.mark.parametrize(
    "metrics, fragment",
    [
        ({"eval-accuracy": 1.5}, "eval-accuracy"),
        ({"eval-loss": float("nan")}, "not finite"),
        ({"eval-loss": -1.0}, "negative"),
        ({"num-examples": 10**9}, "num-examples"),
        ({"partition-id": 0}, "partition-id"),
    ],
)
def test_hostile_evaluation_metrics_are_refused(metrics, fragment):
    good = {"num-examples": 50, "partition-id": 1, "eval-loss": 0.3, "eval-accuracy": 0.9}
    check_evaluate_reply(good, partition=1, declared_examples=50)
    with pytest.raises(RefusedReply, match=fragment):
        check_evaluate_reply({**good, **metrics}, partition=1, declared_examples=50)


@pytest.mark.parametrize(
    "start_loss, fragment",
    [(-0.5, "start-loss = -0.5 is negative"), (float("inf"), "not finite"), ("x", "not a number")],
)
def test_the_optional_start_loss_is_accepted_only_as_a_finite_number_at_least_zero(
    start_loss, fragment
):
    spec = {"w": ((2,), "float32")}
    good = {"num-examples": 5, "partition-id": 0, "train-loss": 0.1, "calibration": 0}
    for metrics in (good, {**good, "start-loss": 2.3}):  # asked for by Crab's windows, or not
        check_training_reply(spec, spec, metrics, partition=0, declared_examples=5)
    with pytest.raises(RefusedReply, match=fragment):
        check_training_reply(
            spec, spec, {**good, "start-loss": start_loss}, partition=0, declared_examples=5
        )
    with pytest.raises(RefusedReply, match="unexpected 'end-loss'"):
        check_training_reply(
            spec, spec, {**good, "end-loss": 1.0}, partition=0, declared_examples=5
        )


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=3),
        st.none(),
        st.lists(st.integers(), max_size=2),
    )
)
def test_num_examples_is_accepted_only_as_an_integer_in_1_to_declared(value):
    spec = {"w": ((2,), "float32")}
    metrics = {"num-examples": value, "partition-id": 0, "train-loss": 0.1, "calibration": 0}
    accepted = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= SIZES[0]
    try:
        check_training_reply(spec, spec, metrics, partition=0, declared_examples=SIZES[0])
    except RefusedReply:
        assert not accepted
    else:
        assert accepted


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=8
    )
)
def test_arrays_are_accepted_only_when_every_value_is_finite(values):
    array = np.asarray(values, dtype=np.float32)
    spec = {"w": ((len(values),), "float32")}
    metrics = {"num-examples": 1, "partition-id": 0, "train-loss": 0.1, "calibration": 1}
    finite = all(math.isfinite(v) for v in values)
    try:
        check_training_reply(
            spec, spec, metrics, partition=0, declared_examples=1, arrays=[("w", array)]
        )
    except RefusedReply:
        assert not finite
    else:
        assert finite


@pytest.mark.parametrize("scale", [1e3, 1e30, 3e38 / 0.2])
def test_an_update_far_outside_the_rounds_is_refused_the_honest_ones_kept(scale):
    """Finite values pass every per-value check; a norm many times the round's others does not."""
    lines: list[str] = []
    screen = ReplyScreen(members(), max_refusals=3, log=lines.append, max_update_ratio=100)
    huge = honest_content(1, step=0.1 * scale / 2)  # client 1's step is 2 x step
    replies = [reply(101, honest_content(0)), reply(102, huge), reply(103, honest_content(2))]
    kept = screen.training("train", 2, ArrayRecord(MODEL), replies)
    assert [r.metadata.src_node_id for r in kept] == [101, 103]
    assert len(lines) == 1 and "node 102 (client 1)" in lines[0]
    assert "max-update-ratio=100" in lines[0] or "overflows" in lines[0]


def test_max_update_ratio_zero_is_no_bound_but_per_reply_checks_still_refuse():
    assert ExperimentConfig.from_run_config({"max-update-ratio": 0}).max_update_ratio == 0
    lines: list[str] = []
    screen = ReplyScreen(members(), max_refusals=3, log=lines.append, max_update_ratio=0)
    assert screen.screens_each_reply_alone
    big = honest_content(1, step=0.1 * 1e6 / 2)  # 10^6 x the others: no bound refuses it
    replies = [reply(101, honest_content(0)), reply(102, big), reply(103, honest_content(2))]
    assert len(screen.training("train", 1, ArrayRecord(MODEL), replies)) == 3 and not lines
    overflowing = honest_content(1, step=1e200)  # inf in float32: refused alone
    replies = [reply(101, honest_content(0)), reply(102, overflowing)]
    kept = screen.training("train", 2, ArrayRecord(MODEL), replies)
    assert [r.metadata.src_node_id for r in kept] == [101] and "node 102" in lines[0]


def test_honest_updates_of_different_sizes_are_all_kept():
    # steps 0.1, 0.2, 0.3: norms within 3x of each other, far inside the bound
    screen = ReplyScreen(members(), max_refusals=3, log=lambda _: None, max_update_ratio=10)
    replies = [reply(101 + p, honest_content(p)) for p in range(3)]
    assert len(screen.training("train", 1, ArrayRecord(MODEL), replies)) == 3
    # ... and a lone reply has no round to be compared with
    lone = ReplyScreen(members(), max_refusals=3, log=lambda _: None, max_update_ratio=1)
    assert len(lone.training("train", 1, ArrayRecord(MODEL), [reply(102, honest_content(1))])) == 1


@given(
    st.dictionaries(st.integers(0, 20), st.floats(0, 1e300), min_size=1, max_size=8),
    st.floats(1, 1e6),
)
@settings(max_examples=200, deadline=None)
def test_norm_outliers_refuses_exactly_what_exceeds_the_others_median(norms, ratio):
    from fedunlearn.reply_checks import norm_outliers

    refused = norm_outliers(norms, ratio)
    for sender, norm in norms.items():
        others = [n for k, n in norms.items() if k != sender]
        over = bool(others) and np.median(others) > 0 and norm > ratio * np.median(others)
        assert (sender in refused) == over


def test_a_reply_the_cheap_checks_refuse_is_never_decoded():
    """Shapes and counts are checked first: an array with another declared shape and bytes that
    do not decode is refused for its shape (decoding it would cost, and could fail first)."""
    lines: list[str] = []
    screen = ReplyScreen(members(), max_refusals=3, log=lines.append, max_update_ratio=100)
    garbage = Array(dtype="float32", shape=(9, 9), stype="numpy.ndarray", data=b"not an array")
    forged = honest_content(1)
    forged["arrays"] = ArrayRecord({"w": garbage, "b": Array(np.zeros(3, dtype=np.float32))})
    replies = [reply(101, honest_content(0)), reply(102, forged), reply(103, honest_content(2))]
    kept = screen.training("train", 1, ArrayRecord(MODEL), replies)
    assert [r.metadata.src_node_id for r in kept] == [101, 103]
    assert "has shape (9, 9)" in lines[0] and "decode" not in lines[0]


# ----------------------------------------------------------------- a round that diverged
def _round(monkeypatch, replies):
    """``train_round`` of the real screen over ``replies`` (asked of all three nodes), the round
    aggregated whole (a strategy that cannot fold its replies)."""
    from types import SimpleNamespace

    import server.training.round_step as rounds

    screen = ReplyScreen(members(), max_refusals=3, log=lambda _: None)
    sent = ArrayRecord(MODEL)
    strategy = Mock()
    strategy.configure_train.return_value = [Mock(spec=Message) for _ in NODES]
    monkeypatch.setattr(rounds, "collect_replies", lambda *a, **k: replies)
    config = SimpleNamespace(min_reply_fraction=0.5, reply_timeout=1.0)
    return lambda: rounds.train_round(None, strategy, config, 1, sent, {}, screen, "pga", print)


def test_a_round_whose_every_refusal_is_non_finite_fails_as_diverged(monkeypatch):
    from server.training.rounds import DivergedRound

    nan = [
        reply(101, hostile("nan", 0)),
        reply(102, hostile("nan-loss")),
        reply(103, honest_content(2)),
    ]
    with pytest.raises(DivergedRound, match="2 of 3 replies refused, every one for a value") as e:
        _round(monkeypatch, nan)()
    # the model the round sent goes with it: the row the method's caller reports, flagged
    assert {k: v.tolist() for k, v in e.value.state.items()} == {
        k: v.tolist() for k, v in MODEL.items()
    }


@pytest.mark.parametrize("other", ["spoofed-partition", "error"])
def test_a_round_failed_for_any_other_reason_is_no_divergence(monkeypatch, other):
    # one non-finite reply beside a hostile or failed one: the run stops as before, not "diverged"
    from server.training.rounds import DivergedRound

    second = reply(102, hostile(other) if other != "error" else {}, error=other == "error")
    second.error.reason = "client raised"
    replies = [reply(101, hostile("inf", 0)), second]
    with pytest.raises(RuntimeError, match="fewer than min-reply-fraction") as failure:
        _round(monkeypatch, replies)()
    assert not isinstance(failure.value, DivergedRound)
