"""The SQLite index of the retained-update store (:mod:`fedunlearn.store.update_store`): one row per blob.

Every field a reader uses (round, client, kind, num_examples, dtype, bytes, checksum, path) is covered
by the row's own sha256 (``row_checksum``, over :meth:`BlobRow.canonical`), checked whenever a row is
read: an edited ``num_examples`` would silently reweight FedEraser's calibration (the N_k of eq. (2)
of Liu et al.), so it must fail as loudly as a flipped byte in a blob. A row must also be *sane*: its
path is the one its round and client name, so no edit can point a read, or an unlink, elsewhere.

The checksum detects damage and casual edits, not a forger who recomputes it (that would need a key
kept off the disk).

Formats (``PRAGMA user_version``): 2 has ``row_checksum``; 0 is format 1, written by fedunlearn before
row checksums. A writable store migrates a format-1 index (:meth:`StoreIndex.migrate`, one transaction);
a read-only store reads it with sanity checks only and says so (:attr:`StoreIndex.checksummed`).

Norms (``retain-mode = norms``): FedEraser's calibration (eq. 2 of Liu et al.) reads of an update
after round t_1 only its norm per tensor, so such a round keeps, per client, a row of the ``norms``
table: the sample count and the squared norms, float64 in the tensor order the ``norms_layout`` table
names once for the store; each row's raw sha256 covers its fields and that layout. An index with
these tables is version 3 (:data:`NORMS_VERSION`): an older fedunlearn refuses it rather than read
its rounds without their norms; stores that never kept norms stay version 2.

Opening never repairs or creates what is not there: an index that is not SQLite, truncated, or has
another schema raises :class:`~fedunlearn.errors.StoreCorruptionError`, never a raw ``sqlite3`` error.

The rows themselves (:class:`~fedunlearn.store.index_rows.BlobRow`,
:class:`~fedunlearn.store.index_rows.NormsRow`: their fields, checksums and sanity) are
:mod:`fedunlearn.store.index_rows`; this module keeps them in SQLite.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedunlearn.errors import ConfigError, FedUnlearnError, StoreCorruptionError
from fedunlearn.store.durable_io import json_loads
from fedunlearn.store.index_rows import COLUMNS, BlobRow, NormsRow, blob_path, describe

INDEX_VERSION = 2
#: The version of an index that holds norms rows (the tables of :data:`_NORMS_SCHEMA`).
NORMS_VERSION = 3
_SELECT = ", ".join(COLUMNS)
NORMS_COLUMNS = ("round", "client", "num_examples", "squares", "row_checksum")
_SCHEMA = (
    """CREATE TABLE blobs (
        round INTEGER NOT NULL,
        client INTEGER,                 -- NULL for the global model
        kind TEXT NOT NULL CHECK (kind IN ('update', 'global')),
        num_examples INTEGER,           -- NULL for the global model
        dtype TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        checksum TEXT NOT NULL,         -- sha256 of the blob file, hex
        path TEXT NOT NULL UNIQUE,      -- relative to the root; encodes (round, client, kind)
        -- sha256 of the row's other fields (BlobRow.canonical)
        row_checksum TEXT NOT NULL
    )""",
    "CREATE INDEX blobs_by_round ON blobs (round)",
    "CREATE INDEX blobs_by_client ON blobs (client)",
)
_NORMS_SCHEMA = (
    """CREATE TABLE norms_layout (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        tensors TEXT NOT NULL           -- JSON list: the tensor of each float64 in norms.squares
    )""",
    # WITHOUT ROWID: the (round, client) key is the table, no second B-tree; a few dozen bytes a row
    """CREATE TABLE norms (
        round INTEGER NOT NULL,
        client INTEGER NOT NULL,
        num_examples INTEGER NOT NULL,
        squares BLOB NOT NULL,          -- float64 little-endian, in norms_layout's order
        row_checksum BLOB NOT NULL,     -- raw sha256 of the fields and the layout (NormsRow)
        PRIMARY KEY (round, client)
    ) WITHOUT ROWID""",
)
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED (named in sqlite3 only from Python 3.11)
_SQLITE_READONLY = 8
_RESTORE = "restore index.sqlite from a backup; the blobs were left untouched"


class StoreBusyError(FedUnlearnError, RuntimeError):
    """Another writer (process, or ``UpdateStore`` object) holds the store's write lock."""


