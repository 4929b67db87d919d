"""What a phase costs the federation: client computation and communication, metered at the grid.

Every message the server sends goes through its grid (:mod:`server.federation.queries`), so wrapping the grid
(:class:`MeteredGrid`) measures every method alike, whatever its code does: the bytes of the arrays
sent to and received from clients, and the client-epochs of training asked for (a training or
calibration message asks its client for ``local-epochs`` passes over its data). Recovery methods
are compared by these figures (FedRecover, Cao et al. 2023, Section 6: the clients' computation
saved relative to train-from-scratch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from flwr.app import Message


@dataclass
class Cost:
    """A phase's cost: client-epochs of training asked for, training messages sent, and bytes of
    arrays sent to and received from clients (as serialized in the messages)."""

    client_epochs: float = 0.0
    train_messages: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def as_row(self) -> dict[str, float]:
        return asdict(self)


def array_bytes(message: Message) -> int:
    """Bytes of the arrays a message carries (serialized, as on the wire)."""
    if message.has_error():
        return 0
    return sum(
        len(array.data)
        for record in message.content.array_records.values()
        for array in record.values()
    )


def training_epochs(message: Message) -> float:
    """The client-epochs a message asks for: ``local-epochs`` of a training message, else 0."""
    if not message.metadata.message_type.startswith("train"):
        return 0.0
    configs = message.content.config_records
    config = configs.get("config")
    if config is None or "local-epochs" not in config:
        return 0.0
    return float(config["local-epochs"])


class MeteredGrid:
    """A grid that counts what passes through it into ``cost``; everything else is the grid's."""

    def __init__(self, grid, cost: Cost | None = None) -> None:
        self._grid = grid
        self.cost = cost if cost is not None else Cost()

    def push_messages(self, messages: Iterable[Message]):
        messages = self._sent(messages)
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self._received(self._grid.pull_messages(message_ids))

    def send_and_receive(self, messages, *, timeout=None):
        messages = self._sent(messages)
        return self._received(self._grid.send_and_receive(messages, timeout=timeout))

    def _sent(self, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        for message in messages:
            epochs = training_epochs(message)
            self.cost.client_epochs += epochs
            self.cost.train_messages += int(epochs > 0)
            self.cost.bytes_sent += array_bytes(message)
        return messages

    def _received(self, replies) -> list[Message]:
        replies = list(replies)
        self.cost.bytes_received += sum(array_bytes(reply) for reply in replies)
        return replies

    def __getattr__(self, name: str):
        return getattr(self._grid, name)
