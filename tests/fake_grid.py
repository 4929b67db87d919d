"""A grid whose nodes answer at once, for tests that stand in for a federation without Ray.

The server sends through ``push_messages`` / ``pull_messages`` (:mod:`server.queries`); a fake
grid subclasses :class:`AnsweringGrid` and says, in ``answer``, what a node replies to a message
(or ``None`` for a node that never answers).
"""

from __future__ import annotations

from uuid import uuid4


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
            reply = self.answer(message)
            if reply is not None:
                reply.metadata.reply_to_message_id = message_id
                self._replies[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        replies = getattr(self, "_replies", {})
        return [replies.pop(i) for i in list(message_ids) if i in replies]