class StoreReadOnlyError(FedUnlearnError, PermissionError):
    """A write was asked of a store opened read-only, or of one on a read-only file system."""


class StoreIndex:
    """The open index: verified reads, transactional writes, SQLite errors as store errors."""

    def __init__(self, connection: sqlite3.Connection, path: Path, readonly: bool) -> None:
        self._connection, self.path, self.readonly = connection, path, readonly
        self.version = self._validate()
        #: seals a row's canonical fields with the run and the store (format 4: rows sealed), or
        #: None (plain sha256): :func:`fedunlearn.store.store_identity.bind_rows`
        self.row_seal = None

    def blob_checksum(self, row: BlobRow) -> str:
        """The checksum a blob row carries: its fields' sha256, or their seal (format 4)."""
        if self.row_seal is None:
            return row.row_checksum()
        return self.row_seal("blob", row.canonical())

    def norms_checksum(self, row: NormsRow, layout: str) -> bytes:
        """The raw checksum a norms row carries (its fields and the layout), sealed in format 4."""
        if self.row_seal is None:
            return row.row_checksum(layout)
        return bytes.fromhex(self.row_seal("norms", row.row_checksum(layout)))

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path: Path) -> StoreIndex:
        """A new, empty index at ``path`` (a missing or zero-byte file: nothing to lose)."""
        from fedunlearn.store.durable_io import open_private_file

        # 0600 before SQLite opens it: SQLite gives its journal the database file's mode.
        os.close(open_private_file(path, os.O_RDWR | os.O_CREAT))
        connection = _connect_writable(path)
        with _sqlite_errors(path):
            connection.execute("BEGIN IMMEDIATE")
            exists = connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'blobs'")
            if not exists.fetchall():  # another process may have created it meanwhile
                for statement in _SCHEMA:
                    connection.execute(statement)
                connection.execute(f"PRAGMA user_version = {INDEX_VERSION}")
            connection.execute("COMMIT")
        return cls(connection, path, readonly=False)

    @classmethod
    def open_writable(cls, path: Path) -> StoreIndex:
        index = cls(_connect_writable(path), path, readonly=False)
        problems = index.integrity_problems()
        if problems:  # never act (clean up, migrate) on what a damaged B-tree says
            index.close()
            raise StoreCorruptionError(f"{path} is damaged ({'; '.join(problems)}); {_RESTORE}")
        return index

    @classmethod
    def open_readonly(cls, path: Path) -> StoreIndex:
        """Read-only: no write, no journal, no lock file; ``immutable=1`` on a read-only file
        system where ``mode=ro`` cannot open it (SQLite then skips locking, safe as no one writes)."""
        uri = path.absolute().as_uri()
        try:
            connection = _connect_readonly(f"{uri}?mode=ro")
            connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
        except sqlite3.Error as error:
            journal = path.with_name(path.name + "-journal")
            code = getattr(error, "sqlite_errorcode", 0) & 0xFF
            if not _on_readonly_file_system(path) or code in _BUSY:
                raise _as_store_error(error, path) from None
            if journal.is_file() and journal.stat().st_size > 0:
                raise StoreCorruptionError(
                    f"{path} has an unfinished transaction ({journal}) on a read-only file system; "
                    "mount it writable and open the store once writable (UpdateStore(root)) so "
                    "SQLite rolls it back"
                ) from None
            with _sqlite_errors(path):
                connection = _connect_readonly(f"{uri}?immutable=1")
        return cls(connection, path, readonly=True)

    @classmethod
    def empty(cls, path: Path) -> StoreIndex:
        """An empty index in memory: a read-only view of a store whose index was never created."""
        connection = sqlite3.connect(":memory:", isolation_level=None)
        for statement in _SCHEMA:
            connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {INDEX_VERSION}")
        connection.execute("PRAGMA query_only = ON")
        return cls(connection, path, readonly=True)

    def _validate(self) -> int:
        version = self._sql("PRAGMA user_version")[0][0]
        columns = tuple(row[1] for row in self._sql("PRAGMA table_info(blobs)"))
        if version > NORMS_VERSION:
            raise ConfigError(
                "store-format-version",
                version,
                f"an index of version <= {NORMS_VERSION}; upgrade fedunlearn to read {self.path}",
            )
        checksummed = (*COLUMNS, "row_checksum")
        if (version, columns) not in ((0, COLUMNS), (INDEX_VERSION, checksummed)) and (
            version != NORMS_VERSION or columns != checksummed
        ):
            raise StoreCorruptionError(
                f"{self.path} is not a store index (version {version}, table blobs with columns "
                f"{list(columns)}, expected {list(checksummed)}); {_RESTORE}"
            )
        if version == NORMS_VERSION:
            norms = tuple(row[1] for row in self._sql("PRAGMA table_info(norms)"))
            layout = tuple(row[1] for row in self._sql("PRAGMA table_info(norms_layout)"))
            if norms != NORMS_COLUMNS or layout != ("id", "tensors"):
                raise StoreCorruptionError(
                    f"{self.path} is a version-{version} index without its norms tables (norms "
                    f"{list(norms)}, norms_layout {list(layout)}); {_RESTORE}"
                )
        return version

    @property
    def checksummed(self) -> bool:
        """Whether rows carry checksums (format 2); format-1 rows get sanity checks only."""
        return self.version >= INDEX_VERSION

    @property
    def has_norms(self) -> bool:
        """Whether the norms tables exist (read each time: another writer may have added them)."""
        return self._sql("PRAGMA user_version")[0][0] == NORMS_VERSION

    def integrity_problems(self) -> list[str]:
        """SQLite's ``quick_check`` of the B-trees: [] when sound."""
        found = [row[0] for row in self._sql("PRAGMA quick_check")]
        return [] if found == ["ok"] else found

    # ------------------------------------------------------------------ reading
    def rows(self, round_number: int | None = None) -> list[BlobRow]:
        """Rows (of ``round_number``, or all), ordered by round, kind, client; each one verified.

        Raises StoreCorruptionError naming the first row that fails. Filtering by anything but
        the round (or the path, which the checksum covers and which names the round) happens
        after verification, so no edit of one field can hide a row from its round's readers.
        """
        rows, problems = self.checked_rows(round_number)
        if problems:
            raise StoreCorruptionError(
                f"{problems[0]}; `fedunlearn store verify` lists every damaged row"
            )
        return rows

    def checked_rows(self, round_number: int | None = None) -> tuple[list[BlobRow], list[str]]:
        """(rows that pass, a problem for each row that does not)."""
        where, parameters = "", ()
        if round_number is not None:
            # also the rows whose path names the round: an edited round cannot move a row away
            folder = blob_path(round_number, None).rsplit("/", 1)[0]
            where = "WHERE round = ? OR (path >= ? AND path < ?)"
            parameters = (round_number, folder + "/", folder + "0")  # "0" sorts right after "/"
        extra = ", row_checksum" if self.checksummed else ""
        good, problems = [], []
        for found in self._sql(
            f"SELECT {_SELECT}{extra} FROM blobs {where} ORDER BY round, kind, client", *parameters
        ):
            row = BlobRow(*found[: len(COLUMNS)])
            reason = row.insanity()
            if reason is None and self.checksummed and found[-1] != self.blob_checksum(row):
                reason = "its row checksum does not match its fields"
            if reason is None:
                good.append(row)
            else:
                fields = ", ".join(f"{c}={v!r}" for c, v in zip(COLUMNS, found, strict=False))
                problems.append(
                    f"{self.path}: the row of {row.who} ({fields}) was edited or damaged: "
                    f"{reason}; {_RESTORE}"
                )
        return good, problems

    def has_round(self, round_number: int) -> bool:
        if self._sql("SELECT 1 FROM blobs WHERE round = ? LIMIT 1", round_number):
            return True
        return self.has_norms and bool(
            self._sql("SELECT 1 FROM norms WHERE round = ? LIMIT 1", round_number)
        )

    # ------------------------------------------------------------------ norms
    def norms_layout(self) -> list[str]:
        """The tensor of each float64 of a norms row ([] when no row was ever written)."""
        if not self.has_norms:
            return []
        found = self._sql("SELECT tensors FROM norms_layout WHERE id = 1")
        if not found:
            return []
        try:
            tensors = json_loads(found[0][0])
        except (TypeError, ValueError):
            tensors = None
        if (
            not isinstance(tensors, list)
            or not all(isinstance(t, str) for t in tensors)
            or len(set(tensors)) != len(tensors)
        ):
            raise StoreCorruptionError(
                f"{self.path}: its norms layout {found[0][0]!r} is not a list of distinct "
                f"tensor names; {_RESTORE}"
            )
        return tensors

    def norms_rows(self, round_number: int | None = None) -> list[NormsRow]:
        """Norms rows (of ``round_number``, or all), by round and client, each one verified."""
        rows, problems = self.checked_norms_rows(round_number)
        if problems:
            raise StoreCorruptionError(
                f"{problems[0]}; `fedunlearn store verify` lists every damaged row"
            )
        return rows

    def checked_norms_rows(
        self, round_number: int | None = None
    ) -> tuple[list[NormsRow], list[str]]:
        """(norms rows that pass, a problem for each row that does not)."""
        if not self.has_norms:
            return [], []
        tensors = self.norms_layout()
        layout = json.dumps(tensors)
        where = "" if round_number is None else "WHERE round = ?"
        parameters = () if round_number is None else (round_number,)
        good, problems = [], []
        for *fields, checksum in self._sql(
            f"SELECT {', '.join(NORMS_COLUMNS)} FROM norms {where} ORDER BY round, client",
            *parameters,
        ):
            row = NormsRow(*fields)
            reason = row.insanity(tensors)
            if reason is None and checksum != self.norms_checksum(row, layout):
                reason = "its row checksum does not match its fields and the layout"
            if reason is None:
                good.append(row)
            else:
                problems.append(
                    f"{self.path}: the norms row of {describe(row.round, row.client)} was "
                    f"edited or damaged: {reason}; {_RESTORE}"
                )
        return good, problems

    def insert_norms(self, rows: Iterable[NormsRow], tensors: list[str]) -> None:
        """Insert norms rows packed in ``tensors`` order (inside :meth:`transaction`); the first
        ones create the norms tables (version 3) and fix the store's layout."""
        if not self.has_norms:
            for statement in _NORMS_SCHEMA:
                self._connection.execute(statement)
            self._connection.execute(f"PRAGMA user_version = {NORMS_VERSION}")
        layout = self.norms_layout()
        if not layout:
            self._connection.execute(
                "INSERT INTO norms_layout (id, tensors) VALUES (1, ?)", (json.dumps(tensors),)
            )
        elif layout != list(tensors):
            raise ConfigError(
                "norms", tensors, f"the tensors of the store's earlier norms rows: {layout}"
            )
        text = json.dumps(list(tensors))
        self._connection.executemany(
            f"INSERT INTO norms ({', '.join(NORMS_COLUMNS)}) VALUES (?, ?, ?, ?, ?)",
            [(*row, self.norms_checksum(row, text)) for row in rows],
        )

    def delete_norms(self, rows: Iterable[NormsRow]) -> None:
        """Delete norms ``rows`` by (round, client) (inside :meth:`transaction`)."""
        self._connection.executemany(
            "DELETE FROM norms WHERE round = ? AND client = ?",
            [(row.round, row.client) for row in rows],
        )

    def paths(self) -> set[str]:
        """Every path the index names, rows unverified: what a cleanup must never remove."""
        return {row[0] for row in self._sql("SELECT path FROM blobs")}

    def count(self) -> int:
        return self._sql("SELECT COUNT(*) FROM blobs")[0][0]

    def norms_count(self) -> int:
        return self._sql("SELECT COUNT(*) FROM norms")[0][0] if self.has_norms else 0

    def total_bytes(self) -> int:
        """Blob bytes plus what the norms rows keep (:attr:`NormsRow.bytes`), summed by SQLite:
        counted, not verified (a cheap figure for every round's metrics)."""
        total = self._sql("SELECT COALESCE(SUM(bytes), 0) FROM blobs")[0][0]
        if self.has_norms:
            total += self._sql("SELECT COALESCE(SUM(56 + LENGTH(squares)), 0) FROM norms")[0][0]
        return int(total)

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        if self.readonly:
            raise StoreReadOnlyError(f"{self.path} is open read-only")
        with _sqlite_errors(self.path):
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._connection.execute("COMMIT")
            except BaseException:
                if self._connection.in_transaction:  # also when COMMIT itself failed (busy, I/O)
                    self._connection.execute("ROLLBACK")
                raise

    def insert(self, rows: Iterable[BlobRow]) -> None:
        """Insert ``rows`` (inside :meth:`transaction`), each with its row checksum."""
        self._connection.executemany(
            f"INSERT INTO blobs ({_SELECT}, row_checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*row, self.blob_checksum(row)) for row in rows],
        )

    def delete(self, rows: Iterable[BlobRow]) -> None:
        """Delete ``rows`` by path (inside :meth:`transaction`)."""
        self._connection.executemany(
            "DELETE FROM blobs WHERE path = ?", [(row.path,) for row in rows]
        )

    def vacuum(self) -> None:
        self._sql("VACUUM")

    def migrate(self) -> bool:
        """Give a format-1 index its row checksums, in one transaction; False if nothing to do.

        Format-1 rows were never checksummed, so they are taken as they are (after the sanity
        checks); from here on any change to them is detected.
        """
        if self.checksummed:
            return False
        with self.transaction():
            if self._sql("PRAGMA user_version")[0][0] == INDEX_VERSION:
                self.version = INDEX_VERSION  # another process migrated it while we waited
                return False
            self._sql("ALTER TABLE blobs ADD COLUMN row_checksum TEXT")
            updates = []
            for rowid, *fields in self._sql(f"SELECT rowid, {_SELECT} FROM blobs"):
                row = BlobRow(*fields)
                reason = row.insanity()
                if reason is not None:
                    raise StoreCorruptionError(
                        f"{self.path}: the row of {row.who} cannot be migrated: {reason}; {_RESTORE}"
                    )
                updates.append((row.row_checksum(), rowid))
            self._connection.executemany(
                "UPDATE blobs SET row_checksum = ? WHERE rowid = ?", updates
            )
            self._sql(f"PRAGMA user_version = {INDEX_VERSION}")
        self.version = INDEX_VERSION
        return True

    def close(self) -> None:
        self._connection.close()

    def _sql(self, query: str, *parameters: object) -> list[tuple]:
        with _sqlite_errors(self.path):
            return self._connection.execute(query, parameters).fetchall()


