"""The Flower layer of the field's baselines on mocked replies and small stores: FedAU's auxiliary
heads (asked for in the last round only, screened, kept in the policy's state, forgotten with
their client), the participation promise (refused without the opt-in, and only for a method that
is registered as participating), and the methods' table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from test_retaining_fedavg import _grid, _reply, _state

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.methods_table import methods_table
from fedunlearn.registry import UNLEARNING, retention_policies
from fedunlearn.reply_checks import RefusedReply, check_auxiliary_head
from fedunlearn.store.history import forget_clients, load_policy
from fedunlearn.store.retention import AUXILIARY_KEY, AUXILIARY_REQUEST, STATE_KEY
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.fedau import AuxiliaryHeads, split_head
from server.unlearning.participation import target_requests
from strategies.retaining import RetainingFedAvg


@pytest.fixture(autouse=True)
def _in_a_run(flower_task_identity):
    yield


def _with_head(reply, values):
    metrics = dict(reply.content["metrics"])
    metrics[AUXILIARY_KEY] = [float(v) for v in values]
    reply.content = RecordDict(
        {"arrays": reply.content["arrays"], "metrics": MetricRecord(metrics)}
    )
    return reply


def _round(strategy, server_round, heads):
    messages = list(
        strategy.configure_train(server_round, ArrayRecord(_state(0)), ConfigRecord(), _grid())
    )
    replies = [_with_head(_reply(_state(k + 1), 10, k, 101 * (k + 1)), h) for k, h in heads]
    strategy.aggregate_train(server_round, replies)
    return messages


def test_auxiliary_heads_are_asked_for_in_the_last_round_only_and_kept_by_client(tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = RetainingFedAvg(store, [AuxiliaryHeads(last_round=2)], min_available_nodes=3)
    first = _round(strategy, 1, [])
    assert all(AUXILIARY_REQUEST not in m.content["config"] for m in first)
    heads = [(k, torch.arange(6.0) + 10 * k) for k in range(3)]
    last = _round(strategy, 2, heads)
    assert all(int(m.content["config"][AUXILIARY_REQUEST]) >= 1 for m in last)
    kept = load_policy(store, AuxiliaryHeads)
    for k, head in heads:
        assert torch.equal(kept.heads[k], head)
    assert store.rounds() == []  # no update of any round is kept for FedAU
    assert kept.state_bytes() == 3 * 6 * 4


def test_forgetting_a_client_removes_its_auxiliary_head_from_the_kept_state(tmp_path):
    store = UpdateStore(tmp_path / "store")
    strategy = RetainingFedAvg(store, [AuxiliaryHeads(last_round=1)], min_available_nodes=3)
    _round(strategy, 1, [(k, torch.ones(6) * k) for k in range(3)])
    forget_clients(store, [1], retention_policies(["fedau"]))
    assert sorted(load_policy(store, AuxiliaryHeads).heads) == [0, 2]
    for saved in store.metadata[STATE_KEY].values():
        assert "1" not in saved[AuxiliaryHeads.name]["heads"]


def test_a_malformed_auxiliary_state_is_refused():
    with pytest.raises(StoreCorruptionError, match="auxiliary-heads"):
        AuxiliaryHeads.from_state({"format": 1, "heads": {"x": [1.0]}, "last_round": 3})
    with pytest.raises(StoreCorruptionError, match="not a multiple"):
        split_head(torch.zeros(7), torch.Size([2, 2]))


@pytest.mark.parametrize(
    "value, reason",
    [
        ([0.0] * 5, "holds 5 values"),
        ([0.0] * 5 + [float("nan")], "not a finite float"),
        ("0,0,0,0,0,0", "holds 'str'"),
        ([0.0] * 5 + [1], "not a finite float"),
    ],
)
def test_a_hostile_auxiliary_head_is_refused(value, reason):
    """A head of the wrong length, a non-finite value or not a list of floats: refused."""
    sent = {"head.weight": ((2, 2), "float32"), "head.bias": ((2,), "float32")}
    check_auxiliary_head([0.5] * 6, sent)
    with pytest.raises(RefusedReply, match=reason):
        check_auxiliary_head(value, sent)


def test_a_participating_method_is_refused_without_the_opt_in():
    participating = [spec.name for spec in UNLEARNING if spec.target_participates]
    assert sorted(participating) == ["fedosd", "fedquit", "pga"]
    for name in participating:
        with pytest.raises(ConfigError) as refused:
            ExperimentConfig.from_run_config({"unlearn-methods": f"{name},fedretrain"})
        assert refused.value.parameter == "allow-target-participation" and name in str(
            refused.value
        )
        allowed = {"unlearn-methods": f"{name},fedretrain", "allow-target-participation": True}
        assert ExperimentConfig.from_run_config(allowed).allow_target_participation


def test_only_a_participating_method_may_address_the_target():
    config = ExperimentConfig.from_run_config(
        {"unlearn-methods": "pga,fedretrain", "allow-target-participation": True}
    )
    context = SimpleNamespace(
        outcome=SimpleNamespace(config=config), excluded=[0], targets=[0], grid=None, log=print
    )
    with pytest.raises(ConfigError, match="target_participates"):
        target_requests(context, "fedretrain", epochs=1, extra={})
    unsure = SimpleNamespace(allow_target_participation=False)  # a config never validated
    refused = SimpleNamespace(**{**vars(context), "outcome": SimpleNamespace(config=unsure)})
    with pytest.raises(ConfigError, match="allow-target-participation"):
        target_requests(refused, "pga", epochs=1, extra={})


def test_the_methods_table_says_who_needs_the_target_and_which_aggregations():
    table = methods_table().set_index("method")
    assert set(table.index) == set(UNLEARNING.names())
    for spec in UNLEARNING:
        row = table.loc[spec.name]
        assert bool(row["leaving client works"]) == spec.target_participates
        assert row["aggregations"] == ", ".join(spec.aggregations or ("any",))


def test_the_baselines_page_shows_the_registrys_table():
    """docs/baselines.md holds ``fedunlearn methods``' output as it is now."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "baselines.md").read_text()
    assert methods_table().to_markdown(index=False) in page


