"""FedEraser on Flower: the remaining clients calibrate, the server rescales retained updates.

Liu et al., *FedEraser* (IWQoS 2021), Algorithm 1. The math is :func:`fedunlearn.unlearning.federaser.federaser`;
this module only moves records: for each retained round t_j after the first it sends the calibrated
model M̃^{t_j} to the remaining clients' nodes as ``train.calibrate`` messages with
``local-epochs`` = E_cali = ⌈r·E_loc⌉ and ``server-round`` = t_j, and turns each reply M̂_k into the
calibration update Û_k = M̂_k − M̃^{t_j}. A target client is never addressed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.model_state import state_difference
from fedunlearn.unlearning.federaser import (
    Reconstruction,
    ReconstructionStep,
    calibration_epochs,
    federaser,
)

logger = logging.getLogger(__name__)

CALIBRATE = "train.calibrate"

#: ``send(messages, label=...) -> replies``: how FedEraser reaches the clients (see ``FedEraser``).
Send = Callable[..., Iterable[Message]]


class FedEraser:
    """Client-level unlearning by calibrated reconstruction from retained updates.

    Parameters
    ----------
    send : callable
        ``send(messages, label=...) -> replies``: sends the calibration messages and returns the
        replies that arrived in time (the server passes :func:`server.queries.collect_replies`
        bound to its grid, ``reply-timeout`` and console, which logs a heartbeat under ``label``).
    node_of_partition : Mapping[int, int]
        Node id of each client's partition id (see :func:`server.federation.discover_clients`).
    local_epochs : int
        E_loc of the original training.
    calibration_ratio : float (default: 0.5)
        r; the clients train E_cali = ⌈r·E_loc⌉ epochs per calibration.
    train_config : Mapping, optional
        Client SGD settings sent with each calibration (``lr``, ``batch-size``, ``momentum`` ...).
    layerwise : bool (default: True)
        Eq. (2)'s norms per parameter tensor, or over the whole vector.
    calibration_order : str (default: "client")
        ``client``: calibrate each client's update, then aggregate (the paper's eq. 2-3);
        ``average``: aggregate, then calibrate the average (the paper's released code).
    screen : callable, optional
        ``screen(phase, round, sent_arrays, replies) -> valid replies``: checks every calibration
        reply before it is used (``server.reply_screening.ReplyScreen.training``); a refused reply
        leaves its client out of that step.
    is_dropped : callable, optional
        ``is_dropped(partition)``: clients dropped from the run are not asked to calibrate.
    """

    def __init__(
        self,
        send: Send,
        node_of_partition: Mapping[int, int],
        *,
        local_epochs: int,
        calibration_ratio: float = 0.5,
        train_config: Mapping[str, int | float] | None = None,
        layerwise: bool = True,
        calibration_order: str = "client",
        screen: Callable[[str, int, ArrayRecord, list[Message]], list[Message]] | None = None,
        is_dropped: Callable[[int], bool] | None = None,
    ) -> None:
        self.send = send
        self.node_of_partition = dict(node_of_partition)
        self.calibration_epochs = calibration_epochs(local_epochs, calibration_ratio)
        self.calibration_ratio = calibration_ratio
        self.train_config = dict(train_config or {})
        self.layerwise = layerwise
        self.calibration_order = calibration_order
        self.screen = screen
        self.is_dropped = is_dropped or (lambda _partition: False)
        self._forbidden_nodes: frozenset[int] = frozenset()

    def unlearn(
        self,
        store: UpdateStore,
        targets: Collection[int],
        *,
        scaled_keys: Collection[str] | None = None,
        progress: Callable[[ReconstructionStep], None] | None = None,
        trajectory: UpdateStore | None = None,
    ) -> Reconstruction:
        """The global model rebuilt without ``targets`` (partition ids); ``trajectory`` receives
        the reconstruction's own history (:func:`fedunlearn.unlearning.federaser.federaser`)."""
        self._forbidden_nodes = frozenset(
            self.node_of_partition[t] for t in targets if t in self.node_of_partition
        )
        try:
            return federaser(
                store,
                targets,
                self.calibrate,
                layerwise=self.layerwise,
                scaled_keys=scaled_keys,
                calibration_order=self.calibration_order,
                progress=progress,
                trajectory=trajectory,
            )
        finally:
            self._forbidden_nodes = frozenset()

    def calibrate(
        self, retained_round: int, model: dict[str, torch.Tensor], clients: list[int]
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Send ``train.calibrate`` to ``clients`` and return their updates Û_k = M̂_k − M̃."""
        left_out = [k for k in clients if self.is_dropped(k)]
        if left_out:
            logger.warning("calibration of round %d: dropped client(s) %s left out", retained_round, left_out)
        clients = [k for k in clients if k not in left_out]
        missing = [k for k in clients if k not in self.node_of_partition]
        if missing:
            raise RuntimeError(
                f"no node is known for client(s) {missing}; are they still connected?"
            )
        nodes = {self.node_of_partition[k]: k for k in clients}
        forbidden = self._forbidden_nodes & set(nodes)
        if forbidden:  # the reconstruction never asks this; refuse rather than leak the target
            raise RuntimeError(f"refusing to message forgotten clients' nodes {sorted(forbidden)}")
        config = ConfigRecord(
            {
                **self.train_config,
                "local-epochs": self.calibration_epochs,
                "server-round": retained_round,
            }
        )
        sent = ArrayRecord(model)
        content = RecordDict({"arrays": sent, "config": config})
        messages = [
            Message(content=content, dst_node_id=node, message_type=CALIBRATE) for node in nodes
        ]
        replies = list(self.send(messages, label=f"federaser calibration, round {retained_round}"))
        unanswered = set(nodes) - {r.metadata.src_node_id for r in replies}
        if unanswered:
            logger.warning(
                "calibration of round %d: no reply in time from node(s) %s",
                retained_round,
                sorted(unanswered),
            )
        if self.screen is not None:
            failed = [r for r in replies if r.has_error()]
            replies = failed + self.screen("calibrate", retained_round, sent, replies)
        updates: dict[int, dict[str, torch.Tensor]] = {}
        for reply in replies:
            if reply.has_error():
                logger.warning(
                    "calibration of round %d: node %d failed: %s",
                    retained_round,
                    reply.metadata.src_node_id,
                    reply.error.reason,
                )
                continue
            partition_id = int(reply.content["metrics"]["partition-id"])
            if nodes.get(reply.metadata.src_node_id) != partition_id:
                raise RuntimeError(
                    f"node {reply.metadata.src_node_id} answered for client {partition_id}, "
                    f"which it was not asked to calibrate"
                )
            client_model = reply.content["arrays"].to_torch_state_dict()
            updates[partition_id] = state_difference(client_model, model)
        return updates
