"""The certified head's training set over a federation: :class:`FederatedHeadData`, the
:class:`fedunlearn.certified.head_data.HeadData` interface answered by the clients' messages
(``query.certified_head``, see ``clients/head_queries.py``), for the server-side plug-in
:mod:`server.certified.head`.

A sample is named ``(partition id, local index)``, two integers (nothing is coerced). A removal
request names samples of one or more clients, or a whole client; only the clients holding removed
samples are asked for their parts. Clients are other organisations' machines: every reply is
validated (:mod:`server.certified.replies`) and a bad one stops the request, which then leaves
the head, b, beta, the removed lists and the ledger as they were (the engine's transaction).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.certified.head_data import id_list, is_integer_id
from fedunlearn.certified.statistics import HeadSums, RemovedParts, StepSums, unpack_symmetric
from fedunlearn.errors import ConfigError
from fedunlearn.messages import HEAD_QUERY
from server.certified.replies import (
    BadReplyError,
    CheckedReply,
    Expectation,
    QueryFailedError,
    check_reply,
    expected_shapes,
)
from server.federation.members import FederationMembers
from server.federation.queries import query_nodes
from server.progress import Log

SampleId = tuple[int, int]


def model_digest(state: Mapping[str, torch.Tensor]) -> str:
    """A short digest of a model's parameters: the clients' feature cache key."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class FederatedHeadData:
    """:class:`fedunlearn.certified.head_data.HeadData` over a federation's clients.

    Every reply is validated before it is used (:mod:`server.certified.replies`): from the node
    asked, the op's arrays with their exact shapes, finite floating values, and counts equal to the
    samples the server believes the partition holds; a bad one raises
    :class:`server.certified.replies.BadReplyError` naming the node and partition.

    Parameters
    ----------
    grid : Grid
    members : FederationMembers
        Node id and declared sample count N_k of every partition (from discovery).
    model_state : mapping
        The trained federated model; its body computes the features on each client.
    loss : str
    classes : sequence of int
        Labels of the one-vs-rest heads (two classes: one binary head).
    partitions : iterable of int, optional
        The clients whose data forms D (default: every client still taking part).
    settings : mapping, optional
        The run's data settings (:func:`fedunlearn.data.federated_data.run_settings`), sent with every
        query so that clients compute on the partitions the run was trained with.
    timeout : float (default: 3600)
        Seconds to wait for the replies to one query (the run's ``reply-timeout``).
    log : Log, optional
        Where the heartbeat lines of a long query go (:mod:`server.federation.queries`).
    """

    def __init__(
        self,
        grid: Grid,
        members: FederationMembers,
        model_state: Mapping[str, torch.Tensor],
        loss: str,
        classes: Sequence[int],
        *,
        partitions: Iterable[int] | None = None,
        settings: Mapping[str, Any] | None = None,
        timeout: float = 3600.0,
        log: Log | None = None,
    ) -> None:
        self.grid = grid
        self.timeout, self.log = timeout, log
        self.settings = dict(settings or {})  # the run's data settings, sent with every query
        self.loss = loss
        self.classes = [int(c) for c in classes]
        self.num_heads = 1 if len(self.classes) == 2 else len(self.classes)
        self.partitions = sorted(members.partition_ids if partitions is None else partitions)
        self.node_of = {p: members.node_of_partition[p] for p in self.partitions}
        self.model_state = dict(model_state)
        self.model_id = model_digest(self.model_state)
        self.removed_ids: dict[int, set[int]] = {p: set() for p in self.partitions}
        self.messages = 0
        self.model_resends = 0
        self.dim = 0  # known after prepare; the replies' shapes follow from it
        declared = {p: int(members.num_examples[p]) for p in self.partitions}
        replies = self._ask(
            "prepare",
            self.partitions,
            {},
            lambda p: Expectation(expected_shapes("prepare", heads=0, dim=0), (1, declared[p])),
            attach_model=True,
        )
        self.sizes = {p: r.count for p, r in replies.items()}
        dims = {p: int(r.arrays["dim"][0]) for p, r in replies.items()}
        for p, dim in dims.items():
            if dim < 1 or dim != dims[self.partitions[0]]:
                raise BadReplyError(
                    self.node_of[p],
                    p,
                    "prepare",
                    f"feature width {dim}; partition {self.partitions[0]} reported "
                    f"{dims[self.partitions[0]]} (the same body gives every client the same width)",
                )
        self.dim = dims[self.partitions[0]]

    # ------------------------------------------------------------------ messaging
    def _ask(
        self,
        op: str,
        partitions: Sequence[int],
        head: Mapping[str, np.ndarray],
        expect: Callable[[int], Expectation],
        *,
        attach_model: bool = False,
        extra: Mapping[int, Mapping[str, Any]] | None = None,
        **config: Any,
    ) -> dict[int, CheckedReply]:
        """Send one query to each partition; the validated replies by partition id."""
        pending = list(partitions)
        answers: dict[int, CheckedReply] = {}
        for attempt in range(2):
            messages = [
                self._message(op, p, head, attach_model or attempt > 0, extra, config)
                for p in pending
            ]
            asked = {self.node_of[p]: p for p in pending}
            self.messages += len(messages)
            replies = query_nodes(
                self.grid,
                messages,
                op=op,
                who="certified head",
                timeout=self.timeout,
                partition_of=asked,
                log=self.log,
            )
            retry = []
            for node, reply in replies.items():
                p = asked[node]
                checked = check_reply(reply.content, op, expect(p), node=node, partition=p)
                if checked.needs_model:
                    retry.append(p)  # the client lost its feature cache: resend the body
                else:
                    answers[p] = checked
            if not retry:
                return answers
            pending = sorted(retry)
            self.model_resends += len(retry)
        raise QueryFailedError(
            f"certified head: clients {pending} (nodes {[self.node_of[p] for p in pending]}) "
            "could not compute their features even with the body attached"
        )

    def _message(self, op, partition, head, attach_model, extra, config) -> Message:
        record = {
            "op": op,
            "model-id": self.model_id,
            "loss": self.loss,
            "classes": self.classes,
            "removed": sorted(self.removed_ids[partition]),
            **self.settings,
            **config,
            **dict((extra or {}).get(partition, {})),
        }
        content = RecordDict({"config": ConfigRecord(record)})
        if head:
            content["head"] = ArrayRecord(
                {k: Array(np.ascontiguousarray(v)) for k, v in head.items()}
            )
        if attach_model:
            content["model"] = ArrayRecord(self.model_state)
        return Message(
            content=content, dst_node_id=self.node_of[partition], message_type=HEAD_QUERY
        )

    def _present(self, partition: int) -> int:
        return self.sizes[partition] - len(self.removed_ids[partition])

    def _expect(self, op: str, **shape_options: Any) -> Callable[[int], Expectation]:
        """Replies to ``op`` over each partition's present samples (sums, gram, step)."""
        shapes = expected_shapes(op, heads=self.num_heads, dim=self.dim, **shape_options)
        summed = "count" in shapes

        def expect(p: int) -> Expectation:
            n = self._present(p)
            return Expectation(shapes, (n, n), n if summed else None)

        return expect

    # ------------------------------------------------------------------ HeadData
    def count(self) -> int:
        return sum(self._present(p) for p in self.partitions)

    def sums(
        self, weights: np.ndarray, *, hessian: bool, single_precision: bool = False
    ) -> HeadSums:
        # Clients always form float64 Hessians (single_precision is a central-data speed option).
        replies = self._ask(
            "sums",
            self.partitions,
            {"weights": weights},
            self._expect("sums", hessian=hessian),
            hessian=hessian,
        )
        parts = [HeadSums.from_arrays(replies[p].arrays) for p in self.partitions]
        return sum(parts[1:], parts[0])

    def gram(self) -> np.ndarray:
        replies = self._ask("gram", self.partitions, {}, self._expect("gram"))
        return sum(unpack_symmetric(replies[p].arrays["gram"], self.dim) for p in self.partitions)

    def _grouped(self, ids: Sequence[Hashable]) -> dict[int, list[int]]:
        grouped: dict[int, list[int]] = {}
        seen: set[SampleId] = set()
        for sample in id_list(ids):
            partition, index = _sample_id(sample)
            if partition not in self.removed_ids:
                raise ConfigError("ids", sample, f"a partition among {self.partitions}")
            if not 0 <= index < self.sizes[partition]:
                raise ConfigError("ids", sample, f"a local index in [0, {self.sizes[partition]})")
            if index in self.removed_ids[partition]:
                raise ConfigError(
                    "ids", sample, "a sample still in the training set (it was removed)"
                )
            if (partition, index) in seen:
                raise ConfigError("ids", sample, "each sample at most once per request")
            seen.add((partition, index))
            grouped.setdefault(partition, []).append(index)
        if not grouped:
            raise ConfigError(
                "ids", list(ids), "a non-empty list of (partition id, local index) pairs"
            )
        return grouped

    def removed(
        self, ids: Sequence[Hashable], weights: np.ndarray, anchor: np.ndarray | None
    ) -> RemovedParts:
        grouped = self._grouped(ids)
        head = {"weights": weights} if anchor is None else {"weights": weights, "anchor": anchor}

        def expect(p: int) -> Expectation:
            m = len(grouped[p])
            shapes = expected_shapes(
                "removed", heads=self.num_heads, dim=self.dim, removed=m, factor=anchor is not None
            )
            return Expectation(shapes, (self._present(p), self._present(p)), m)

        replies = self._ask(
            "removed",
            sorted(grouped),
            head,
            expect,
            extra={p: {"ids": grouped[p]} for p in grouped},
        )
        parts = [RemovedParts.from_arrays(replies[p].arrays) for p in sorted(grouped)]
        return sum(parts[1:], parts[0])

    def drop(self, ids: Sequence[Hashable]) -> None:
        grouped = self._grouped(ids)
        self.removed_ids = {
            p: removed | set(grouped.get(p, ())) for p, removed in self.removed_ids.items()
        }

    def snapshot(self) -> object:
        return {p: frozenset(removed) for p, removed in self.removed_ids.items()}

    def restore(self, state: object) -> None:
        saved: Mapping[int, frozenset[int]] = state  # type: ignore[assignment]
        self.removed_ids = {p: set(removed) for p, removed in saved.items()}

    def step(
        self,
        weights: np.ndarray,
        anchor: np.ndarray,
        step: np.ndarray,
        *,
        hessian_vector: bool = True,
    ) -> StepSums:
        replies = self._ask(
            "step",
            self.partitions,
            {"weights": weights, "anchor": anchor, "step": step},
            self._expect("step"),
            **{"hessian-vector": hessian_vector},
        )
        parts = [StepSums.from_arrays(replies[p].arrays) for p in self.partitions]
        return sum(parts[1:], parts[0])

    def present(self, partition: int) -> list[int]:
        """Local indices of ``partition``'s samples still in D'."""
        return [i for i in range(self.sizes[partition]) if i not in self.removed_ids[partition]]


def _sample_id(sample: object) -> SampleId:
    """A (partition id, local index) pair of integers; nothing is coerced."""
    if isinstance(sample, (str, bytes)) or not isinstance(sample, (tuple, list, np.ndarray)):
        raise ConfigError("ids", sample, "(partition id, local index) pairs of integers")
    values = list(sample)
    if len(values) != 2 or not all(is_integer_id(v) for v in values):
        raise ConfigError(
            "ids", sample, "(partition id, local index) pairs of integers (no bool, float or str)"
        )
    return int(values[0]), int(values[1])
