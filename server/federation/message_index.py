"""Flower's simulation engine hands out a message in time independent of K: instruction messages
indexed by their destination node.

Flower's simulation runtime (``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``)
asks its in-memory link state, every 0.1 s, for the next message of *each* of the K nodes, and
``InMemoryLinkState.get_message_ins`` answers by scanning every instruction message the state holds
(each with an expiry and federation check). A sweep therefore costs K x M checks for M messages in
flight: at K = 100,000 nodes and a round of 1,000 messages, 10^8 checks (minutes) per sweep, in
the process and under the GIL of the ServerApp; discovery, which asks all K nodes at once, K^2.

:func:`use_message_index` replaces, on the class, ``store_message_ins`` (which then also records
each stored message under its destination node) and ``get_message_ins`` (which looks only at the
node's own messages: a dict lookup for a node with none). A node is answered with the same messages
as before, in the same order; what changes is that the expiry check of a message happens when its
own node asks (or when its reply is pulled), no longer as a side effect of another node's question.
The index of a state whose messages were stored before the patch is built from its store on first
use. The ServerApp calls it in its own process, which in a simulation is the runtime's.
"""

from __future__ import annotations

import threading

from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now

#: The instance attribute holding ``{node_id: {message_id: None}}`` (insertion-ordered).
INDEX_ATTRIBUTE = "_fedunlearn_messages_by_node"
#: Flower's own methods, as this module found them.
FLOWER_STORE_MESSAGE_INS = InMemoryLinkState.store_message_ins
FLOWER_GET_MESSAGE_INS = InMemoryLinkState.get_message_ins
_PATCH_LOCK = threading.Lock()


def use_message_index() -> bool:
    """Index ``InMemoryLinkState``'s instruction messages by destination node (once per process);
    True when this call installed it."""
    with _PATCH_LOCK:
        if InMemoryLinkState.get_message_ins is get_message_ins_indexed:
            return False
        InMemoryLinkState.store_message_ins = store_message_ins_indexed
        InMemoryLinkState.get_message_ins = get_message_ins_indexed
        return True


def _index(state: InMemoryLinkState) -> dict[int, dict[str, None]]:
    """The state's index, built from its store the first time (call with ``state.lock`` held)."""
    index = state.__dict__.get(INDEX_ATTRIBUTE)
    if index is None:
        index = {}
        for message_id, message in list(state.message_ins_store.items()):
            index.setdefault(message.metadata.dst_node_id, {})[message_id] = None
        state.__dict__[INDEX_ATTRIBUTE] = index
    return index


def store_message_ins_indexed(self: InMemoryLinkState, message):
    """Flower's ``store_message_ins``, the message then recorded under its destination node."""
    with self.lock:
        message_id = FLOWER_STORE_MESSAGE_INS(self, message)
        if message_id is not None:
            node = message.metadata.dst_node_id
            _index(self).setdefault(node, {})[message_id] = None
    return message_id


def get_message_ins_indexed(self: InMemoryLinkState, node_id: int, limit, *, run_id=None):
    """``get_message_ins`` over the node's own messages only (see the module docstring)."""
    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    index = self.__dict__.get(INDEX_ATTRIBUTE)
    if index is not None and node_id not in index:  # the sweep's common case, without the lock
        return []
    found = []
    with self.lock:
        index = _index(self)
        pending = index.get(node_id, {})
        for message_id in list(pending):
            self._check_stored_messages({message_id})
            message = self.message_ins_store.get(message_id)
            if message is None:  # replied and deleted, or expired
                del pending[message_id]
                continue
            if (run_id is None or message.metadata.run_id == run_id) and (
                message.metadata.delivered_at == ""
            ):
                found.append(message)
            if limit and len(found) == limit:
                break
        if not pending:
            index.pop(node_id, None)
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found
