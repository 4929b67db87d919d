"""One retained round as read from the update store (:meth:`UpdateStore.read_round`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RetainedRound:
    """One retained round: the global model M^t and the selected clients' updates U_k^t.

    A client kept as norms only (``retain-mode = norms``) has ``num_examples`` and ``squares`` but
    no entry in ``updates``; a round that kept no global model has ``global_model = None``."""

    round: int
    global_model: dict[str, torch.Tensor] | None
    updates: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    num_examples: dict[int, int] = field(default_factory=dict)
    #: Per client and floating tensor, the squared norm ‖U_k^t[tensor]‖² the store recorded for the
    #: update: computed from the stored values, or given by the writer (a rewritten history keeps
    #: the norms of the updates it replaces, which is all FedEraser's eq. 2 reads of them).
    squares: dict[int, dict[str, float]] = field(default_factory=dict)
    #: Clients with a whole update in the store that was not read (``read_round(blobs="none")``).
    unread: set[int] = field(default_factory=set)

    @property
    def clients(self) -> list[int]:
        """Clients this round kept (an update, or its norms), ascending."""
        return sorted(self.num_examples)

    @property
    def norms_only(self) -> list[int]:
        """Clients of which this round kept only the norms, ascending."""
        return sorted(set(self.num_examples) - set(self.updates) - self.unread)
