"""Asking the remaining clients to train from a model the server sends, and reading their updates.

FedEraser's calibration (``train.calibrate``, E_cali epochs) and the exact updates of FedRecover
and Crab (``train``, E_loc epochs, the batches of the original round) are the same exchange: send
M̃ to the clients' nodes with ``local-epochs`` and ``server-round``, screen the replies, and turn
each client model M̂_k into the update Û_k = M̂_k − M̃. A forgotten client's node is never
addressed; a reply for a client that was not asked is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedunlearn.training.model_state import state_difference
from fedunlearn.training.streaming import Contribution, ReorderBuffer

logger = logging.getLogger(__name__)

#: ``send(messages, label=...) -> replies``: :func:`server.federation.queries.collect_replies` bound to a grid.
Send = Callable[..., Iterable[Message]]
#: ``screen(phase, round, sent_arrays, replies) -> valid replies`` (the run's reply screen).
Screen = Callable[[str, int, ArrayRecord, list[Message]], list[Message]]


class ClientUpdates:
    """``updates(server_round, model, clients) -> {client: Û_k}`` for one kind of request.

    Parameters
    ----------
    send : callable
        How the messages reach the clients (see :data:`Send`).
    node_of_partition : Mapping[int, int]
        Node id of each client's partition id.
    message_type : str
        ``"train"`` or ``"train.calibrate"``.
    epochs : int
        ``local-epochs`` each client trains.
    train_config : Mapping, optional
        Client SGD settings sent with each request (``lr``, ``batch-size`` ...).
    phase : str
        Names the requests in logs and in the reply screen's records.
    screen, is_dropped : callable, optional
        The run's reply screen; ``is_dropped(partition)`` for clients dropped from the run.
    screening : callable, optional
        ``screening(phase, round, sent) -> Screening``: the run's screen a reply at a time
        (``ReplyScreen.training_screening``), what :meth:`stream` needs to fold replies as they
        come.
    """

    def __init__(
        self,
        send: Send,
        node_of_partition: Mapping[int, int],
        *,
        message_type: str,
        epochs: int,
        train_config: Mapping[str, int | float | str] | None = None,
        phase: str = "calibrate",
        screen: Screen | None = None,
        is_dropped: Callable[[int], bool] | None = None,
        screening: Callable | None = None,
    ) -> None:
        self.send = send
        self.node_of_partition = dict(node_of_partition)
        self.message_type, self.epochs, self.phase = message_type, epochs, phase
        self.train_config = dict(train_config or {})
        self.screen = screen
        self.screening = screening
        self.is_dropped = is_dropped or (lambda _partition: False)
        self.forbidden_nodes: frozenset[int] = frozenset()
        self.requests = 0  # (round, client) pairs asked

    def forbid(self, partitions: Collection[int]) -> None:
        """Never address these clients' nodes (the forgotten clients)."""
        self.forbidden_nodes = frozenset(
            self.node_of_partition[p] for p in partitions if p in self.node_of_partition
        )

    def __call__(
        self,
        server_round: int,
        model: dict[str, torch.Tensor],
        clients: list[int],
        attachments: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Send ``model`` to ``clients`` and return their updates Û_k = M̂_k − M̃; each
        ``attachments`` state travels beside it under its name (PGA's anchor)."""
        nodes = self._nodes(server_round, clients)
        sent, messages = self._messages(server_round, model, nodes, attachments)
        replies = list(self.send(messages, label=f"{self.phase}, round {server_round}"))
        self._warn_unanswered(server_round, nodes, {r.metadata.src_node_id for r in replies})
        if self.screen is not None:
            failed = [r for r in replies if r.has_error()]
            replies = failed + self.screen(self.phase, server_round, sent, replies)
        return self._updates(server_round, model, nodes, replies)

    def stream(
        self,
        server_round: int,
        model: dict[str, torch.Tensor],
        clients: list[int],
        fold: Callable[[int, dict[str, torch.Tensor]], None],
    ) -> None:
        """:meth:`__call__` reply by reply: ``fold(client, Û_k)`` in ascending client order as the
        replies come (:class:`~fedunlearn.training.streaming.ReorderBuffer`: 64 wait in memory,
        the rest on disk), each screened as it arrives; with ``max-update-ratio`` every reply
        waits for the round's end, when the outliers are known. Without ``screening`` (a run
        without a reply screen) the replies are collected first."""
        if self.screening is None:
            for client, update in sorted(self(server_round, model, clients).items()):
                fold(client, update)
            return
        nodes = self._nodes(server_round, clients)
        sent, messages = self._messages(server_round, model, nodes, None)
        screening = self.screening(self.phase, server_round, sent)
        buffer = ReorderBuffer(nodes.values(), gated=not screening.screen.screens_each_reply_alone)
        answered: set[int] = set()

        def hand_over(ready) -> None:
            for contribution in ready:
                client_model = {n: torch.from_numpy(a) for n, a in contribution.arrays}
                fold(contribution.key, state_difference(client_model, model))

        def on_reply(reply: Message) -> None:
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                self._warn_failed(server_round, reply)
            elif node in nodes and buffer.waits_for(nodes[node]):
                if screening.accept(reply) is None:
                    hand_over(buffer.absent(nodes[node]))
                else:
                    arrays = list(screening.decoded.items())  # decoded once, by the screen
                    hand_over(buffer.put(Contribution(nodes[node], arrays, 1)))
            else:
                screening.refuse(node, f"no {self.phase} reply of this node is expected")

        try:
            label = f"{self.phase}, round {server_round}"
            self.send(messages, label=label, on_reply=on_reply)
            self._warn_unanswered(server_round, nodes, answered)
            for node in screening.close() & screening.accepted:  # outliers, known at the end
                buffer.withdraw(nodes[node])
            hand_over(buffer.close())
        finally:
            buffer.discard()

    def _messages(self, server_round, model, nodes, attachments):
        """The model sent (an ArrayRecord) and one message per node."""
        config = ConfigRecord(
            {**self.train_config, "local-epochs": self.epochs, "server-round": server_round}
        )
        sent = ArrayRecord(model)
        extra = {name: ArrayRecord(dict(state)) for name, state in (attachments or {}).items()}
        content = RecordDict({"arrays": sent, "config": config, **extra})
        messages = [
            Message(content=content, dst_node_id=node, message_type=self.message_type)
            for node in nodes
        ]
        self.requests += len(messages)
        return sent, messages

    def _warn_unanswered(self, server_round: int, nodes, answered: set[int]) -> None:
        unanswered = set(nodes) - answered
        if unanswered:
            logger.warning(
                "%s of round %d: no reply in time from node(s) %s",
                self.phase,
                server_round,
                sorted(unanswered),
            )

    def _warn_failed(self, server_round: int, reply: Message) -> None:
        logger.warning(
            "%s of round %d: node %d failed: %s",
            self.phase,
            server_round,
            reply.metadata.src_node_id,
            reply.error.reason,
        )

    def _nodes(self, server_round: int, clients: list[int]) -> dict[int, int]:
        """node -> partition of the clients to ask (dropped ones left out, forgotten refused)."""
        left_out = [k for k in clients if self.is_dropped(k)]
        if left_out:
            logger.warning(
                "%s of round %d: client(s) %s dropped from the run or offline, left out",
                self.phase,
                server_round,
                left_out,
            )
        clients = [k for k in clients if k not in left_out]
        missing = [k for k in clients if k not in self.node_of_partition]
        if missing:
            raise RuntimeError(
                f"no node is known for client(s) {missing}; are they still connected?"
            )
        nodes = {self.node_of_partition[k]: k for k in clients}
        forbidden = self.forbidden_nodes & set(nodes)
        if forbidden:  # no method asks this; refuse rather than leak the target
            raise RuntimeError(f"refusing to message forgotten clients' nodes {sorted(forbidden)}")
        return nodes

    def _updates(self, server_round, model, nodes, replies) -> dict[int, dict[str, torch.Tensor]]:
        updates: dict[int, dict[str, torch.Tensor]] = {}
        for reply in replies:
            if reply.has_error():
                self._warn_failed(server_round, reply)
                continue
            partition_id = int(reply.content["metrics"]["partition-id"])
            if nodes.get(reply.metadata.src_node_id) != partition_id:
                raise RuntimeError(
                    f"node {reply.metadata.src_node_id} answered for client {partition_id}, "
                    f"which it was not asked to train ({self.phase})"
                )
            client_model = reply.content["arrays"].to_torch_state_dict()
            updates[partition_id] = state_difference(client_model, model)
        return updates
