"""The store's identity and the seal of its header, kept in the index (format 4).

A store header (``store.json``: the dtype, the retention record and the policies' states, which
decide what a method reads and where it rolls back) is a separate file from the index that holds the
rows, so on its own it could be swapped for a genuine header of another store of the same run (the
store a request adopted) or of another moment of this store. Format 4 ties the two together:

* a random **store id** (:mod:`secrets`), created with the store, is written both in the header and
  in the index's ``store_identity`` table; every metadata checksum of the header is sealed with it and
  with the run (:mod:`fedunlearn.store.sealing`);
* the index records the **seal of the whole header** it goes with. A header is written in two steps
  (:func:`begin_header`, then the atomic rename, then :func:`commit_header`), so that a crash between
  any two leaves a header whose seal is the index's committed or pending one: any other header (from
  another store, run or moment) is refused by name.

Stores of format 3 and older have no identity: a writable open gives them one; a read-only open reads
them as they are.
"""

from __future__ import annotations

from typing import NamedTuple

TABLE = "store_identity"
_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    header_seal TEXT,               -- the seal of the header this index goes with
    pending_seal TEXT               -- the seal of the header being written (NULL: none)
)"""


class StoreIdentity(NamedTuple):
    """The identity row of an index: its store id and the seals of its header."""

    store_id: str
    header_seal: str | None
    pending_seal: str | None

    def accepts(self, seal: str) -> bool:
        """Whether a header sealed ``seal`` is this index's (committed, or being written)."""
        return seal in (self.header_seal, self.pending_seal)


def read(index) -> StoreIdentity | None:
    """The index's identity (None: a store written before identities)."""
    if not index._sql("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", TABLE):
        return None
    found = index._sql(f"SELECT store_id, header_seal, pending_seal FROM {TABLE} WHERE id = 1")
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
