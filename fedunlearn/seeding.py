"""Seeds derived from a run's seed, stable across processes and machines.

Python's ``hash`` is salted per process, so every federated party derives its seeds with SHA-256
instead: the same (run seed, purpose, round, client) always gives the same stream.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed determined by ``parts`` (e.g. ``derive_seed(seed, "train", round, client)``)."""
    text = "\x1f".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1
