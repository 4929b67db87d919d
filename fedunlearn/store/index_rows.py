"""The rows of the store's SQLite index (:mod:`fedunlearn.store.index`): :class:`BlobRow`, one per
blob, and :class:`NormsRow`, one per update kept only as its norms (``retain-mode = norms``).

Each row knows its own checksum (over every field a reader uses: :meth:`BlobRow.canonical`, and
:meth:`NormsRow.row_checksum` with the store's norms layout) and its *sanity*: why no writer of
the store could have written it (a path other than the one its round and client name, a count
below 1, an unknown dtype, a norm that is negative or not finite). Reading and writing them is
:class:`fedunlearn.store.index.StoreIndex`'s.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from typing import NamedTuple

from fedunlearn.errors import ConfigError

COLUMNS = ("round", "client", "kind", "num_examples", "dtype", "bytes", "checksum", "path")
_DTYPE_NAMES = frozenset({"float32", "float16"})
_SHA256 = re.compile(r"[0-9a-f]{64}")
# one encoder for every row (json.dumps would build one per call); a BLOB edited into a column
# gets a text form of its own, so it can never pass for the value it replaced
_CANONICAL = json.JSONEncoder(
    separators=(",", ":"), default=lambda v: f"<{type(v).__name__} {v!r}>"
)


def blob_path(round_number: int, client: int | None) -> str:
    """Path of a blob relative to the store root: the global model when ``client`` is None."""
    name = "global" if client is None else f"client_{client:06d}"
    return f"blobs/round_{round_number:06d}/{name}.safetensors"


def describe(round_number: object, client: object) -> str:
    return f"round {round_number}, " + ("global model" if client is None else f"client {client}")


class BlobRow(NamedTuple):
    """One index row: blob ``path`` of (``round``, ``client``), ``bytes`` long with sha256 ``checksum``."""

    round: int
    client: int | None
    kind: str
    num_examples: int | None
    dtype: str
    bytes: int
    checksum: str
    path: str

    @property
    def who(self) -> str:
        return describe(self.round, self.client)

    def canonical(self) -> bytes:
        """The fields as compact JSON: ``12``, ``"12"`` and ``12.0`` differ, as they must."""
        return _CANONICAL.encode(self).encode()

    def row_checksum(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    def insanity(self) -> str | None:
        """Why no writer of the store could have written this row; None when it could."""

        def whole(value: object, minimum: int) -> bool:
            return type(value) is int and value >= minimum

        if not whole(self.round, 1):
            return "round is not an integer >= 1"
        if self.kind == "global":
            if self.client is not None or self.num_examples is not None:
                return "a global model's row names a client or a sample count"
        elif self.kind != "update" or not whole(self.client, 0) or not whole(self.num_examples, 1):
            return "not an update row with a client >= 0 and num_examples >= 1"
        if self.dtype not in _DTYPE_NAMES or not whole(self.bytes, 0):
            return "unknown dtype or a size that is not a whole number"
        if not isinstance(self.checksum, str) or not _SHA256.fullmatch(self.checksum):
            return "the blob checksum is not a sha256 in hex"
        if self.path != blob_path(self.round, self.client):
            return f"path is not {blob_path(self.round, self.client)!r}"
        return None


class NormsRow(NamedTuple):
    """One norms row: client ``client``'s update of ``round`` kept as its squared norm per tensor
    (``squares``: float64 little-endian, in the store's layout order) and its sample count."""

    round: int
    client: int
    num_examples: int
    squares: bytes

    @property
    def who(self) -> str:
        return describe(self.round, self.client) + " (norms)"

    @property
    def bytes(self) -> int:
        """What the row keeps: three integers, the squares and the 32-byte checksum (the
        56 + len(squares) that :meth:`fedunlearn.store.index.StoreIndex.total_bytes` sums)."""
        return 24 + len(self.squares) + 32

    def row_checksum(self, layout: str) -> bytes:
        fields = [self.round, self.client, self.num_examples, self.squares.hex(), layout]
        return hashlib.sha256(_CANONICAL.encode(fields).encode()).digest()

    def values(self, tensors: list[str]) -> dict[str, float]:
        """Tensor -> ‖U[tensor]‖², read back exactly as written."""
        return dict(zip(tensors, struct.unpack(f"<{len(tensors)}d", self.squares), strict=True))

    def insanity(self, tensors: list[str]) -> str | None:
        """Why no writer of the store could have written this row; None when it could."""
        if not all(type(v) is int for v in (self.round, self.client, self.num_examples)):
            return "round, client or num_examples is not an integer"
        if self.round < 1 or self.client < 0 or self.num_examples < 1:
            return "not a round >= 1, client >= 0 and num_examples >= 1"
        if not isinstance(self.squares, bytes) or len(self.squares) != 8 * len(tensors):
            return f"squares is not {len(tensors)} float64 values"
        if not all(0 <= v < math.inf for v in self.values(tensors).values()):
            return "a squared norm is negative or not finite"
        return None

    @classmethod
    def of(cls, round: int, client: int, num_examples: int, squares, tensors) -> NormsRow:
        """The row of ``squares`` (tensor -> ‖U[tensor]‖²), packed in ``tensors`` order."""
        if sorted(squares) != sorted(tensors):
            raise ConfigError(
                f"norms of client {client} in round {round}",
                sorted(squares),
                f"the tensors of the store's norms layout: {list(tensors)}",
            )
        packed = struct.pack(f"<{len(tensors)}d", *(float(squares[name]) for name in tensors))
        return cls(round, client, num_examples, packed)
