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
from flwr.app import ArrayRecord, Message

from fedunlearn.messages import CALIBRATE
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.calibration_top_up import TopUp
from fedunlearn.unlearning.federaser import (
    Reconstruction,
    ReconstructionStep,
    calibration_epochs,
    federaser,
)
from strategies.client_updates import ClientUpdates

logger = logging.getLogger(__name__)

#: ``send(messages, label=...) -> replies``: how FedEraser reaches the clients (see ``FedEraser``).
Send = Callable[..., Iterable[Message]]


class FedEraser:
    """Client-level unlearning by calibrated reconstruction from retained updates.

    Parameters
    ----------
    send : callable
        ``send(messages, label=...) -> replies``: sends the calibration messages and returns the
        replies that arrived in time (the server passes :func:`server.federation.queries.collect_replies`
        bound to its grid, ``reply-timeout`` and console, which logs a heartbeat under ``label``).
    node_of_partition : Mapping[int, int]
        Node id of each client's partition id (see :func:`server.federation.members.discover_clients`).
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
        reply before it is used (``server.federation.reply_screening.ReplyScreen.training``); a refused reply
        leaves its client out of that step.
    is_dropped : callable, optional
        ``is_dropped(partition)``: clients dropped from the run, or offline at the request, are not asked to calibrate.
    screening : callable, optional
        ``screening(phase, round, sent_arrays) -> Screening``: the same screen a reply at a time
        (``ReplyScreen.training_screening``); with it each calibration reply is folded into the
        step as it comes (:meth:`strategies.client_updates.ClientUpdates.stream`), and the
        server holds a few updates at a time, not one per client.
    top_up : TopUp, optional
        ``calibration-clients`` (ours, for sampled rounds): each calibrated round is calibrated by
        at least ``top_up.minimum`` remaining clients (:class:`fedunlearn.unlearning.federaser.TopUp`).
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
        screening: Callable | None = None,
        top_up: TopUp | None = None,
    ) -> None:
        self.calibration_epochs = calibration_epochs(local_epochs, calibration_ratio)
        self.calibration_ratio = calibration_ratio
        self.layerwise = layerwise
        self.calibration_order = calibration_order
        self.top_up = top_up
        self.requests = ClientUpdates(
            send,
            node_of_partition,
            message_type=CALIBRATE,
            epochs=self.calibration_epochs,
            train_config=train_config,
            phase="calibrate",
            screen=screen,
            is_dropped=is_dropped,
            screening=screening,
        )

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
        self.requests.forbid(targets)
        try:
            return federaser(
                store,
                targets,
                self.requests,
                layerwise=self.layerwise,
                scaled_keys=scaled_keys,
                calibration_order=self.calibration_order,
                progress=progress,
                trajectory=trajectory,
                top_up=self.top_up,
            )
        finally:
            self.requests.forbid(())

    def calibrate(
        self, retained_round: int, model: dict[str, torch.Tensor], clients: list[int]
    ) -> dict[int, dict[str, torch.Tensor]]:
        """Send ``train.calibrate`` to ``clients`` and return their updates Û_k = M̂_k − M̃."""
        return self.requests(retained_round, model, clients)
