"""Erasure from the update store: :class:`StoreErasure`, the part of
:class:`fedunlearn.store.update_store.UpdateStore` that physically removes what must go.

A client's or a round's blobs and index rows go on request (``delete_clients``,
``delete_rounds_after``, ``delete_from_round``): the rows first, in one transaction, then the
files, so that a crash in between leaves unindexed files, which the next writable open removes,
rather than rows naming missing files; ``delete_clients`` then vacuums the index so that no page
keeps the rows. A crashed round's leftovers (blobs no committed row names, temporary header files)
go when the store is opened writable.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fedunlearn.store.blobs import (
    BLOBS,
    HEADER,
    OWN_FILE,
    ROUND_DIRECTORY,
    check_integer,
    client_set,
)
from fedunlearn.store.durable_io import fsync_directory
from fedunlearn.store.index import StoreIndex
from fedunlearn.store.index_rows import BlobRow, NormsRow


class StoreErasure:
    """Deleting clients, rounds and a crashed round's files from a store at ``self.root``, with its
    open index ``self._index``, under the write lock of
    :class:`~fedunlearn.store.header.HeaderAndLock`;
    :class:`~fedunlearn.store.update_store.UpdateStore` is one."""

    root: Path
    _index: StoreIndex

    def delete_client(self, client: int) -> int:
        """:meth:`delete_clients` of one client."""
        return self.delete_clients([client])

    def delete_clients(self, clients: Iterable[int]) -> int:
        """Physically remove every blob and index row of ``clients``; return the blob count.

        Rows go first: a crash before the unlinks then leaves unindexed files, which the next
        open removes, rather than rows naming missing files. One VACUUM then rebuilds the index
        so that no page keeps the rows. Erasing the disk blocks of unlinked files is up to the
        filesystem; keep the store on encrypted storage where that matters. Every row is
        verified first: a damaged index could otherwise hide a row of a client.
        """
        self._require_writable("delete_clients")
        gone = client_set("clients", clients)
        with self._exclusive():
            norms = [row for row in self._index.norms_rows() if row.client in gone]
            deleted = self._delete_rows([row for row in self._rows() if row.client in gone], norms)
            self._index.vacuum()
        return len(deleted)

    def delete_rounds_after(self, round: int) -> list[int]:
        """Physically remove every committed round after ``round`` (>= 0); return those rounds.

        A resumed training run calls this with its last checkpointed round: a round the store
        committed after that checkpoint (the crash came between the two) is trained again, and
        would otherwise be retained twice. Rows go first, as in :meth:`delete_client`.
        """
        self._require_writable("delete_rounds_after")
        round_number = check_integer("round", round, 0)
        with self._exclusive():
            norms = [row for row in self._index.norms_rows() if row.round > round_number]
            deleted = self._delete_rows(
                [row for row in self._rows() if row.round > round_number], norms
            )
            for directory in {(self.root / row.path).parent for row in deleted}:
                if directory.is_dir() and not any(directory.iterdir()):
                    directory.rmdir()
                    fsync_directory(directory.parent)
        return sorted({row.round for row in deleted} | {row.round for row in norms})

    def delete_from_round(self, round: int, clients: Iterable[int] | None = None) -> int:
        """Physically remove, of committed round ``round``, the updates (and norms) of ``clients``,
        or with ``clients`` None the whole round, its global model too; return the blob count.

        A policy that chooses its rounds after they happened (Crab's windows) keeps them whole
        until it has chosen; the retaining strategy then removes what no policy kept. Rows go
        first, as in :meth:`delete_client`."""
        self._require_writable("delete_from_round")
        round_number = self._require_committed(round)
        wanted = None if clients is None else client_set("clients", clients)
        with self._exclusive():
            rows = [
                row
                for row in self._rows(round_number)
                if wanted is None or (row.kind == "update" and row.client in wanted)
            ]
            norms = [
                row
                for row in self._index.norms_rows(round_number)
                if wanted is None or row.client in wanted
            ]
            deleted = self._delete_rows(rows, norms)
            for directory in {(self.root / row.path).parent for row in deleted}:
                if directory.is_dir() and not any(directory.iterdir()):
                    directory.rmdir()
                    fsync_directory(directory.parent)
        return len(deleted)

    def _delete_rows(self, rows: list[BlobRow], norms: list[NormsRow] = ()) -> list[BlobRow]:
        """Delete ``rows`` (and ``norms`` rows) from the index, then their files; return ``rows``.
        Rows go first: a crash before the unlinks then leaves unindexed files, which the next
        open removes, rather than rows naming missing files."""
        with self._index.transaction():
            self._index.delete(rows)
            if norms:
                self._index.delete_norms(norms)
        for row in rows:
            (self.root / row.path).unlink(missing_ok=True)
        for directory in {(self.root / row.path).parent for row in rows}:
            if directory.is_dir():
                fsync_directory(directory)
        return rows

    def _remove_unindexed(self, directory: Path, committed: set[str]) -> None:
        """Remove this module's files in ``directory`` that no committed index row names."""
        removed = False
        for file in directory.iterdir():
            relative = f"{BLOBS}/{directory.name}/{file.name}"
            if OWN_FILE.fullmatch(file.name) and relative not in committed:
                file.unlink()
                removed = True
        if not any(directory.iterdir()):
            directory.rmdir()
            fsync_directory(directory.parent)
        elif removed:
            fsync_directory(directory)

    def _remove_uncommitted_files(self) -> None:
        """Delete blobs and temporary files of rounds that never committed (a crash's leftovers).
        Called with the lock held. A file any index row names stays, even if the row is damaged."""
        committed = self._index.paths()
        for directory in (self.root / BLOBS).iterdir():
            if directory.is_dir() and ROUND_DIRECTORY.fullmatch(directory.name):
                self._remove_unindexed(directory, committed)
        for temporary in self.root.glob(f".{HEADER}.*tmp"):
            temporary.unlink(missing_ok=True)
