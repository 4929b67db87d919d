"""Writing one round of the update store atomically (:meth:`UpdateStore.begin_round`): its blobs
first, each fsynced and renamed into place, then its index rows in one transaction; a round left
by an exception (or a crash) leaves no row, and its files are removed."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping

import safetensors.torch

from fedunlearn.errors import ConfigError
from fedunlearn.store.blobs import (
    BLOBS,
    FORMAT_NAME,
    SQUARES_KEY,
    STORE_DTYPES,
    State,
    check_integer,
    check_squares,
    prepare_tensors,
    squared_norms,
)
from fedunlearn.store.durable_io import atomic_write_bytes, fsync_directory, private_directory
from fedunlearn.store.index_rows import BlobRow, blob_path


class RoundWriter:
    """Writes one round's blobs and commits its index rows only on a clean ``with`` exit.

    Obtained from :meth:`UpdateStore.begin_round`. Entering the block takes the store's write
    lock and writes the global model; :meth:`add_update` writes each blob at once, so memory
    holds one update at a time. Leaving the block by an exception removes the round's files.
    """

    def __init__(self, store, round_number: int, global_model: State | None) -> None:
        self._store, self.round, self._global_model = store, round_number, global_model
        self._directory = store.root / BLOBS / f"round_{round_number:06d}"
        self._rows: list[BlobRow] = []
        self._norms: list[tuple[int, int, dict[str, float]]] = []
        self._open = self._used = False
        self._lock = contextlib.ExitStack()

    @property
    def clients(self) -> list[int]:
        """Clients added so far (updates, then norms), in the order they were added."""
        return [row.client for row in self._rows if row.client is not None] + [
            client for client, _, _ in self._norms
        ]

    def __enter__(self) -> RoundWriter:
        if self._used:
            raise ConfigError("round-writer", self.round, "a fresh store.begin_round() per block")
        self._used = True
        self._lock.enter_context(self._store._exclusive())
        try:
            self._store._require_uncommitted(self.round)  # again, now that the lock is held
            if self._directory.exists():  # files of a crashed earlier attempt at this round
                self._store._remove_unindexed(self._directory, set())
            if self._global_model is not None:
                self._write(None, self._global_model, None)
            self._global_model = None  # written: do not keep it alive for the whole round
        except BaseException:
            self._discard()
            raise
        self._open = True
        return self

    def add_update(
        self,
        client: int,
        update: State,
        num_examples: int,
        squares: Mapping[str, float] | None = None,
    ) -> None:
        """Write client ``client``'s update U_k^t, computed on ``num_examples`` samples.

        ``squares`` (tensor -> ‖U_k^t[tensor]‖²) records norms other than the stored values' own:
        a rewritten history stores the calibrated update Ũ_k with the norms of the U_k it
        replaces. By default the norms of the stored values are recorded."""
        client, num_examples = self._check_new(client, num_examples, "add_update")
        self._write(client, update, num_examples, squares)

    def add_norms(
        self,
        client: int,
        update: State,
        num_examples: int,
        squares: Mapping[str, float] | None = None,
    ) -> None:
        """Keep of client ``client``'s update only ‖U_k^t[tensor]‖² per floating tensor and N_k.

        The norms are those :meth:`add_update` would record: of the values as the store's dtype
        holds them, or ``squares`` when given; so FedEraser calibrates with the same numbers
        whichever was kept. The update itself is checked (finite, within the dtype's range) and
        dropped."""
        client, num_examples = self._check_new(client, num_examples, "add_norms")
        what = f"update of client {client} in round {self.round}"
        prepared = prepare_tensors(update, STORE_DTYPES[self._store.dtype], what)
        squares = squared_norms(prepared) if squares is None else squares
        self._norms.append((client, num_examples, check_squares(what, squares, prepared)))

    def _check_new(self, client: int, num_examples: int, method: str) -> tuple[int, int]:
        if not self._open:
            raise ConfigError("round-writer", self.round, f"{method} inside its `with` block")
        client = check_integer("client", client, 0)
        num_examples = check_integer("num_examples", num_examples, 1)
        if client in self.clients:
            raise ConfigError(
                "client",
                client,
                f"each client once per round, but round {self.round} already has client {client}",
            )
        return client, num_examples

    def __exit__(self, exception_type, exception, traceback) -> None:
        if exception_type is not None or not self._open:
            self._discard()
            return
        try:
            if self._rows:
                fsync_directory(self._directory)
                fsync_directory(self._directory.parent)
            self._store._insert_rows(self.round, self._rows, self._norms)
        except BaseException:
            self._discard()
            raise
        self._open = False
        self._lock.close()

    def _write(
        self,
        client: int | None,
        tensors: State,
        num_examples: int | None,
        squares: Mapping[str, float] | None = None,
    ) -> None:
        kind = "global" if client is None else "update"
        what = (
            f"global model of round {self.round}"
            if client is None
            else f"update of client {client} in round {self.round}"
        )
        metadata = {"format": FORMAT_NAME, "round": str(self.round), "client": str(client)}
        dtype = self._store.dtype
        prepared = prepare_tensors(tensors, STORE_DTYPES[dtype], what)
        if client is not None:
            squares = squared_norms(prepared) if squares is None else squares
            metadata[SQUARES_KEY] = json.dumps(check_squares(what, squares, prepared))
        data = safetensors.torch.save(prepared, metadata=metadata)
        if not self._rows:  # the round's folder, made with its first blob (norms need none)
            private_directory(self._directory)
        relative = blob_path(self.round, client)
        # the round's folder is fsynced once, before its rows commit (__exit__)
        atomic_write_bytes(self._store.root / relative, data, sync_directory=False)
        checksum = hashlib.sha256(data).hexdigest()
        self._rows.append(
            BlobRow(self.round, client, kind, num_examples, dtype, len(data), checksum, relative)
        )

    def _discard(self) -> None:
        try:
            if self._directory.exists():
                self._store._remove_unindexed(self._directory, set())
        finally:
            self._open, self._rows, self._norms = False, [], []
            self._lock.close()