def _connect_writable(path: Path) -> sqlite3.Connection:
    # Autocommit mode: transactions are begun explicitly, so a round's rows commit together.
    with _sqlite_errors(path):
        connection = sqlite3.connect(path, isolation_level=None, timeout=30)
        # secure_delete zeroes freed pages; WAL would keep old pages in a side file, hence DELETE.
        for pragma in ("secure_delete=ON", "journal_mode=DELETE", "synchronous=FULL"):
            connection.execute(f"PRAGMA {pragma}")
    return connection


def _connect_readonly(uri: str) -> sqlite3.Connection:
    connection = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
    connection.execute("PRAGMA query_only = ON")  # a connection setting: writes nothing
    return connection


def _on_readonly_file_system(path: Path) -> bool:
    if not hasattr(os, "statvfs"):
        return False
    return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)


def _as_store_error(error: sqlite3.Error, path: Path) -> FedUnlearnError:
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code in _BUSY:
        return StoreBusyError(f"{path} is locked by a writer ({error}); retry once it is done")
    if code == _SQLITE_READONLY:
        return StoreReadOnlyError(f"{path} cannot be written ({error}); open the store read-only")
    return StoreCorruptionError(f"{path} is not a readable store index ({error}); {_RESTORE}")


@contextlib.contextmanager
def _sqlite_errors(path: Path) -> Iterator[None]:
    """Turn an ``sqlite3`` error into the store error it means."""
    try:
        yield
    except sqlite3.Error as error:
        raise _as_store_error(error, path) from error
