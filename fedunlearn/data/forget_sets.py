"""The cohort D_f to forget, named in one string, and each client's share of it.

Golatkar et al. forget a whole class or a subset of samples; a federation adds a whole client.
A :class:`ForgetSet` is parsed from ``scrub-forget``:

* ``class:C``: every sample of class C, on every client;
* ``client:K``: all of client K's samples;
* ``samples:K:N``: N samples of client K, or ``samples:K:N:C``: N of its samples of class C.

Every party computes its own mask from the string, the run seed and its partition
(:meth:`ForgetSet.mask`), so the server never needs a client's sample ids and a client can
tell which of its samples are in D_f without asking.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed

KINDS = ("class", "client", "samples")
_FORMS = (
    "'class:C', 'client:K', 'samples:K:N' or 'samples:K:N:C' (C a class, K a client, N a count)"
)


@dataclass(frozen=True)
class ForgetSet:
    """D_f: ``kind`` is ``class``, ``client`` or ``samples`` (see the module docstring)."""

    kind: str
    label: int | None = None
    client: int | None = None
    count: int | None = None

    @classmethod
    def parse(cls, text: str, *, num_clients: int, num_classes: int | None = None) -> ForgetSet:
        """Parse ``scrub-forget``; an error names the value and the allowed forms."""
        parts = str(text).replace(" ", "").lower().split(":")
        try:
            numbers = [int(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError("scrub-forget", text, _FORMS) from None
        kind = parts[0]
        shapes = {"class": (1,), "client": (1,), "samples": (2, 3)}
        if kind not in shapes or len(numbers) not in shapes[kind]:
            raise ConfigError("scrub-forget", text, _FORMS)
        if kind == "class":
            forget = cls("class", label=numbers[0])
        elif kind == "client":
            forget = cls("client", client=numbers[0])
        else:
            label = numbers[2] if len(numbers) == 3 else None
            forget = cls("samples", client=numbers[0], count=numbers[1], label=label)
        # num_clients = 0: the federation's size is not adopted yet; the bound is checked then.
        if forget.client is not None and not 0 <= forget.client < (num_clients or 2**31):
            raise ConfigError("scrub-forget", text, f"a client id in 0..{num_clients - 1}")
        if forget.count is not None and forget.count < 1:
            raise ConfigError("scrub-forget", text, "a sample count N >= 1")
        if forget.label is not None and (
            forget.label < 0 or (num_classes is not None and forget.label >= num_classes)
        ):
            top = "" if num_classes is None else f" in 0..{num_classes - 1}"
            raise ConfigError("scrub-forget", text, f"a class label{top}")
        return forget

    def __str__(self) -> str:
        if self.kind == "class":
            return f"class:{self.label}"
        if self.kind == "client":
            return f"client:{self.client}"
        tail = "" if self.label is None else f":{self.label}"
        return f"samples:{self.client}:{self.count}{tail}"

    @property
    def is_class(self) -> bool:
        return self.kind == "class"

    def involves(self, partition_id: int) -> bool:
        """Whether client ``partition_id`` may hold samples of D_f."""
        return self.kind == "class" or self.client == partition_id

    def mask(self, labels, partition_id: int, seed: int) -> np.ndarray:
        """Boolean mask over client ``partition_id``'s samples (labels in their order): True in D_f.

        ``samples`` draws its N samples with a seed derived from the run seed, so every party that
        asks gets the same ones; too few candidates is an error naming the counts.
        """
        y = np.asarray(labels).ravel()
        if not self.involves(partition_id):
            return np.zeros(len(y), dtype=bool)
        if self.kind == "class":
            return y == self.label
        if self.kind == "client":
            return np.ones(len(y), dtype=bool)
        candidates = (
            np.flatnonzero(y == self.label) if self.label is not None else np.arange(len(y))
        )
        if len(candidates) < self.count:
            what = "samples" if self.label is None else f"samples of class {self.label}"
            raise ConfigError(
                "scrub-forget",
                str(self),
                f"at most {len(candidates)} (client {partition_id} holds {len(candidates)} {what})",
            )
        rng = np.random.default_rng(derive_seed(seed, "forget", str(self), partition_id))
        out = np.zeros(len(y), dtype=bool)
        out[rng.choice(candidates, size=self.count, replace=False)] = True
        return out
