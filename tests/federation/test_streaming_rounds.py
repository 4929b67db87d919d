"""Training rounds folded reply by reply, through the real ClientApp in this process (no Ray): the
same model, bit for bit, and the same retained store as the round aggregated whole, whatever order
the replies arrive in; a refused or failed reply is neither folded nor kept; a round that fails
leaves nothing of itself in the store."""

from __future__ import annotations

import pytest
import torch
from federation_grid import CLIENT_APP_RAISED_AN_EXCEPTION, ClientAppGrid, K
from flwr.app import ArrayRecord, Error, Message

import strategies.retaining as retaining
from fedunlearn.config import ExperimentConfig
from server.training.original import train_federated
from strategies.streaming import StreamingRound

pytestmark = pytest.mark.usefixtures("flower_task_identity")

VALUES = {
    "num-clients": K,
    "rounds": 3,
    "local-epochs": 1,
    "retain-interval": 1,
    "unlearn-clients": "",
    "unlearn-methods": "federaser,fedretrain",
    "node-wait-seconds": 5,
}


class ShuffledGrid(ClientAppGrid):
    """Replies handed over in reverse of the order asked; ``broken(partition, round)`` names a
    reply to turn into an error or a hostile one."""

    def __init__(self, run_config, broken=None, kind="error"):
        super().__init__(run_config)
        self.broken, self.kind, self.round = broken or (lambda p, r: False), kind, 0
        self.calibration_broken = lambda p, r: False

    def answer(self, message):
        config = message.content.config_records.get("config")
        server_round = int(config.get("server-round", 0)) if config is not None else 0
        reply = super().answer(message)
        partition = message.metadata.dst_node_id - 100
        kind = message.metadata.message_type
        if kind == "train.calibrate" and self.calibration_broken(partition, server_round):
            kind = "train"  # an outlying calibration reply, made as a training one would be
        elif kind == "train" and not self.broken(partition, server_round):
            kind = ""
        if kind == "train":
            if self.kind == "error":
                reply = Message(
                    Error(CLIENT_APP_RAISED_AN_EXCEPTION, "client lost"), reply_to=message
                )
            elif self.kind == "hostile":  # a count above the one it declared
                reply.content["metrics"]["num-examples"] = 10**6
            else:  # an outlier: finite, its update thousands of times the others'
                arrays = reply.content["arrays"].to_torch_state_dict()
                scaled = {k: v * 1000 if v.is_floating_point() else v for k, v in arrays.items()}
                reply.content["arrays"] = ArrayRecord(scaled)
        return reply

    def pull_messages(self, message_ids):
        return list(reversed(super().pull_messages(sorted(message_ids))))


def _train(tmp_path, name, monkeypatch, *, fold=True, grid=None, **values):
    values = {**VALUES, **values, "output-dir": str(tmp_path), "run-name": name}
    folded, before_finish = [], []
    original = StreamingRound.finish

    def finish(self):
        folded.append(self.round)
        before_finish.append(len(self.sum.folded))
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(StreamingRound, "finish", finish)
        if not fold:
            patch.setattr(retaining.Retaining, "stream_train", lambda *a, **k: None)
        spy = grid(values) if grid else ShuffledGrid(values)
        outcome = train_federated(spy, ExperimentConfig.from_run_config(values), log=lambda _: None)
    outcome.folded_before_finish = before_finish
    return outcome, folded


def _same_store(a, b) -> None:
    assert a.rounds() == b.rounds()
    for r in a.rounds():
        one, two = a.read_round(r), b.read_round(r)
        assert one.clients == two.clients and one.norms_only == two.norms_only
        assert one.num_examples == two.num_examples and one.squares == two.squares
        assert (one.global_model is None) == (two.global_model is None)
        if one.global_model is not None:
            assert all(torch.equal(one.global_model[k], v) for k, v in two.global_model.items())
        for client, update in one.updates.items():
            assert all(torch.equal(update[k], v) for k, v in two.updates[client].items())


