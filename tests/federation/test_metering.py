"""The grid meter: client-epochs and bytes of every message a method sends, whatever its code."""

from __future__ import annotations

from unittest.mock import Mock

import torch
from fake_grid import AnsweringGrid
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from server.federation.metering import MeteredGrid, array_bytes
from server.federation.queries import collect_replies


class _EchoGrid(AnsweringGrid):
    """Every node sends back the arrays it got (a query's reply carries metrics only)."""

    def answer(self, message):
        reply = Mock(spec=Message)
        reply.has_error.return_value = False
        reply.metadata.src_node_id = message.metadata.dst_node_id
        arrays = message.content.array_records
        reply.content = RecordDict({"metrics": MetricRecord({"n": 1}), **arrays})
        return reply

    def get_node_ids(self):
        return [1, 2, 3]


def _message(kind: str, node: int, epochs: int | None, size: int) -> Message:
    content = RecordDict({"arrays": ArrayRecord({"w": torch.zeros(size)})})
    if epochs is not None:
        content["config"] = ConfigRecord({"local-epochs": epochs})
    return Message(content=content, dst_node_id=node, message_type=kind)


def test_training_messages_count_their_epochs_and_queries_none(flower_task_identity):
    grid = MeteredGrid(_EchoGrid())
    messages = [
        _message("train", 1, 2, 10),
        _message("train.calibrate", 2, 1, 10),
        _message("query.scrub_stats", 3, 5, 10),
        _message("train", 3, None, 10),  # no local-epochs: nothing asked
    ]
    replies = collect_replies(grid, messages, timeout=5, log=lambda line: None)
    assert len(replies) == 4
    assert grid.cost.client_epochs == 3
    assert grid.cost.train_messages == 2
    sent = sum(array_bytes(m) for m in messages)
    assert sent > 4 * 10 * 4  # the float32 values and their serialization header
    assert grid.cost.bytes_sent == sent
    assert grid.cost.bytes_received == sent  # the echo returns every array


def test_the_meter_is_transparent(flower_task_identity):
    grid = MeteredGrid(_EchoGrid())
    assert grid.get_node_ids() == [1, 2, 3]
