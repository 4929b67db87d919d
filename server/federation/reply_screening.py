"""Hostile replies refused: every training, calibration and evaluation reply is checked before use.

The checks are :mod:`fedunlearn.reply_checks` (Flower-free); this module applies them to Flower
messages and keeps the run's account of refusals. A refused reply is not aggregated and not
retained; it is logged with the node id, the client and the reason (on the console and in the run
directory's ``refused_replies.jsonl``) and counted (``refused`` in ``metrics.csv``). A node refused
``max-refusals`` rounds in a row is dropped from the run (named on the console and in the log): it
gets no further message, and every later phase goes on without its partition.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from flwr.app import ArrayRecord, Message

from fedunlearn.reply_checks import (
    NonFiniteReply,
    RefusedReply,
    check_evaluate_reply,
    check_training_reply,
    decoded_arrays,
    norm_outliers,
    update_norm,
)
from fedunlearn.store.run_directory import REFUSALS_LOG
from server.federation.members import FederationMembers

# The query errors and source check moved to server.federation.queries; the scrubbing plug-in still imports
# them from here.
from server.federation.queries import BadReplyError, QueryFailedError, check_sources  # noqa: F401
from server.progress import Log


def _decoded_into(received: dict, arrays: ArrayRecord):
    """(name, NumPy array) of each array (:func:`~fedunlearn.reply_checks.decoded_arrays`),
    decoded once and kept in ``received``; lazily, so that a reply the cheap checks refuse is
    never decoded."""
    received.update(decoded_arrays(arrays))
    yield from received.items()


class ReplyScreen:
    """Checks replies against what was sent and what each node declared at discovery.

    Parameters
    ----------
    members : FederationMembers
        The node bound to each partition and the N_k it declared; dropped partitions are added to
        ``members.dropped``.
    max_refusals : int
        A node refused this many screened rounds in a row is dropped.
    log : Log
        Progress lines.
    run : RunDirectory, optional
        Where ``refused_replies.jsonl`` goes.
    max_update_ratio : float, optional
        A training reply whose update's norm is over this many times the median of the round's
        other updates is refused (``max-update-ratio``; default, or 0: no bound).
    """

    def __init__(
        self,
        members: FederationMembers,
        *,
        max_refusals: int,
        log: Log = print,
        run=None,
        max_update_ratio: float = math.inf,
    ) -> None:
        self.members = members
        self.max_refusals = max_refusals
        self.max_update_ratio = math.inf if max_update_ratio == 0 else max_update_ratio
        self.log = log
        self.run = run
        self.in_a_row: dict[int, int] = {}
        self.refused = 0
        #: refused replies by client (partition), over the run so far
        self.refused_clients: dict[int, int] = {}
        #: The last screened round's refused nodes, and those of them refused for a non-finite
        #: value (every one of them: the model sent diverged in the clients' training).
        self.last_refused: set[int] = set()
        self.last_non_finite: set[int] = set()
        self.seconds = 0.0

    # ------------------------------------------------------------------ sending
    def active(self, messages: Iterable[Message]) -> list[Message]:
        """``messages`` less those addressed to dropped nodes."""
        dropped = {self.members.node_of_partition[p] for p in self.members.dropped}
        return [m for m in messages if m.metadata.dst_node_id not in dropped]

    # ------------------------------------------------------------------ screening
    def training(
        self, phase: str, server_round: int, sent: ArrayRecord, replies: Iterable[Message]
    ) -> list[Message]:
        """The replies (``train`` or ``train.calibrate``) that pass every check; error replies
        (a failed client, not a hostile one) are left out without counting as refusals."""
        check, outliers = self._training_checks(sent)
        return self._screen(phase, server_round, replies, check, outliers)

    @property
    def screens_each_reply_alone(self) -> bool:
        """Whether every check of a training reply reads that reply alone (no ``max-update-ratio``,
        which compares it with the round's other updates): what a round folding each reply as it
        arrives needs (:meth:`training_screening`)."""
        return math.isinf(self.max_update_ratio)

    def training_screening(self, phase: str, server_round: int, sent: ArrayRecord) -> Screening:
        """One round's screening of training replies, a reply at a time as they arrive; the
        ``max-update-ratio`` check, which compares each update with the round's others, refuses
        at :meth:`Screening.close` (unless :attr:`screens_each_reply_alone`)."""
        check, outliers = self._training_checks(sent)
        return Screening(self, phase, server_round, check, outliers)

    def _training_checks(self, sent: ArrayRecord):
        """``check(reply, partition)`` of one training reply, and ``outliers()``: the round's
        senders whose update norm is over ``max-update-ratio`` times the others' median."""
        spec = {name: (tuple(array.shape), array.dtype) for name, array in sent.items()}
        sent_arrays, norms = decoded_arrays(sent), {}

        def check(reply: Message, partition: int) -> dict:
            arrays, received = self._records(reply, arrays=True), {}
            check_training_reply(
                spec,
                {name: (tuple(a.shape), a.dtype) for name, a in arrays.items()},
                reply.content["metrics"],
                partition=partition,
                declared_examples=self.members.num_examples[partition],
                arrays=_decoded_into(received, arrays),
            )
            norm = update_norm(received, sent_arrays)
            if not math.isfinite(norm):  # finite values of 3e38 overflow: refused, bound or not
                raise RefusedReply("its update's norm overflows")
            norms[reply.metadata.src_node_id] = norm
            return received  # decoded once: what a folded round adds up

        def outliers() -> dict[int, str]:
            return norm_outliers(norms, self.max_update_ratio)

        return check, outliers

    def evaluation(self, server_round: int, replies: Iterable[Message]) -> list[Message]:
        """The ``evaluate`` replies that pass every check."""

        def check(reply: Message, partition: int) -> None:
            self._records(reply, arrays=False)
            check_evaluate_reply(
                reply.content["metrics"],
                partition=partition,
                declared_examples=self.members.num_examples[partition],
            )

        return self._screen("evaluate", server_round, replies, check)

    def _screen(self, phase, server_round, replies, check, outliers=None) -> list[Message]:
        """The non-error replies ``check(reply, partition)`` accepts and that ``outliers()``
        (the round's senders to refuse, with why) does not name; the others are refused."""
        screening = Screening(self, phase, server_round, check, outliers)
        kept = [r for r in replies if not r.has_error() and screening.accept(r) is not None]
        refused = screening.close()
        return [r for r in kept if r.metadata.src_node_id not in refused]

    # ------------------------------------------------------------------ internals
    def _partition(self, node: int) -> int:
        partition = self.members.partition_of(node)
        if partition is None:
            raise RefusedReply("the node is not a member of this run's federation")
        if partition in self.members.dropped:
            raise RefusedReply("the node was dropped from the run")
        return partition

    @staticmethod
    def _records(reply: Message, *, arrays: bool):
        """The reply's one ArrayRecord ``arrays`` (when ``arrays``) and one MetricRecord
        ``metrics``, and nothing else."""
        content = reply.content
        expected = {"arrays", "metrics"} if arrays else {"metrics"}
        found = set(content.keys())
        if found != expected or "metrics" not in content.metric_records:
            raise RefusedReply(f"records {sorted(found)}, expected {sorted(expected)}")
        if arrays:
            if "arrays" not in content.array_records:
                raise RefusedReply("'arrays' is not an ArrayRecord")
            return content["arrays"]
        return None

    def _refuse(self, phase: str, server_round: int, node: int, reason: str) -> None:
        self.refused += 1
        partition = self.members.partition_of(node)
        if partition is not None:
            self.refused_clients[partition] = self.refused_clients.get(partition, 0) + 1
        self.log(
            f"refused the {phase} reply of node {node} (client {partition}) in round "
            f"{server_round}: {reason}"
        )
        self._record(phase, server_round, node, reason=reason)

    def _account(self, phase: str, server_round: int, answered: set[int], refused: set[int]):
        """Count refusals in a row per node; drop a node that reached ``max_refusals``."""
        for node in answered:
            self.in_a_row[node] = 0
        for node in refused:
            self.in_a_row[node] = self.in_a_row.get(node, 0) + 1
            partition = self.members.partition_of(node)
            if (
                partition is not None
                and partition not in self.members.dropped
                and self.in_a_row[node] >= self.max_refusals
            ):
                reason = (
                    f"{self.in_a_row[node]} refused replies in a row (max-refusals="
                    f"{self.max_refusals}), the last in {phase} round {server_round}"
                )
                self.members.dropped[partition] = reason
                self.log(f"dropped node {node} (client {partition}) from the run: {reason}")
                self._record(phase, server_round, node, dropped=reason)

    def _record(self, phase: str, server_round: int, node: int, **what: str) -> None:
        """One line of ``refused_replies.jsonl``: a refusal (``reason``) or a drop (``dropped``)."""
        if self.run is not None:
            self.run.append_log(
                REFUSALS_LOG,
                {
                    "phase": phase,
                    "round": server_round,
                    "node": node,
                    "client": self.members.partition_of(node),
                    **what,
                },
            )


class Screening:
    """One round of one phase screened reply by reply (:meth:`ReplyScreen.training_screening`):
    :meth:`accept` checks a reply as it arrives, :meth:`close` ends the round (its cross-reply
    checks, the refusals in a row, the dropped nodes)."""

    def __init__(
        self, screen: ReplyScreen, phase: str, server_round: int, check, outliers=None
    ) -> None:
        self.screen, self.phase, self.round, self.check = screen, phase, server_round, check
        self.outliers = outliers
        #: The last accepted training reply's arrays, decoded by the checks (name -> NumPy, in
        #: the reply's order), for the caller that folds it; None for other replies.
        self.decoded: dict | None = None
        self.accepted: set[int] = set()
        self.refused: set[int] = set()
        self.non_finite: set[int] = set()

    def accept(self, reply: Message) -> int | None:
        """The partition of a reply that passes every check; None for a refused one (logged and
        counted). Error replies are the caller's: they are not screened."""
        started = time.perf_counter()
        node, self.decoded = reply.metadata.src_node_id, None
        try:
            partition = self.screen._partition(node)
            decoded = self.check(reply, partition)
        except RefusedReply as refusal:
            self.screen._refuse(self.phase, self.round, node, refusal.reason)
            self.refused.add(node)
            if isinstance(refusal, NonFiniteReply):
                self.non_finite.add(node)
            return None
        finally:
            self.screen.seconds += time.perf_counter() - started
        self.accepted.add(node)
        self.decoded = decoded
        return partition

    def refuse(self, node: int, reason: str) -> None:
        """Refuse ``node``'s reply without checking it (logged and counted)."""
        self.screen._refuse(self.phase, self.round, node, reason)
        self.refused.add(node)
        self.accepted.discard(node)

    def close(self) -> set[int]:
        """End the round: refuse what ``outliers()`` names, count refusals in a row; returns
        every node refused this round."""
        started = time.perf_counter()
        for node, reason in (self.outliers() if self.outliers else {}).items():
            self.screen._refuse(self.phase, self.round, node, reason)
            self.refused.add(node)
        self.screen.last_refused, self.screen.last_non_finite = self.refused, self.non_finite
        self.screen._account(self.phase, self.round, self.accepted - self.refused, self.refused)
        self.screen.seconds += time.perf_counter() - started
        return set(self.refused)
