"""What :class:`strategies.retaining.Retaining` reads of the clients' training replies.

Every training reply carries its client's ``partition-id`` (:data:`PARTITION_ID_KEY`): the store is
keyed by it, and the replies are handed on in its order (:func:`partition_order`). Besides the
client model (whose update U_k^t = M_k^t - M^t :class:`ReplyUpdates` computes on each read) a reply
may carry L^t, the loss of the model it received (:func:`start_loss`), and an auxiliary head
(:func:`auxiliary_heads`), each when a retention policy asked for it; its other numeric metrics are
averaged by :func:`aggregate_train_metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedunlearn.store.retention import AUXILIARY_KEY
from fedunlearn.training.model_state import state_difference

#: Metrics every training reply must carry for retention.
PARTITION_ID_KEY = "partition-id"
#: The config key asking the clients for L^t (the loss of the model they received, before they
#: train), and the metric that answers it: what a policy with ``wants_start_loss`` reads.
START_LOSS_REQUEST, START_LOSS_KEY = "report-start-loss", "start-loss"


def aggregate_train_metrics(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
    """Weighted mean of the clients' numeric metrics, leaving out ids that must not be averaged."""
    totals: dict[str, float] = {}
    weight_sum = 0.0
    for record in records:
        metrics = next(iter(record.metric_records.values()))
        weight = float(metrics[weighted_by_key])
        weight_sum += weight
        for key, value in metrics.items():
            if key in (weighted_by_key, PARTITION_ID_KEY) or isinstance(value, list):
                continue
            totals[key] = totals.get(key, 0.0) + weight * float(value)
    aggregated = (
        MetricRecord({k: v / weight_sum for k, v in totals.items()})
        if weight_sum
        else MetricRecord()
    )
    aggregated[weighted_by_key] = int(weight_sum)
    return aggregated


def start_loss(replies: list[Message], weighted_by_key: str) -> float | None:
    """L^t: the replies' ``start-loss`` weighted by their sample counts (None if none reported)."""
    total = weight = 0.0
    for reply in replies:
        metrics = next(iter(reply.content.metric_records.values()))
        if START_LOSS_KEY in metrics:
            total += float(metrics[weighted_by_key]) * float(metrics[START_LOSS_KEY])
            weight += float(metrics[weighted_by_key])
    return total / weight if weight > 0 else None


def auxiliary_heads(replies: list[Message]) -> dict[int, torch.Tensor]:
    """The auxiliary heads the replies carry (:data:`AUXILIARY_KEY`), flat, by partition id."""
    heads = {}
    for reply in replies:
        metrics = next(iter(reply.content.metric_records.values()))
        if AUXILIARY_KEY in metrics and PARTITION_ID_KEY in metrics:
            values = metrics[AUXILIARY_KEY]
            heads[int(metrics[PARTITION_ID_KEY])] = torch.tensor(list(values), dtype=torch.float32)
    return heads


def partition_order(reply: Message) -> tuple[int, int]:
    """Sort key: replies with a partition id first, by id; failed or anonymous replies after."""
    if reply.has_error():
        return (1, 0)
    metrics = next(iter(reply.content.metric_records.values()), None)
    if metrics is None or PARTITION_ID_KEY not in metrics:
        return (1, 0)
    return (0, int(metrics[PARTITION_ID_KEY]))


class ReplyUpdates(Mapping):
    """Partition id -> U_k^t = M_k^t - M^t, computed from the reply's arrays on each read: a
    round of many clients never holds all its updates besides the replies themselves."""

    def __init__(self, arrays: Mapping[int, ArrayRecord], global_state) -> None:
        self._arrays, self._global_state = arrays, global_state

    def __getitem__(self, partition_id: int):
        client_state = self._arrays[partition_id].to_torch_state_dict()
        return state_difference(client_state, self._global_state)

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


def shallow_arrays(reply: Message, key: str) -> ArrayRecord:
    """A new ArrayRecord holding the same arrays as the reply's ``key`` record."""
    return ArrayRecord(dict(reply.content[key].items()))
