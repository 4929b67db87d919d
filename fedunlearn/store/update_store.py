"""Durable, crash-safe store of the client updates and global models that FedEraser retains.

FedEraser (Liu et al., 2021) calibrates an unlearned model from the updates U_k^t = M_k^t - M^t
that each client k sent at the retained rounds t_1 = 1, t_{j+1} = t_j + Δt, and from the global
models M^t of those rounds. This store is the server's only durable memory of them, so:

* every blob (one per round's global model, one per (round, client) update, safetensors) is
  written to a temporary file, fsynced and renamed into place; no blob holds a NaN or an Inf;
* a round exists only once all its rows of the SQLite index, each with the blob's sha256 and its
  own row checksum (:mod:`fedunlearn.store.index`), are committed in one transaction; blobs of
  rounds that never committed (a crash) are removed the next time the store is opened writable,
  so a half-written round is never read as valid;
* the store never destroys what it cannot account for: blobs with no readable index (the index
  missing, empty, not SQLite, truncated) raise :class:`StoreCorruptionError` and stay untouched;
* every read verifies the row and blob checksums, and ``delete_client`` unlinks the client's blobs
  and vacuums the index (``secure_delete``) so that no file under the root keeps a byte of them;
* ``UpdateStore(root, readonly=True)`` writes nothing at all (no folder, header, lock, cleanup or
  migration; SQLite opened ``mode=ro``), so it can inspect a store on a read-only file system;
* folders are 0700 and files 0600, whatever the umask: the updates reveal the clients' data.

Formats: 3 (this version) checksums every field of the header's metadata, 2 the index rows; an
older store is migrated by the first writable open, and read as it is, with a note, by a read-only
one. The header and lock are :mod:`fedunlearn.store.header`, a blob :mod:`fedunlearn.store.blobs`,
a round's writing :mod:`fedunlearn.store.round_writer`, deleting clients and rounds (and a crashed
round's leftovers) :mod:`fedunlearn.store.erasure`.

Layout::

    root/store.json                                      format version, dtype, user metadata
    root/index.sqlite                                    one row per blob
    root/.lock                                           advisory lock held while writing
    root/blobs/round_000003/global.safetensors           M^3
    root/blobs/round_000003/client_000007.safetensors    U_7^3

A round may keep, instead of a client's update, only its squared norm per tensor and its sample
count (:meth:`RoundWriter.add_norms`, ``retain-mode = norms``): a row of the index's ``norms``
table, no blob; such a round may also have no global model. FedEraser's calibration (eq. 2 of Liu
et al.) reads nothing else of the updates after round t_1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pandas as pd
import torch

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store import store_identity
from fedunlearn.store.blobs import (
    BLOBS,
    INDEX,
    STORE_DTYPES,
    State,
    blob_problems,
    check_integer,
    client_set,
    read_blob,
    recorded_squares,
    tighten_modes,
)
from fedunlearn.store.durable_io import (
    private_directory,
)
from fedunlearn.store.erasure import StoreErasure
from fedunlearn.store.header import BOUND_VERSION, FORMAT_VERSION, HeaderAndLock
from fedunlearn.store.index import StoreBusyError, StoreIndex, StoreReadOnlyError
from fedunlearn.store.index_rows import COLUMNS, BlobRow, NormsRow
from fedunlearn.store.retained_round import RetainedRound
from fedunlearn.store.round_writer import RoundWriter

__all__ = [
    "FORMAT_VERSION",
    "STORE_DTYPES",
    "RetainedRound",
    "RoundWriter",
    "StoreBusyError",
    "StoreReadOnlyError",
    "UpdateStore",
]


class UpdateStore(HeaderAndLock, StoreErasure):
    """A directory retaining FedEraser's global models and client updates, round by round.

    Parameters
    ----------
    root
        Store directory; created if missing (unless ``readonly``), reopened if it holds a store.
    dtype
        ``"float32"`` or ``"float16"``: how floating tensors are stored (they are always read
        back as float32). ``None`` means ``"float32"`` for a new store and the recorded dtype
        for an existing one; an explicit dtype other than the recorded one is an error.
    readonly
        Open an existing store without writing anything: no folder, header, lock file, cleanup of
        a crashed round's files, or migration; the index opened read-only. Every writing method
        then raises :class:`StoreReadOnlyError`. Works on a read-only file system.

    Raises
    ------
    ConfigError
        Unknown dtype, a dtype other than the store's, a store of a newer format, or
        (``readonly``) no store at ``root``.
    StoreCorruptionError
        ``store.json`` unreadable, or missing while ``index.sqlite`` or blobs exist; the index
        missing, empty or unreadable while blobs exist (they are left untouched); the index not
        an SQLite store index.
    StoreReadOnlyError
        A writable open of a store on a read-only file system.
    """

    def __init__(
        self, root: str | os.PathLike, dtype: str | None = None, *, readonly: bool = False
    ) -> None:
        self.root = Path(root)
        self.readonly = bool(readonly)
        if dtype is not None and dtype not in STORE_DTYPES:
            raise ConfigError("store-dtype", dtype, "'float32' or 'float16'")
        self._lock_descriptor, self._lock_depth = None, 0
        if not self.readonly:
            self._require_writable_file_system()
        header = self._open_header(dtype)
        self._dtype: str = header["dtype"]
        self._index = self._open_index()
        try:
            store_identity.attach(self._index, self.sealer)
            if not self.readonly:
                self._prepare(header)
            self._read_header()  # a bound header is checked against the index now open
        except BaseException:
            self._index.close()
            raise

    @property
    def dtype(self) -> str:
        """How floating tensors are stored: ``"float32"`` or ``"float16"``."""
        return self._dtype

    @property
    def rows_checksummed(self) -> bool:
        """False for a format-1 store opened read-only: its index rows carry no checksums yet
        (a writable open adds them); only their sanity is checked."""
        return self._index.checksummed

    @property
    def metadata(self) -> dict:
        """User metadata recorded with :meth:`set_metadata` (a fresh copy, read from disk)."""
        return self._read_header()["metadata"]

    def set_metadata(self, **values: object) -> None:
        """Merge JSON-serializable ``values`` into the user metadata; rewritten atomically."""
        self._require_writable("set_metadata")
        try:
            json.dumps(values, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ConfigError("metadata", values, f"JSON-serializable values ({error})") from None
        with self._exclusive():
            header = self._read_header()
            header["metadata"].update(values)
            self._write_header(header)

    # ------------------------------------------------------------------ writing
    def begin_round(self, round: int, global_model: State | None) -> RoundWriter:
        """Start writing round ``round`` (>= 1, not committed); use the writer in a ``with``.

        ``global_model`` None keeps no M^t for the round (a ``retain-mode = norms`` round after
        t_1); a round that keeps nothing at all is not committed."""
        self._require_writable("begin_round")
        round_number = check_integer("round", round, 1)
        self._require_uncommitted(round_number)
        return RoundWriter(self, round_number, global_model)

    def write_round(
        self, round: int, global_model: State, updates: Mapping[int, tuple[State, int]]
    ) -> None:
        """Write and commit a whole round; ``updates`` maps client to (update, num_examples)."""
        self._require_writable("write_round")
        if not isinstance(updates, Mapping):
            raise ConfigError("updates", type(updates).__name__, "a mapping client -> (update, n)")
        with self.begin_round(round, global_model) as writer:
            for client, (update, num_examples) in updates.items():
                writer.add_update(client, update, num_examples)

    # ------------------------------------------------------------------ reading
    def rounds(self) -> list[int]:
        """Committed rounds, ascending."""
        kept = {row.round for row in self._rows() if row.kind == "global"}
        return sorted(kept | {row.round for row in self._index.norms_rows()})

    def clients(self, round: int | None = None) -> list[int]:
        """Clients with an update, or its norms, in ``round`` (in any round when ``None``)."""
        if round is not None:
            return sorted(self.num_examples(round))
        norms = {row.client for row in self._index.norms_rows()}
        return sorted({row.client for row in self._rows() if row.kind == "update"} | norms)

    def num_examples(self, round: int) -> dict[int, int]:
        """Sample count N_k of each client with an update, or its norms, in ``round``."""
        round_number = self._require_committed(round)
        counts = {row.client: row.num_examples for row in self._index.norms_rows(round_number)}
        for row in self._rows(round_number):
            if row.kind == "update":
                counts[row.client] = row.num_examples
        return dict(sorted(counts.items()))

    def read_global(self, round: int) -> dict[str, torch.Tensor]:
        """The global model M^round, checksum-verified, floating tensors as float32."""
        rows = self._rows(self._require_committed(round))
        if not any(row.kind == "global" for row in rows):
            raise ConfigError(
                "round",
                round,
                "a round whose global model was kept (a retain-mode = norms round after t_1 "
                f"keeps only the updates' norms); rounds with one: {self._model_rounds()}",
            )
        return read_blob(self.root, self._global_row(rows))

    def read_update(self, round: int, client: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s update U_k^round, checksum-verified, floating tensors as float32."""
        round_number = self._require_committed(round)
        client = check_integer("client", client, 0)
        rows = self._rows(round_number)
        found = [row for row in rows if row.kind == "update" and row.client == client]
        if not found:
            clients = [row.client for row in rows if row.kind == "update"]
            kept_norms = self._index.norms_rows(round_number)
            norms = " (of the others it kept only the norms)" if kept_norms else ""
            raise ConfigError(
                "client",
                client,
                f"a client with an update in round {round_number}: {clients}{norms}",
            )
        return read_blob(self.root, found[0])

    def read_round(
        self,
        round: int,
        clients: int | Iterable[int] | None = None,
        exclude: int | Iterable[int] = (),
        *,
        blobs: str = "all",
    ) -> RetainedRound:
        """Read one round: its global model and the updates of ``clients`` (all when ``None``).

        Listed clients without an update in this round are skipped, since participation varies
        from round to round; clients in ``exclude`` are never read. ``blobs = "none"`` reads no
        blob at all, only counts and norms rows (the whole updates then come one at a time from
        :meth:`iter_updates`: :func:`fedunlearn.unlearning.federaser.federaser`).
        """
        if blobs not in ("all", "none"):
            raise ConfigError("blobs", blobs, "one of all, none")
        round_number = self._require_committed(round)
        wanted = None if clients is None else client_set("clients", clients)
        excluded = client_set("exclude", exclude)
        rows = self._rows(round_number)
        has_global = blobs == "all" and any(row.kind == "global" for row in rows)
        retained = RetainedRound(
            round_number, read_blob(self.root, self._global_row(rows)) if has_global else None
        )
        tensors = self._index.norms_layout()
        for row in self._index.norms_rows(round_number):
            if row.client not in excluded and (wanted is None or row.client in wanted):
                retained.num_examples[row.client] = row.num_examples
                retained.squares[row.client] = row.values(tensors)
        for row in rows:
            if row.kind != "update" or row.client in excluded:
                continue
            if (wanted is None or row.client in wanted) and blobs == "none":
                retained.num_examples[row.client] = row.num_examples
                retained.unread.add(row.client)
            elif wanted is None or row.client in wanted:
                update, metadata = read_blob(self.root, row, with_metadata=True)
                retained.updates[row.client] = update
                retained.num_examples[row.client] = row.num_examples
                retained.squares[row.client] = recorded_squares(row, metadata, update)
        return retained

    def iter_updates(self, round: int, clients: Iterable[int]) -> Iterator[tuple[int, State, dict]]:
        """(client, U_k^round, its recorded squared norms) of each of ``clients`` with a whole
        update in ``round``, ascending: the round's rows read once, one update in memory."""
        round_number = self._require_committed(round)
        wanted = client_set("clients", clients)
        rows = [r for r in self._rows(round_number) if r.kind == "update" and r.client in wanted]
        for row in sorted(rows, key=lambda r: r.client):
            update, metadata = read_blob(self.root, row, with_metadata=True)
            yield row.client, update, recorded_squares(row, metadata, update)

    def iter_rounds(
        self, clients: int | Iterable[int] | None = None, exclude: int | Iterable[int] = ()
    ) -> Iterator[RetainedRound]:
        """Yield :meth:`read_round` of each committed round, ascending, one round in memory."""
        # sets now: a generator argument would otherwise be used up by the first round
        clients = None if clients is None else client_set("clients", clients)
        exclude = client_set("exclude", exclude)
        rounds = self.rounds()  # verifies every norms row: an edited round cannot hide one
        for round_number in rounds:
            yield self.read_round(round_number, clients=clients, exclude=exclude)

    def verify(self) -> list[str]:
        """Check the index (SQLite's quick_check, every row's checksum) and every blob (sha256,
        readable, finite values); return the problems, one line each (never raises)."""
        problems, rows = self._checked_index()
        for row in rows:
            problems += blob_problems(self.root, row)
        return problems

    def row_problems(self) -> list[str]:
        """:meth:`verify` without reading the blobs (each is verified whenever it is read)."""
        return self._checked_index()[0]

    def _checked_index(self) -> tuple[list[str], list[BlobRow]]:
        try:
            problems = self._index.integrity_problems()
            rows, row_problems = self._index.checked_rows()
        except StoreCorruptionError as error:
            return [str(error)], []
        problems += row_problems
        try:
            problems += self._index.checked_norms_rows()[1]
        except StoreCorruptionError as error:
            problems.append(str(error))
        return problems, rows

    def index(self) -> pd.DataFrame:
        """The index, one row per blob (ordered by round, kind, client), then one per norms row
        (kind ``"norms"``, dtype float64, ``bytes`` what the row keeps, no path)."""
        rows = [row._asdict() for row in self._rows()]
        rows += [
            {"round": n.round, "client": n.client, "kind": "norms", "dtype": "float64",
             "num_examples": n.num_examples, "bytes": n.bytes, "checksum": "", "path": ""}
            for n in self._index.norms_rows()
        ]  # fmt: skip
        frame = pd.DataFrame(rows, columns=list(COLUMNS))
        # nullable integers: the global model's client and num_examples are NULL
        integers = {"round": "int64", "bytes": "int64", "client": "Int64", "num_examples": "Int64"}
        return frame.astype(integers)

    @property
    def keeps_norms(self) -> bool:
        """Whether some round kept only the norms of some update (``retain-mode = norms``)."""
        return self._index.norms_count() > 0

    def client_blob_count(self, client: int) -> int:
        """Number of index rows of ``client`` (its updates and norms rows; counted, not
        verified): what :meth:`delete_client` would delete."""
        client = check_integer("client", client, 0)
        norms = sum(1 for row in self._index.norms_rows() if row.client == client)
        return norms + sum(1 for row in self._rows() if row.client == client)

    def blob_count(self) -> int:
        """Number of index rows, each naming one blob (counted, not verified)."""
        return self._index.count()

    def total_bytes(self) -> int:
        """Total size of the committed blobs and norms rows, in bytes (counted, not verified:
        :meth:`verify` checks them)."""
        return self._index.total_bytes()

    def bytes_per_round(self) -> dict[int, int]:
        """Size of each committed round's blobs and norms rows, in bytes."""
        sizes: dict[int, int] = {}
        for row in [*self._rows(), *self._index.norms_rows()]:
            sizes[row.round] = sizes.get(row.round, 0) + row.bytes
        return dict(sorted(sizes.items()))

    def __len__(self) -> int:
        return len(self.rounds())

    def __repr__(self) -> str:
        rounds = self.rounds()
        span = f" ({rounds[0]}..{rounds[-1]})" if rounds else ""
        return (
            f"UpdateStore(root={str(self.root)!r}, dtype={self._dtype!r}, rounds={len(rounds)}"
            f"{span}, clients={len(self.clients())}, bytes={self.total_bytes()}"
            + (", readonly=True)" if self.readonly else ")")
        )

    def close(self) -> None:
        """Close the index; the store object is unusable afterwards."""
        self._index.close()

    def __enter__(self) -> UpdateStore:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()

    def _open_index(self) -> StoreIndex:
        """The index; blobs without a readable index raise, and are never touched."""
        path = self.root / INDEX
        if path.exists() and not path.is_file():
            raise StoreCorruptionError(
                f"store {self.root}: its index {path} is not a file (a directory or a device); "
                f"move it aside and restore {INDEX} from a backup (then run `fedunlearn store "
                f"verify {self.root}`); the blobs were left untouched"
            )
        if not path.is_file() or path.stat().st_size == 0:
            # zero bytes: created 0600, then a crash before SQLite wrote a page
            blobs = self._blob_files()
            if blobs:
                state = "empty" if path.is_file() else "missing"
                raise StoreCorruptionError(
                    f"store {self.root}: its index {path} is {state} but {len(blobs)} blob "
                    f"file(s) exist under {self.root / BLOBS}; without the index no blob can be "
                    "attributed or trusted, and the blobs were left untouched - restore "
                    f"{INDEX} from a backup (then run `fedunlearn store verify {self.root}`), "
                    "or move the store aside and retrain"
                )
            if self.readonly:
                return StoreIndex.empty(path)
            private_directory(self.root / BLOBS)
            return StoreIndex.create(path)
        if self.readonly:
            return StoreIndex.open_readonly(path)
        index = StoreIndex.open_writable(path)
        private_directory(self.root / BLOBS)
        return index

    def _prepare(self, header: dict) -> None:
        """Writable open: migrate a format-1 index, bind a header of format 3 or older (or a new
        store's) to its index and run, then remove a crashed round's leftovers."""
        try:
            with self._exclusive():
                header = self._read_header()
                if self._index.migrate():
                    tighten_modes(self.root)
                if header["format_version"] < BOUND_VERSION:
                    tighten_modes(self.root)
                    self._bind_header(header)
                self._remove_uncommitted_files()
        except StoreBusyError:
            if not self._index.checksummed:
                raise
            # a writer is mid-round right now: its files are work in progress, not leftovers

    # ------------------------------------------------------------------ internals
    def _rows(self, round_number: int | None = None) -> list[BlobRow]:
        return self._index.rows(round_number)

    def _model_rounds(self) -> list[int]:
        return [row.round for row in self._rows() if row.kind == "global"]

    def _global_row(self, rows: list[BlobRow]) -> BlobRow:
        found = [row for row in rows if row.kind == "global"]
        if len(found) != 1:
            raise StoreCorruptionError(
                f"{self.root / INDEX}: round {rows[0].round} has {len(found)} global-model rows, "
                "expected 1; restore index.sqlite from a backup"
            )
        return found[0]

    def _blob_files(self) -> list[Path]:
        blobs = self.root / BLOBS
        return [path for path in blobs.rglob("*") if path.is_file()] if blobs.is_dir() else []

    def _require_committed(self, round: int) -> int:
        round_number = check_integer("round", round, 1)
        if not self._index.has_round(round_number):
            rounds = self.rounds()
            listed = rounds if len(rounds) <= 10 else f"{rounds[:3]}...{rounds[-3:]}"
            raise ConfigError("round", round, f"a committed round of {self.root}: {listed}")
        return round_number

    def _require_uncommitted(self, round_number: int) -> None:
        if self._index.has_round(round_number):
            raise ConfigError(
                "round",
                round_number,
                f"a new round, but round {round_number} is already committed in {self.root} "
                "(rounds are immutable); write another round",
            )

    def _insert_rows(self, round_number: int, rows: list[BlobRow], norms=()) -> None:
        """Commit a round's blob rows and its norms rows (client, N_k, squares) together."""
        with self._index.transaction():
            self._require_uncommitted(round_number)
            self._index.insert(rows)
            if norms:
                tensors = self._index.norms_layout() or sorted(norms[0][2])
                self._index.insert_norms(
                    [NormsRow.of(round_number, c, n, sq, tensors) for c, n, sq in norms], tensors
                )