@pytest.mark.parametrize(
    "values",
    [
        {"retain-mode": "full"},
        {"retain-mode": "norms"},
        {"fraction-train": 0.5, "min-train-clients": 2},
        {"strategy": "fedprox", "proximal-mu": 0.1, "retain": False},
        {"retain-mode": "full", "max-update-ratio": 0},
        {"retain-mode": "norms", "max-update-ratio": 0, "fraction-train": 0.5},
    ],
    ids=["full", "norms", "sampled", "fedprox-no-store", "on-arrival", "on-arrival-norms"],
)
def test_folding_each_reply_gives_the_whole_rounds_model_and_store_bit_for_bit(
    tmp_path, monkeypatch, values
):
    whole, folded_rounds = _train(tmp_path, "whole", monkeypatch, fold=False, **values)
    assert folded_rounds == []
    folded, folded_rounds = _train(tmp_path, "folded", monkeypatch, **values)
    assert folded_rounds == [1, 2, 3]  # every round took the folding path
    assert all(torch.equal(folded.final_state[k], v) for k, v in whole.final_state.items())
    if whole.store is not None:
        _same_store(whole.store, folded.store)
        assert whole.store.metadata == folded.store.metadata
    # without max-update-ratio each reply is folded as it arrives, before the round ends; with
    # it, every reply waits for the round's end (an outlier is known only then)
    on_arrival = values.get("max-update-ratio") == 0
    asked = 2 if "fraction-train" in values else K
    assert folded.folded_before_finish == [asked if on_arrival else 0] * 3


def test_a_robust_aggregation_is_aggregated_whole(tmp_path, monkeypatch):
    _, folded_rounds = _train(
        tmp_path, "median", monkeypatch, strategy="fedmedian", **{"unlearn-methods": "fedretrain"}
    )
    assert folded_rounds == []


@pytest.mark.parametrize(
    ("kind", "ratio"), [("error", 100), ("hostile", 100), ("outlier", 100), ("hostile", 0)]
)
def test_a_lost_or_refused_reply_is_neither_folded_nor_kept(tmp_path, monkeypatch, kind, ratio):
    def broken(partition, server_round):
        return partition == 2 and server_round == 2

    def grid(values):
        return ShuffledGrid(values, broken, kind)

    values = {"max-update-ratio": ratio}
    whole, _ = _train(tmp_path, "whole", monkeypatch, fold=False, grid=grid, **values)
    folded, rounds = _train(tmp_path, "folded", monkeypatch, grid=grid, **values)
    assert rounds == [1, 2, 3]
    assert folded.store.clients(2) == [0, 1, 3] and folded.store.clients(3) == [0, 1, 2, 3]
    # the round's N lost client 2's count: the average is rescaled, equal up to rounding
    for key, value in whole.final_state.items():
        torch.testing.assert_close(folded.final_state[key], value, rtol=1e-5, atol=1e-6)
    _same_store_up_to_rounding(whole.store, folded.store)


def _same_store_up_to_rounding(a, b) -> None:
    assert a.rounds() == b.rounds()
    for r in a.rounds():
        one, two = a.read_round(r), b.read_round(r)
        assert one.clients == two.clients
        for client, update in one.updates.items():
            for k, v in update.items():
                torch.testing.assert_close(two.updates[client][k], v, rtol=1e-4, atol=1e-5)


def test_a_failed_round_leaves_nothing_of_itself_in_the_store(tmp_path, monkeypatch):
    def broken(partition, server_round):
        return server_round == 2 and partition != 0  # 1 of 4: under min-reply-fraction

    with pytest.raises(RuntimeError, match="round 2: 1 valid replies of 4 asked"):
        _train(tmp_path, "failed", monkeypatch, grid=lambda v: ShuffledGrid(v, broken))
    from fedunlearn.store.update_store import UpdateStore

    stores = list(tmp_path.glob("failed*/**/store.json"))
    assert stores, "the run wrote no store"
    store = UpdateStore(stores[0].parent)
    assert store.rounds() == [1]
    round_two = stores[0].parent / "blobs" / "round_000002"
    assert not round_two.exists() or not any(round_two.iterdir())


