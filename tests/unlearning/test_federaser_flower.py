"""FedEraser's Flower layer: the forgotten client receives no message; replies become updates."""

from __future__ import annotations

from functools import partial
from unittest.mock import Mock

import pytest
import torch
from fake_grid import AnsweringGrid
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedunlearn.messages import CALIBRATE
from fedunlearn.store.update_store import UpdateStore
from server.federation.queries import collect_replies
from strategies.federaser import FedEraser

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODES = {0: 5001, 1: 5002, 2: 5003}  # partition id -> node id


class SpyGrid(AnsweringGrid):
    """Answers calibration messages as honest clients would: the model plus a client-specific step."""

    def __init__(self, impostor: dict[int, int] | None = None):
        self.sent: list[tuple[int, str, int]] = []
        self.impostor = impostor or {}

    def answer(self, message):
        partition_of = {node: k for k, node in NODES.items()}
        node, config = message.metadata.dst_node_id, message.content["config"]
        self.sent.append((node, message.metadata.message_type, int(config["local-epochs"])))
        model = message.content["arrays"].to_torch_state_dict()
        partition = self.impostor.get(node, partition_of[node])
        reply = Mock(spec=Message)
        reply.has_error.return_value = False
        reply.metadata.src_node_id = node
        trained = {k: v + (partition + 1) * 0.1 for k, v in model.items()}
        reply.content = RecordDict(
            {
                "arrays": ArrayRecord(trained),
                "metrics": MetricRecord({"partition-id": partition, "num-examples": 10}),
            }
        )
        return reply


def _send(grid):
    """The server's way of reaching the nodes of ``grid`` (:func:`server.federation.queries.collect_replies`)."""
    return partial(collect_replies, grid, timeout=5)


def _store(tmp_path):
    store = UpdateStore(tmp_path / "store")
    for t in (1, 3, 5):
        store.write_round(
            t, {"w": torch.zeros(3)}, {k: ({"w": torch.ones(3) * (k + 1)}, 10) for k in NODES}
        )
    return store


def test_the_forgotten_client_receives_no_message(tmp_path):
    grid = SpyGrid()
    eraser = FedEraser(_send(grid), NODES, local_epochs=4, calibration_ratio=0.5)
    result = eraser.unlearn(_store(tmp_path), targets=[1])
    addressed = {node for node, _, _ in grid.sent}
    assert NODES[1] not in addressed
    assert addressed == {NODES[0], NODES[2]}
    assert {kind for _, kind, _ in grid.sent} == {CALIBRATE}
    assert {epochs for _, _, epochs in grid.sent} == {2}  # E_cali = r * E_loc
    assert len(grid.sent) == 2 * 2  # two calibrated rounds (3 and 5), two remaining clients
    assert [s.clients for s in result.steps] == [[0, 2]] * 3


def test_calibration_reply_is_turned_into_an_update(tmp_path):
    eraser = FedEraser(_send(SpyGrid()), NODES, local_epochs=2)
    model = {"w": torch.tensor([1.0, 2.0, 3.0])}
    updates = eraser.calibrate(3, model, [0, 2])
    assert torch.allclose(updates[0]["w"], torch.full((3,), 0.1))
    assert torch.allclose(updates[2]["w"], torch.full((3,), 0.3))


def test_a_node_answering_for_another_client_is_refused(tmp_path):
    eraser = FedEraser(_send(SpyGrid(impostor={NODES[0]: 2})), NODES, local_epochs=2)
    with pytest.raises(RuntimeError, match="not asked"):
        eraser.calibrate(3, {"w": torch.zeros(3)}, [0, 2])


def test_calibrate_refuses_to_address_a_target_during_unlearning(tmp_path):
    eraser = FedEraser(_send(SpyGrid()), NODES, local_epochs=2)
    eraser.requests.forbid([1])
    with pytest.raises(RuntimeError, match="refusing"):
        eraser.calibrate(3, {"w": torch.zeros(3)}, [0, 1])


def test_with_a_screen_a_hostile_calibration_reply_is_left_out_not_fatal(tmp_path):
    seen = []

    def screen(phase, server_round, sent, replies):
        seen.append((phase, server_round, set(sent.keys())))
        return [r for r in replies if r.metadata.src_node_id != NODES[0]]  # refuse node 0

    grid = SpyGrid(impostor={NODES[0]: 2})
    eraser = FedEraser(_send(grid), NODES, local_epochs=2, screen=screen)
    updates = eraser.calibrate(3, {"w": torch.zeros(3)}, [0, 2])
    assert sorted(updates) == [2] and seen == [("calibrate", 3, {"w"})]


def test_a_dropped_client_is_not_asked_to_calibrate(tmp_path):
    grid = SpyGrid()
    eraser = FedEraser(_send(grid), NODES, local_epochs=2, is_dropped=lambda p: p == 2)
    updates = eraser.calibrate(3, {"w": torch.zeros(3)}, [0, 2])
    assert sorted(updates) == [0] and {node for node, _, _ in grid.sent} == {NODES[0]}