def test_an_attachment_travels_beside_the_model_and_a_stack_member_gets_its_own_part():
    """PGA's anchor: ClientUpdates sends it as its own record; a judge stack's member i reads the
    ``members.<i>.`` part of it with the prefix dropped."""
    from clients.objectives import member_states
    from strategies.client_updates import ClientUpdates

    sent = []

    def send(messages, label=""):
        sent.extend(messages)
        return []

    requests = ClientUpdates(send, {0: 100}, message_type="train", epochs=1)
    requests(1, {"w": torch.zeros(2)}, [0], {"anchor": {"w": torch.ones(2)}})
    content = sent[0].content
    assert sorted(content.array_records) == ["anchor", "arrays"]
    assert torch.equal(content["anchor"].to_torch_state_dict()["w"], torch.ones(2))
    stacked = {"anchor": {"members.0.w": torch.zeros(1), "members.1.w": torch.ones(1)}}
    assert member_states(stacked, 1) == {"anchor": {"w": torch.ones(1)}}


def test_a_post_training_that_diverged_gives_a_flagged_row_not_a_crash(monkeypatch):
    # PGA without its distance stop ascends to the ball's edge (loss 2e5 on MNIST): the remaining
    # clients' training from that model returns NaN, every reply is refused. The request keeps the
    # other methods' rows; this one's is the model before post-training, flagged "diverged".
    import pandas as pd

    import server.unlearning.baselines as baselines
    from server.training.rounds import DivergedRound
    from server.unlearning.comparison import with_verdicts

    def diverges(*args, **kwargs):
        raise DivergedRound("pga round 1: 9 of 9 replies refused, every one for a value ...")

    monkeypatch.setattr(baselines, "rounds_from", diverges)
    monkeypatch.setattr(baselines, "model_accuracy", lambda context, state, samples=None: 0.0892)
    monkeypatch.setattr(baselines, "attack_success", lambda context, state: 0.0)
    config = SimpleNamespace(post_training_rounds=2)
    context = SimpleNamespace(outcome=SimpleNamespace(config=config), log=lambda _: None)
    unlearned = {"w": torch.ones(2)}
    state, details = baselines.post_trained(context, "pga", unlearned, "ascended")
    assert state is unlearned and details["accuracy_after_unlearning"] == 0.0892
    assert details["attack_success_after_unlearning"] == 0.0  # the backdoor before post-training
    assert details["did"] == "ascended; post-training diverged"
    table = pd.DataFrame(
        [
            {"method": m, "test_accuracy": a, "test_loss": 0.1, "l2_to_fedretrain": 1.0}
            for m, a in (("fedavg", 0.98), ("fedretrain", 0.98), ("pga", 0.98))
        ]
    ).assign(l2_to_original=[0.0, 1.0, 1.0])
    flagged = with_verdicts(table, {"pga": details}, 5.0)
    assert flagged.set_index("method").loc["pga", "flag"].startswith("diverged: pga round 1")
    assert flagged.set_index("method").loc["fedretrain", "flag"] == ""