# ------------------------------------------------------------------ FedEraser's calibration
@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ({"retain-mode": "full"}, None),
        ({"retain-mode": "norms", "max-update-ratio": 0}, None),
        ({"retain-mode": "full"}, "outlier"),
    ],
    ids=["full", "norms-on-arrival", "an-outlier-calibration"],
)
def test_federasers_calibration_folded_as_replies_come_equals_the_collected_one(
    tmp_path, monkeypatch, values, kind
):
    """FedEraser's steps fold each calibration reply as it comes (``ClientUpdates.stream``):
    the same model, bit for bit, and the same trajectory as the replies collected first; the
    target's node is never asked; an outlying calibration reply is left out of its step."""
    from server.unlearning.request import run_unlearning
    from strategies.client_updates import ClientUpdates

    def broken(partition, server_round):
        return kind == "outlier" and partition == 3 and server_round == 3

    models, streamed = {}, []
    original_stream = ClientUpdates.stream

    def stream(self, *args):
        streamed.append(args[0])
        return original_stream(self, *args)

    for mode in ("collected", "folded"):
        grid = ShuffledGrid({**VALUES, **values}, kind="outlier")
        trained, _ = _train(tmp_path, mode, monkeypatch, grid=lambda v, g=grid: g, **values)
        grid.calibration_broken = broken  # training was clean; the calibration is not
        sent: list[int] = []
        with monkeypatch.context() as patch:
            if mode == "collected":
                patch.delattr(ClientUpdates, "stream")
            else:
                patch.setattr(ClientUpdates, "stream", stream)

            def answer(message, original=grid.answer, sent=sent):
                sent.append(message.metadata.dst_node_id)
                return original(message)

            patch.setattr(grid, "answer", answer)
            refused_before = trained.screen.refused
            run_unlearning(grid, trained, [0], log=lambda _: None)
        assert 100 not in sent  # the target's node: no message
        assert (trained.screen.refused > refused_before) == (kind == "outlier")
        models[mode] = trained.run.load_model("model_federaser")
    assert streamed == [2, 3]  # the folded run's calibrations went reply by reply
    assert models["folded"].keys() == models["collected"].keys()
    for key, value in models["collected"].items():
        assert torch.equal(models["folded"][key], value), key


def test_a_round_broken_off_midway_leaves_no_round_and_no_spilled_reply(tmp_path, monkeypatch):
    """The grid fails while round 2's replies arrive, some of them spilled to disk (a window of
    one, the replies in reverse order): the run stops, the store has round 1 only, and no
    spilled reply is left in the temporary folder."""
    import tempfile

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    from fedunlearn.training.streaming import ReorderBuffer

    spilled, spill_one = [], ReorderBuffer._spill
    monkeypatch.setattr(
        ReorderBuffer, "_spill", lambda self, c: spilled.append(c.key) or spill_one(self, c)
    )
    stream_train = retaining.Retaining.stream_train
    monkeypatch.setattr(
        retaining.Retaining,
        "stream_train",
        lambda self, r, expected, **k: stream_train(self, r, expected, **{**k, "window": 1}),
    )

    class Breaking(ShuffledGrid):
        def pull_messages(self, message_ids):
            self.pulls = self.pulls + 1 if self.round_two else 0
            if self.pulls == 3:  # two replies in, the second spilled (a window of one)
                raise ConnectionError("the SuperLink went away")
            return super().pull_messages(sorted(message_ids)[-1:])  # one reply a pull

        pulls = 0

        def answer(self, message):
            config = message.content.config_records.get("config")
            self.round_two = config is not None and config.get("server-round") == 2
            return super().answer(message)

    with pytest.raises(ConnectionError, match="went away"):
        _train(tmp_path, "broken", monkeypatch, grid=Breaking)
    from fedunlearn.store.update_store import UpdateStore

    [store_file] = list(tmp_path.glob("broken*/**/store.json"))
    assert UpdateStore(store_file.parent).rounds() == [1]
    assert not list(spill.glob("fedunlearn-reorder-*"))  # the spilled replies went with the round
    assert spilled, "no reply was spilled: the test did not test it"
