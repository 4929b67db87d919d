"""One training round folded reply by reply: FedAvg's sum and the retained rows, as replies arrive.

Flower's ``Strategy.aggregate_train(round, replies)`` takes the round's replies all at once, so a
server of K clients holds K models at the round's end (3.1 GiB at K = 1,000 MNIST clients, against
1.36 GiB between rounds). For the aggregations whose result is a weighted sum (FedAvg, FedProx) and
retention policies that know before the round what they keep (:meth:`RetentionPolicy.plan`:
FedEraser's interval, full or norms), :class:`StreamingRound` instead takes each screened reply as
it arrives: it decodes it, lets the reorder buffer hand it over in partition order
(:mod:`fedunlearn.training.streaming`), adds it to the weighted sum, writes its update or norms row
into the round's store writer, keeps its few metrics and lets the reply go. The model is Flower's
FedAvg's, bit for bit, when every sampled client replies with the count it declared; the store holds
the same blobs as the round-at-once path (:meth:`strategies.retaining.Retaining.aggregate_train`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedProx

from fedunlearn.store.retention import Plan
from fedunlearn.training.model_state import state_difference
from fedunlearn.training.streaming import DEFAULT_WINDOW, Contribution, ReorderBuffer, WeightedSum

#: The aggregations a round can fold reply by reply: Flower's weighted mean, exactly these classes
#: (a subclass may aggregate otherwise). FedMedian, FedTrimmedAvg and Krum need the round whole.
FOLDING_AGGREGATIONS = (FedAvg, FedProx)


def folds_replies(strategy) -> bool:
    """Whether ``strategy`` aggregates by Flower's weighted mean (and nothing else)."""
    return type(strategy) in FOLDING_AGGREGATIONS


class StreamingRound:
    """Round ``server_round`` of a :class:`~strategies.retaining.Retaining` strategy, folded as its
    replies arrive.

    Parameters
    ----------
    retaining : Retaining
        The strategy whose round this is (its store, policies and record).
    server_round : int
        The round.
    expected : Mapping[int, int]
        Partition id -> N_k declared at discovery, of every client asked this round: the order of
        the sum and its N (:class:`~fedunlearn.training.streaming.WeightedSum`).
    plans : Mapping[str, Plan]
        Each policy's :meth:`~fedunlearn.store.retention.RetentionPolicy.plan` of this round.
    window : int
        Replies held in memory at most while they wait for their turn (then spilled to disk).
    gated : bool
        Fold nothing before :meth:`finish`, so that replies refused at the round's end
        (:meth:`withdraw`; ``max-update-ratio`` compares each with the others) are never added.
    """

    def __init__(
        self,
        retaining,
        server_round: int,
        expected: Mapping[int, int],
        plans: Mapping[str, Plan],
        *,
        window: int = DEFAULT_WINDOW,
        gated: bool = False,
    ) -> None:
        self.retaining, self.round, self.plans = retaining, server_round, dict(plans)
        self.key, self.weighted_by_key = retaining.arrayrecord_key, retaining.weighted_by_key
        self.buffer = ReorderBuffer(expected, window=window, gated=gated)
        self.sum = WeightedSum(expected)
        self.metrics: list[RecordDict] = []
        self.kept = Plan.merge(self.plans.values())
        self._global_state = None
        self._writer = None
        if retaining.store is not None and self.kept.keeps_anything():
            self._global_state = retaining.started_from(server_round)
            model = self._global_state if self.kept.keep_global else None
            writer = retaining.store.begin_round(server_round, model)
            self._writer = writer.__enter__()

    def add(self, partition: int, reply: Message, decoded: Mapping | None = None) -> None:
        """A screened reply of client ``partition``: decoded (``decoded``: its arrays as the
        screen decoded them, name -> NumPy in the reply's order), folded when its turn comes."""
        metrics = next(iter(reply.content.metric_records.values()))
        if decoded is None:
            decoded = {name: array.numpy() for name, array in reply.content[self.key].items()}
        arrays = list(decoded.items())
        light = RecordDict({"metrics": MetricRecord(dict(metrics))})
        contribution = Contribution(partition, arrays, metrics[self.weighted_by_key], light)
        for ready in self.buffer.put(contribution):
            self._fold(ready)

    def waits_for(self, partition: int | None) -> bool:
        """Whether client ``partition`` was asked this round and has not been handed over."""
        return partition is not None and self.buffer.waits_for(partition)

    def withdraw(self, partition: int) -> None:
        """Take back client ``partition``'s reply, added but not folded yet (refused late)."""
        self.buffer.withdraw(partition)

    def absent(self, partition: int) -> None:
        """Client ``partition`` has no reply to fold (refused, failed)."""
        for ready in self.buffer.absent(partition):
            self._fold(ready)

    def finish(self) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's aggregate and metrics; its store round committed and its record saved."""
        for ready in self.buffer.close():
            self._fold(ready)
        result = self.sum.result()
        if result is None:
            self.abort()
            return None, None
        if self._writer is not None:
            self._writer.__exit__(None, None, None)
            self._writer = None
        strategy = self.retaining.strategy
        metrics = strategy.train_metrics_aggr_fn(self.metrics, self.weighted_by_key)
        folded = sorted(self.sum.folded)
        self.retaining.record_round(self.round, folded, self.plans)
        arrays = ArrayRecord({name: Array(np.asarray(value)) for name, value in result.items()})
        return arrays, metrics

    def abort(self) -> None:
        """The round failed: nothing of it is written (the store writer removes its files)."""
        self.buffer.discard()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            error = RuntimeError(f"round {self.round} was not completed")
            writer.__exit__(type(error), error, None)

    def _fold(self, contribution: Contribution) -> None:
        self.sum.fold(contribution)
        self.metrics.append(contribution.extra)
        if self._writer is None or not (self.kept.updates or self.kept.norms):
            return
        client_state = {name: torch.from_numpy(value) for name, value in contribution.arrays}
        update = state_difference(client_state, self._global_state)
        add = self._writer.add_update if self.kept.updates else self._writer.add_norms
        add(contribution.key, update, int(contribution.weight))
