"""Test grids: one whose nodes answer at once, for tests that stand in for a federation without
Ray, and a spy that records what Flower's real grid sends and who answered.

The server sends through ``push_messages`` / ``pull_messages`` (:mod:`server.federation.queries`); a fake
grid subclasses :class:`AnsweringGrid` and says, in ``answer``, what a node replies to a message
(or ``None`` for a node that never answers).
"""

from __future__ import annotations

from uuid import uuid4


def stamp(metadata, **fields) -> None:
    """Set ``fields`` (``message_id``, ``src_node_id``, ``reply_to_message_id``) on a message's
    metadata: on Flower's ``Metadata`` as its grids do (the fields are read-only properties), on a
    test's stand-in by attribute."""
    from flwr.app import Metadata

    for name, value in fields.items():
        if isinstance(metadata, Metadata):
            metadata.__dict__[f"_{name}"] = value
        else:
            setattr(metadata, name, value)


class AnsweringGrid:
    """``push_messages`` answers each message with ``answer(message)`` right away; the next
    ``pull_messages`` hands the replies over."""

    def answer(self, message):
        raise NotImplementedError

    def push_messages(self, messages):
        if not hasattr(self, "_replies"):
            self._replies = {}
        ids = []
        for message in messages:
            message_id = str(uuid4())
            stamp(message.metadata, message_id=message_id)  # as Flower's grid does on push
            reply = self.answer(message)
            if reply is not None:
                stamp(reply.metadata, reply_to_message_id=message_id)
                self._replies[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = getattr(self, "_replies", {})
        return [replies.pop(i) for i in list(message_ids) if i in replies]


class DelegatingGrid:
    """Flower's grid, every call passed on; a test's grid overrides what it watches or breaks."""

    def __init__(self, grid):
        self._grid = grid

    def get_node_ids(self):
        return self._grid.get_node_ids()

    def push_messages(self, messages):
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self._grid.pull_messages(message_ids)


class SpyGrid(DelegatingGrid):
    """Delegates to Flower's grid; records every message sent as (phase, destination node, message
    type), with ``phase`` set by the test, and which partition each node holds (from the
    ``partition-id`` its replies carry)."""

    def __init__(self, grid):
        super().__init__(grid)
        self.phase, self.sent, self.partition_of = "training", [], {}
        self.objectives = []  # (phase, node, the training message's objective or None), in order

    def push_messages(self, messages):
        messages = list(messages)
        self.sent += [
            (self.phase, m.metadata.dst_node_id, m.metadata.message_type) for m in messages
        ]
        self.objectives += [(self.phase, m.metadata.dst_node_id, _objective(m)) for m in messages]
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):
        replies = list(self._grid.pull_messages(message_ids))
        for reply in replies:
            if not reply.has_error() and "metrics" in reply.content.metric_records:
                metrics = reply.content["metrics"]
                if "partition-id" in metrics:
                    self.partition_of[reply.metadata.src_node_id] = int(metrics["partition-id"])
        return replies


def _objective(message):
    """A training message's ``objective`` (``"train"`` when it names none); None for others."""
    if "config" not in message.content.config_records:
        return None
    return str(message.content["config"].get("objective", "train"))


def shorten(content, key: str | None = None) -> None:
    """Cut ``content``'s ``stats`` array ``key`` (the first when None) 8 bytes short; its declared
    shape and dtype stay truthful, so it does not decode."""
    from flwr.app import Array, ArrayRecord

    arrays = dict(content["stats"].items())
    key = key if key is not None else next(iter(arrays))
    whole = arrays[key]
    arrays[key] = Array(
        dtype=whole.dtype, shape=tuple(whole.shape), stype=whole.stype, data=whole.data[:-8]
    )
    content["stats"] = ArrayRecord(arrays)


def cut_short(key: str, node: int):
    """A tamper for an :class:`AnsweringGrid` test: ``node``'s ``stats`` array ``key`` declares its
    shape and dtype truthfully, but its bytes are 8 short (it does not decode)."""

    def tamper(sender: int, content) -> None:
        if sender == node:
            shorten(content, key)

    return tamper
