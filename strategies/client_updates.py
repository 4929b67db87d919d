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
    ) -> None:
        self.send = send
        self.node_of_partition = dict(node_of_partition)
        self.message_type, self.epochs, self.phase = message_type, epochs, phase
        self.train_config = dict(train_config or {})
        self.screen = screen
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
        replies = list(self.send(messages, label=f"{self.phase}, round {server_round}"))
        unanswered = set(nodes) - {r.metadata.src_node_id for r in replies}
        if unanswered:
            logger.warning(
                "%s of round %d: no reply in time from node(s) %s",
                self.phase,
                server_round,
                sorted(unanswered),
            )
        if self.screen is not None:
            failed = [r for r in replies if r.has_error()]
            replies = failed + self.screen(self.phase, server_round, sent, replies)
        return self._updates(server_round, model, nodes, replies)

    def _nodes(self, server_round: int, clients: list[int]) -> dict[int, int]:
        """node -> partition of the clients to ask (dropped ones left out, forgotten refused)."""
        left_out = [k for k in clients if self.is_dropped(k)]
        if left_out:
            logger.warning(
                "%s of round %d: dropped client(s) %s left out", self.phase, server_round, left_out
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
                logger.warning(
                    "%s of round %d: node %d failed: %s",
                    self.phase,
                    server_round,
                    reply.metadata.src_node_id,
                    reply.error.reason,
                )
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
