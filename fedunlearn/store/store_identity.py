"""The store's identity and the seal of its header, kept in the index (format 4).

A store header (``store.json``: the dtype, the retention record and the policies' states, which
decide what a method reads and where it rolls back) is a separate file from the index that holds the
rows, so on its own it could be swapped for a genuine header of another store of the same run (the
store a request adopted) or of another moment of this store. Format 4 ties the two together:

* a random **store id** (:mod:`secrets`), created with the store, is written both in the header and
  in the index's ``store_identity`` table; every metadata checksum of the header is sealed with it and
  with the run (:mod:`fedunlearn.store.sealing`);
* every row's checksum (blob rows and norms rows) is **sealed** with the run and the store
  (:func:`bind_rows`), so a row copied from another store's index, or edited and re-checksummed
  without the key in authenticity mode, is refused;
* the index records the **seal of the whole header** it goes with. A header is written in two steps
  (:func:`begin_header`, then the atomic rename, then :func:`commit_header`), so that a crash between
  any two leaves a header whose seal is the index's committed or pending one: any other header (from
  another store, run or moment) is refused by name.

Stores of format 3 and older have no identity: a writable open gives them one; a read-only open reads
them as they are.
"""

from __future__ import annotations

import json
from typing import NamedTuple

TABLE = "store_identity"
_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    header_seal TEXT,               -- the seal of the header this index goes with
    pending_seal TEXT,              -- the seal of the header being written (NULL: none)
    rows_sealed INTEGER NOT NULL DEFAULT 0  -- 1: every row's checksum is sealed (bind_rows)
)"""


class StoreIdentity(NamedTuple):
    """The identity row of an index: its store id and the seals of its header."""

    store_id: str
    header_seal: str | None
    pending_seal: str | None
    rows_sealed: int = 0

    def accepts(self, seal: str) -> bool:
        """Whether a header sealed ``seal`` is this index's (committed, or being written)."""
        return seal in (self.header_seal, self.pending_seal)


def read(index) -> StoreIdentity | None:
    """The index's identity (None: a store written before identities)."""
    if not index._sql("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", TABLE):
        return None
    found = index._sql(
        f"SELECT store_id, header_seal, pending_seal, rows_sealed FROM {TABLE} WHERE id = 1"
    )
    return StoreIdentity(*found[0]) if found else None


def begin_header(index, store_id: str, seal: str) -> None:
    """Step 1 of writing a header: record its seal as pending (the identity created if none)."""
    with index.transaction():
        index._connection.execute(_SCHEMA)
        index._connection.execute(
            f"INSERT INTO {TABLE} (id, store_id, header_seal, pending_seal) VALUES (1, ?, NULL, ?) "
            "ON CONFLICT (id) DO UPDATE SET pending_seal = excluded.pending_seal",
            (store_id, seal),
        )


def commit_header(index, seal: str) -> None:
    """Step 3 of writing a header (after its rename): its seal becomes the committed one."""
    with index.transaction():
        index._connection.execute(
            f"UPDATE {TABLE} SET header_seal = ?, pending_seal = NULL WHERE id = 1", (seal,)
        )


def attach(index, sealer) -> None:
    """Check and write this index's rows with their seals when its rows are sealed (format 4)."""
    identity = read(index)
    if identity is not None and identity.rows_sealed:
        place = {"store": identity.store_id}
        index.row_seal = lambda kind, content: sealer.seal({**place, "row": kind}, content)


def bind_rows(index, sealer) -> None:
    """Seal every row's checksum with the run and the store, in one transaction (the rows are
    checked with their plain checksums first; a damaged one is refused, nothing changed)."""
    from fedunlearn.errors import StoreCorruptionError

    identity = read(index)
    if identity.rows_sealed:
        return
    rows, problems = index.checked_rows()
    norms, norms_problems = index.checked_norms_rows()
    if problems or norms_problems:
        raise StoreCorruptionError(f"{(problems + norms_problems)[0]}; nothing was changed")
    layout = json.dumps(index.norms_layout())
    with index.transaction():
        index._connection.execute(f"UPDATE {TABLE} SET rows_sealed = 1 WHERE id = 1")
        attach(index, sealer)
        try:
            index._connection.executemany(
                "UPDATE blobs SET row_checksum = ? WHERE path = ?",
                [(index.blob_checksum(row), row.path) for row in rows],
            )
            if norms:
                index._connection.executemany(
                    "UPDATE norms SET row_checksum = ? WHERE round = ? AND client = ?",
                    [(index.norms_checksum(r, layout), r.round, r.client) for r in norms],
                )
        except BaseException:
            index.row_seal = None
            raise