# ------------------------------------------------------------------ replies folded as they come
class ScreenedGrid(SpyGrid):
    """Honest replies with every metric the run's screen checks, handed over in reverse order;
    ``failing`` nodes answer with an error, ``scaled`` ones with a step 1000 times larger."""

    def __init__(self, impostor=None, failing=(), scaled=()):
        super().__init__(impostor)
        self.failing, self.scaled = set(failing), set(scaled)

    def answer(self, message):
        reply = super().answer(message)
        node = message.metadata.dst_node_id
        metrics = reply.content["metrics"]
        metrics["train-loss"], metrics["calibration"] = 0.5, 1
        if node in self.scaled:
            arrays = reply.content["arrays"].to_torch_state_dict()
            reply.content["arrays"] = ArrayRecord({k: v * 1000 for k, v in arrays.items()})
        if node in self.failing:
            reply.has_error.return_value = True
            reply.error.reason = "the client's process died"
        return reply

    def pull_messages(self, message_ids):
        return list(reversed(super().pull_messages(sorted(message_ids))))


def _screened(grid, ratio):
    from server.federation.members import FederationMembers
    from server.federation.reply_screening import ReplyScreen

    members = FederationMembers(dict(NODES), dict.fromkeys(NODES, 10), cuda_clients=0)
    screen = ReplyScreen(members, max_refusals=5, log=lambda _: None, max_update_ratio=ratio)
    eraser = FedEraser(
        _send(grid),
        NODES,
        local_epochs=2,
        screen=screen.training,
        screening=screen.training_screening,
    )
    return eraser, screen


@pytest.mark.parametrize("ratio", [100, 0])
def test_stream_folds_the_screened_updates_in_client_order_as_the_collected_call_returns_them(
    ratio,
):
    model = {"w": torch.tensor([1.0, 2.0, 3.0])}
    collected, _ = _screened(ScreenedGrid(), ratio)
    expected = collected.calibrate(3, model, [0, 1, 2])
    streamed, _ = _screened(ScreenedGrid(), ratio)
    folded = []
    streamed.requests.stream(3, model, [2, 0, 1], lambda k, u: folded.append((k, u)))
    assert [k for k, _ in folded] == [0, 1, 2]  # ascending, whatever order they came in
    for k, update in folded:
        assert torch.equal(update["w"], expected[k]["w"])


@pytest.mark.parametrize(
    ("grid", "ratio", "left_out"),
    [
        (lambda: ScreenedGrid(impostor={NODES[0]: 2}), 100, 0),  # answers for another client
        (lambda: ScreenedGrid(failing=[NODES[1]]), 100, 1),  # an error reply
        (lambda: ScreenedGrid(scaled=[NODES[2]]), 100, 2),  # an outlier, known at the end
    ],
    ids=["impostor", "failed", "outlier"],
)
def test_a_refused_failed_or_outlying_reply_is_left_out_of_the_fold_not_fatal(
    grid, ratio, left_out
):
    eraser, screen = _screened(grid(), ratio)
    folded = []
    eraser.requests.stream(3, {"w": torch.zeros(3)}, [0, 1, 2], lambda k, u: folded.append(k))
    assert folded == [k for k in (0, 1, 2) if k != left_out]
    assert screen.refused == (0 if left_out == 1 else 1)


def test_without_the_norm_bound_an_outlying_calibration_reply_is_folded():
    eraser, screen = _screened(ScreenedGrid(scaled=[NODES[2]]), 0)
    folded = []
    eraser.requests.stream(3, {"w": torch.zeros(3)}, [0, 1, 2], lambda k, u: folded.append(k))
    assert folded == [0, 1, 2] and screen.refused == 0


def test_streamed_unlearning_never_addresses_the_target_and_equals_the_collected_one(
    tmp_path, monkeypatch
):
    from strategies.client_updates import ClientUpdates

    results, streamed = {}, []
    stream = ClientUpdates.stream
    monkeypatch.setattr(ClientUpdates, "stream", lambda *a: streamed.append(a[1]) or stream(*a))
    for mode in ("streamed", "collected"):
        if mode == "collected":
            monkeypatch.delattr(ClientUpdates, "stream")  # the core asks through __call__ then
        grid = ScreenedGrid()
        eraser, _ = _screened(grid, 100)
        results[mode] = eraser.unlearn(_store(tmp_path / mode), targets=[1])
        assert NODES[1] not in {node for node, _, _ in grid.sent}
    assert streamed == [3, 5]
    assert torch.equal(results["streamed"].model["w"], results["collected"].model["w"])
    assert [s.clients for s in results["streamed"].steps] == [[0, 2]] * 3


def test_a_thin_sampled_round_is_topped_up_over_flower_and_the_target_never_hears(tmp_path):
    """calibration-clients: round 3 trained clients 1 (the target) and 2 only; with a top-up to 2
    remaining clients, client 0 (who missed round 3) calibrates it too; the target hears nothing."""
    from fedunlearn.unlearning.calibration_top_up import TopUp

    store = UpdateStore(tmp_path / "store")
    for t, clients in ((1, (0, 1, 2)), (3, (1, 2)), (5, (0, 2))):
        updates = {k: ({"w": torch.ones(3) * (k + 1)}, 10) for k in clients}
        store.write_round(t, {"w": torch.zeros(3)}, updates)
    pool = dict.fromkeys(NODES, 10)
    grid = SpyGrid()
    eraser = FedEraser(_send(grid), NODES, local_epochs=2, top_up=TopUp(2, pool, seed=0))
    result = eraser.unlearn(store, targets=[1])
    assert NODES[1] not in {node for node, _, _ in grid.sent}
    assert [s.clients for s in result.steps] == [[0, 2], [0, 2], [0, 2]]
    assert [s.topped_up for s in result.steps] == [[], [0], []]
    plain = SpyGrid()
    FedEraser(_send(plain), NODES, local_epochs=2).unlearn(store, targets=[1])
    assert len(grid.sent) == len(plain.sent) + 1  # one calibration more: client 0 in round 3
