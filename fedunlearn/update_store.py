"""Durable, crash-safe store of the client updates and global models that FedEraser retains.

FedEraser (Liu et al., 2021) calibrates an unlearned model from the updates U_k^t = M_k^t - M^t
that each client k sent at the retained rounds t_1 = 1, t_{j+1} = t_j + Δt, and from the global
models M^t of those rounds. This store is the server's only durable memory of them, so:

* every blob (one per round's global model, one per (round, client) update, safetensors) is
  written to a temporary file, fsynced and renamed into place;
* a round exists only once all its rows of the SQLite index, each with the blob's sha256, are
  committed in one transaction; blobs of rounds that never committed (a crash) are removed the
  next time the store is opened, so a half-written round is never read as valid;
* every read verifies the checksum, and ``delete_client`` unlinks the client's blobs and vacuums
  the index (``secure_delete``) so that no file under the root keeps a byte of its updates.

Layout::

    root/store.json                                      format version, dtype, user metadata
    root/index.sqlite                                    one row per blob
    root/.lock                                           advisory lock held while writing
    root/blobs/round_000003/global.safetensors           M^3
    root/blobs/round_000003/client_000007.safetensors    U_7^3
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import numbers
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import safetensors.torch
import torch

from fedunlearn.errors import ConfigError, FedUnlearnError, StoreCorruptionError

try:
    import fcntl
except ImportError:  # no advisory locks on Windows: the single-writer rule is then the caller's
    fcntl = None

State = Mapping[str, torch.Tensor]
FORMAT_NAME = "fedunlearn-update-store"
FORMAT_VERSION = 1
STORE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
_HEADER, _INDEX, _LOCK, _BLOBS = "store.json", "index.sqlite", ".lock", "blobs"
_ROUND_DIRECTORY = re.compile(r"round_\d{6,}")
# Only names this module creates are ever removed, so foreign files under blobs/ survive.
_OWN_FILE = re.compile(r"(client_\d{6,}|global)\.safetensors|\..+\.safetensors\.tmp")
_COLUMNS = "round, client, kind, num_examples, dtype, bytes, checksum, path"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    round INTEGER NOT NULL,
    client INTEGER,                 -- NULL for the global model
    kind TEXT NOT NULL CHECK (kind IN ('update', 'global')),
    num_examples INTEGER,           -- NULL for the global model
    dtype TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    checksum TEXT NOT NULL,         -- sha256 of the file, hex
    path TEXT NOT NULL UNIQUE       -- relative to the root; encodes (round, client, kind)
);
CREATE INDEX IF NOT EXISTS blobs_by_round ON blobs (round);
CREATE INDEX IF NOT EXISTS blobs_by_client ON blobs (client);
"""


class StoreBusyError(FedUnlearnError, RuntimeError):
    """Another writer (process, or ``UpdateStore`` object) holds the store's write lock."""


@dataclass
class RetainedRound:
    """One retained round: the global model M^t and the selected clients' updates U_k^t."""

    round: int
    global_model: dict[str, torch.Tensor]
    updates: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    num_examples: dict[int, int] = field(default_factory=dict)

    @property
    def clients(self) -> list[int]:
        """Clients whose updates this round holds, ascending."""
        return sorted(self.updates)


def _check_integer(parameter: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(parameter, value, f"an integer >= {minimum}")
    return int(value)


def _client_set(parameter: str, clients: int | Iterable[int]) -> set[int]:
    values = [clients] if isinstance(clients, numbers.Integral) else clients
    return {_check_integer(parameter, client, 0) for client in values}


def _blob_path(round_number: int, client: int | None) -> str:
    name = "global" if client is None else f"client_{client:06d}"
    return f"{_BLOBS}/round_{round_number:06d}/{name}.safetensors"


def _describe(round_number: int, client: int | None) -> str:
    return f"round {round_number}, " + ("global model" if client is None else f"client {client}")


def _fsync_directory(directory: Path) -> None:
    # A rename or unlink is durable only once the directory entry itself reaches the disk.
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_durably(path: Path, data: bytes) -> None:
    """Write through a fsynced temporary file and a rename: a crash leaves all of it or none."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _encode(tensors: State, store_dtype: torch.dtype, what: str, metadata: dict) -> bytes:
    """Serialize a state dict: floats cast to the store dtype, all contiguous on the CPU."""
    if not isinstance(tensors, Mapping):
        raise ConfigError(what, type(tensors).__name__, "a state dict (str -> torch.Tensor)")
    prepared: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"{what}[{name!r}]", type(tensor).__name__, "a torch.Tensor")
        tensor = tensor.detach()
        if not tensor.is_floating_point():
            cast = tensor.to(device="cpu")
        else:
            cast = tensor.to(device="cpu", dtype=store_dtype)
            # float16 overflows to inf past 65504; an infinite update would poison calibration.
            if (torch.isinf(cast) & torch.isfinite(tensor).cpu()).any():
                raise ConfigError(
                    f"{what}[{name!r}]",
                    "values beyond ±65504",
                    "values within float16 range; use store dtype 'float32'",
                )
        cast = cast.contiguous()
        # safetensors refuses tensors that share memory (tied weights): give each its own copy.
        if cast.untyped_storage().data_ptr() in storages:
            cast = cast.clone()
        storages.add(cast.untyped_storage().data_ptr())
        prepared[name] = cast
    return safetensors.torch.save(prepared, metadata=metadata)


class RoundWriter:
    """Writes one round's blobs and commits its index rows only on a clean ``with`` exit.

    Obtained from :meth:`UpdateStore.begin_round`. Entering the block takes the store's write
    lock and writes the global model; :meth:`add_update` writes each blob at once, so memory
    holds one update at a time. Leaving the block by an exception removes the round's files.
    """

    def __init__(self, store: UpdateStore, round_number: int, global_model: State) -> None:
        self._store, self.round, self._global_model = store, round_number, global_model
        self._directory = store.root / _BLOBS / f"round_{round_number:06d}"
        self._rows: list[tuple] = []
        self._open = False
        self._lock = contextlib.ExitStack()

    @property
    def clients(self) -> list[int]:
        """Clients added so far, in the order they were added."""
        return [row[1] for row in self._rows if row[1] is not None]

    def __enter__(self) -> RoundWriter:
        if self._global_model is None:
            raise ConfigError("round-writer", self.round, "a fresh store.begin_round() per block")
        self._lock.enter_context(self._store._exclusive())
        try:
            self._store._require_uncommitted(self.round)  # again, now that the lock is held
            if self._directory.exists():  # files of a crashed earlier attempt at this round
                self._store._remove_unindexed(self._directory, set())
            self._directory.mkdir(parents=True)
            self._write(None, self._global_model, None)
            self._global_model = None  # written: do not keep it alive for the whole round
        except BaseException:
            self._discard()
            raise
        self._open = True
        return self

    def add_update(self, client: int, update: State, num_examples: int) -> None:
        """Write client ``client``'s update U_k^t, computed on ``num_examples`` samples."""
        if not self._open:
            raise ConfigError("round-writer", self.round, "add_update inside its `with` block")
        client = _check_integer("client", client, 0)
        num_examples = _check_integer("num_examples", num_examples, 1)
        if client in self.clients:
            raise ConfigError(
                "client",
                client,
                f"each client once per round, but round {self.round} already has client {client}",
            )
        self._write(client, update, num_examples)

    def __exit__(self, exception_type, exception, traceback) -> None:
        if exception_type is not None or not self._open:
            self._discard()
            return
        try:
            _fsync_directory(self._directory)
            _fsync_directory(self._directory.parent)
            self._store._insert_rows(self.round, self._rows)
        except BaseException:
            self._discard()
            raise
        self._open = False
        self._lock.close()

    def _write(self, client: int | None, tensors: State, num_examples: int | None) -> None:
        kind = "global" if client is None else "update"
        metadata = {"format": FORMAT_NAME, "round": str(self.round), "client": str(client)}
        dtype = self._store.dtype
        data = _encode(tensors, STORE_DTYPES[dtype], f"{kind} of client {client}", metadata)
        relative = _blob_path(self.round, client)
        _write_durably(self._store.root / relative, data)
        checksum = hashlib.sha256(data).hexdigest()
        self._rows.append(
            (self.round, client, kind, num_examples, dtype, len(data), checksum, relative)
        )

    def _discard(self) -> None:
        try:
            if self._directory.exists():
                self._store._remove_unindexed(self._directory, set())
        finally:
            self._open, self._rows = False, []
            self._lock.close()


class UpdateStore:
    """A directory retaining FedEraser's global models and client updates, round by round.

    Parameters
    ----------
    root
        Store directory; created if missing, reopened if it already holds a store.
    dtype
        ``"float32"`` or ``"float16"``: how floating tensors are stored (they are always read
        back as float32). ``None`` means ``"float32"`` for a new store and the recorded dtype
        for an existing one; an explicit dtype other than the recorded one is an error.

    Raises
    ------
    ConfigError
        Unknown dtype, a dtype other than the store's, or a store of a newer format.
    StoreCorruptionError
        ``store.json`` is unreadable, or missing while ``index.sqlite`` exists.
    """

    def __init__(self, root: str | os.PathLike, dtype: str | None = None) -> None:
        self.root = Path(root)
        if dtype is not None and dtype not in STORE_DTYPES:
            raise ConfigError("store-dtype", dtype, "'float32' or 'float16'")
        self._lock_handle, self._lock_depth = None, 0
        if (self.root / _HEADER).exists():
            header = self._read_header()
            if header.get("format") != FORMAT_NAME:
                raise StoreCorruptionError(
                    f"{self.root / _HEADER} has format {header.get('format')!r}, expected "
                    f"{FORMAT_NAME!r}; point UpdateStore at a store directory"
                )
            if header["format_version"] > FORMAT_VERSION:
                raise ConfigError(
                    "store-format-version",
                    header["format_version"],
                    f"<= {FORMAT_VERSION}; upgrade fedunlearn to read {self.root}",
                )
            if dtype not in (None, header["dtype"]):
                raise ConfigError(
                    "store-dtype",
                    dtype,
                    f"{header['dtype']!r}, the dtype {self.root} was created with (or omit dtype)",
                )
        elif (self.root / _INDEX).exists():
            raise StoreCorruptionError(
                f"{self.root / _HEADER} is missing but the index exists; "
                "restore store.json from a backup"
            )
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            header = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "dtype": dtype or "float32",
                "metadata": {},
                "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            }
            self._write_header(header)
        self._dtype: str = header["dtype"]
        (self.root / _BLOBS).mkdir(exist_ok=True)
        # Autocommit mode: transactions are begun explicitly, so a round's rows commit together.
        self._connection = sqlite3.connect(self.root / _INDEX, isolation_level=None, timeout=30)
        # secure_delete zeroes freed pages; WAL would keep old pages in a side file, hence DELETE.
        for pragma in ("secure_delete=ON", "journal_mode=DELETE", "synchronous=FULL"):
            self._connection.execute(f"PRAGMA {pragma}")
        self._connection.executescript(_SCHEMA)
        self._remove_uncommitted_files()

    @property
    def dtype(self) -> str:
        """How floating tensors are stored: ``"float32"`` or ``"float16"``."""
        return self._dtype

    @property
    def metadata(self) -> dict:
        """User metadata recorded with :meth:`set_metadata` (a fresh copy, read from disk)."""
        return self._read_header()["metadata"]

    def set_metadata(self, **values: object) -> None:
        """Merge JSON-serializable ``values`` into the user metadata; rewritten atomically."""
        try:
            json.dumps(values, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ConfigError("metadata", values, f"JSON-serializable values ({error})") from None
        with self._exclusive():
            header = self._read_header()
            header["metadata"].update(values)
            self._write_header(header)

    # ------------------------------------------------------------------ writing
    def begin_round(self, round: int, global_model: State) -> RoundWriter:
        """Start writing round ``round`` (>= 1, not committed); use the writer in a ``with``."""
        round_number = _check_integer("round", round, 1)
        self._require_uncommitted(round_number)
        return RoundWriter(self, round_number, global_model)

    def write_round(
        self, round: int, global_model: State, updates: Mapping[int, tuple[State, int]]
    ) -> None:
        """Write and commit a whole round; ``updates`` maps client to (update, num_examples)."""
        if not isinstance(updates, Mapping):
            raise ConfigError("updates", type(updates).__name__, "a mapping client -> (update, n)")
        with self.begin_round(round, global_model) as writer:
            for client, (update, num_examples) in updates.items():
                writer.add_update(client, update, num_examples)

    def delete_client(self, client: int) -> int:
        """Physically remove every blob and index row of ``client``; return the blob count.

        Rows go first: a crash before the unlinks then leaves unindexed files, which the next
        open removes, rather than rows naming missing files. VACUUM then rebuilds the index so
        that no page keeps the rows. Erasing the disk blocks of unlinked files is up to the
        filesystem; keep the store on encrypted storage where that matters.
        """
        client = _check_integer("client", client, 0)
        with self._exclusive():
            deleted = self._delete_where("client = ?", client)
            self._sql("VACUUM")
        return len(deleted)

    def delete_rounds_after(self, round: int) -> list[int]:
        """Physically remove every committed round after ``round`` (>= 0); return those rounds.

        A resumed training run calls this with its last checkpointed round: a round the store
        committed after that checkpoint (the crash came between the two) is trained again, and
        would otherwise be retained twice. Rows go first, as in :meth:`delete_client`.
        """
        round_number = _check_integer("round", round, 0)
        with self._exclusive():
            deleted = self._delete_where("round > ?", round_number)
            for directory in {(self.root / path).parent for _, path in deleted}:
                if not any(directory.iterdir()):
                    directory.rmdir()
                    _fsync_directory(directory.parent)
        return sorted({r for r, _ in deleted})

    # ------------------------------------------------------------------ reading
    def rounds(self) -> list[int]:
        """Committed rounds, ascending."""
        return [
            row[0]
            for row in self._sql("SELECT round FROM blobs WHERE kind = 'global' ORDER BY round")
        ]

    def clients(self, round: int | None = None) -> list[int]:
        """Clients with an update in ``round`` (in any round when ``None``), ascending."""
        if round is None:
            rows = self._sql(
                "SELECT DISTINCT client FROM blobs WHERE kind = 'update' ORDER BY client"
            )
        else:
            rows = self._sql(
                "SELECT client FROM blobs WHERE kind = 'update' AND round = ? ORDER BY client",
                self._require_committed(round),
            )
        return [row[0] for row in rows]

    def num_examples(self, round: int) -> dict[int, int]:
        """Sample count N_k of each client with an update in ``round``."""
        return dict(
            self._sql(
                "SELECT client, num_examples FROM blobs WHERE kind = 'update' "
                "AND round = ? ORDER BY client",
                self._require_committed(round),
            )
        )

    def read_global(self, round: int) -> dict[str, torch.Tensor]:
        """The global model M^round, checksum-verified, floating tensors as float32."""
        round_number = self._require_committed(round)
        [(path, checksum)] = self._sql(
            "SELECT path, checksum FROM blobs WHERE kind = 'global' AND round = ?", round_number
        )
        return self._read_blob(round_number, None, path, checksum)

    def read_update(self, round: int, client: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s update U_k^round, checksum-verified, floating tensors as float32."""
        round_number = self._require_committed(round)
        client = _check_integer("client", client, 0)
        rows = self._sql(
            "SELECT path, checksum FROM blobs WHERE kind = 'update' AND round = ? AND client = ?",
            round_number,
            client,
        )
        if not rows:
            raise ConfigError(
                "client",
                client,
                f"a client with an update in round {round_number}: {self.clients(round_number)}",
            )
        return self._read_blob(round_number, client, *rows[0])

    def read_round(
        self,
        round: int,
        clients: int | Iterable[int] | None = None,
        exclude: int | Iterable[int] = (),
    ) -> RetainedRound:
        """Read one round: its global model and the updates of ``clients`` (all when ``None``).

        Listed clients without an update in this round are skipped, since participation varies
        from round to round; clients in ``exclude`` are never read.
        """
        round_number = self._require_committed(round)
        wanted = None if clients is None else _client_set("clients", clients)
        excluded = _client_set("exclude", exclude)
        retained = RetainedRound(round_number, self.read_global(round_number))
        for client, num_examples, path, checksum in self._sql(
            "SELECT client, num_examples, path, checksum FROM blobs WHERE kind = 'update' "
            "AND round = ? ORDER BY client",
            round_number,
        ):
            if client not in excluded and (wanted is None or client in wanted):
                retained.updates[client] = self._read_blob(round_number, client, path, checksum)
                retained.num_examples[client] = num_examples
        return retained

    def iter_rounds(
        self, clients: int | Iterable[int] | None = None, exclude: int | Iterable[int] = ()
    ) -> Iterator[RetainedRound]:
        """Yield :meth:`read_round` of each committed round, ascending, one round in memory."""
        # sets now: a generator argument would otherwise be used up by the first round
        clients = None if clients is None else _client_set("clients", clients)
        exclude = _client_set("exclude", exclude)
        for round_number in self.rounds():
            yield self.read_round(round_number, clients=clients, exclude=exclude)

    def verify(self) -> list[str]:
        """Check every blob against its recorded checksum; return the problems (never raises)."""
        problems = []
        for round_number, client, size, checksum, path in self._sql(
            "SELECT round, client, bytes, checksum, path FROM blobs ORDER BY round, kind, client"
        ):
            who = f"{_describe(round_number, client)}: blob {self.root / path}"
            digest = hashlib.sha256()
            try:
                with open(self.root / path, "rb") as handle:  # chunked: never a whole blob held
                    for chunk in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023
                        digest.update(chunk)
            except OSError as error:
                problems.append(f"{who} is missing or unreadable ({error})")
            else:
                if digest.hexdigest() != checksum:
                    problems.append(
                        f"{who} has sha256 {digest.hexdigest()}, expected {checksum} "
                        f"(recorded size {size} bytes)"
                    )
        return problems

    def index(self) -> pd.DataFrame:
        """The index, one row per blob, ordered by round, kind, client."""
        frame = pd.read_sql_query(
            f"SELECT {_COLUMNS} FROM blobs ORDER BY round, kind, client", self._connection
        )
        # nullable integers: the global model's client and num_examples are NULL
        integers = {"round": "int64", "bytes": "int64", "client": "Int64", "num_examples": "Int64"}
        return frame.astype(integers)

    def total_bytes(self) -> int:
        """Total size of the committed blobs, in bytes."""
        return self._sql("SELECT COALESCE(SUM(bytes), 0) FROM blobs")[0][0]

    def bytes_per_round(self) -> dict[int, int]:
        """Size of each committed round's blobs, in bytes."""
        return dict(self._sql("SELECT round, SUM(bytes) FROM blobs GROUP BY round ORDER BY round"))

    def __len__(self) -> int:
        return self._sql("SELECT COUNT(*) FROM blobs WHERE kind = 'global'")[0][0]

    def __repr__(self) -> str:
        rounds = self.rounds()
        span = f" ({rounds[0]}..{rounds[-1]})" if rounds else ""
        return (
            f"UpdateStore(root={str(self.root)!r}, dtype={self._dtype!r}, rounds={len(rounds)}"
            f"{span}, clients={len(self.clients())}, bytes={self.total_bytes()})"
        )

    def close(self) -> None:
        """Close the index; the store object is unusable afterwards."""
        self._connection.close()

    def __enter__(self) -> UpdateStore:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _sql(self, query: str, *parameters: object) -> list[tuple]:
        return self._connection.execute(query, parameters).fetchall()

    def _read_header(self) -> dict:
        try:
            return json.loads((self.root / _HEADER).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise StoreCorruptionError(
                f"{self.root / _HEADER} is unreadable ({error}), expected "
                "the store's JSON header; restore it from a backup"
            ) from error

    def _write_header(self, header: dict) -> None:
        _write_durably(self.root / _HEADER, json.dumps(header, indent=2, sort_keys=True).encode())
        _fsync_directory(self.root)

    def _read_blob(
        self, round_number: int, client: int | None, path: str, checksum: str
    ) -> dict[str, torch.Tensor]:
        who = f"{_describe(round_number, client)}: blob {self.root / path}"
        advice = "restore it from a backup or retrain; store.verify() lists every damaged blob"
        try:
            data = (self.root / path).read_bytes()
        except FileNotFoundError:
            raise StoreCorruptionError(f"{who} is missing but indexed; {advice}") from None
        found = hashlib.sha256(data).hexdigest()
        if found != checksum:
            raise StoreCorruptionError(f"{who} has sha256 {found}, expected {checksum}; {advice}")
        tensors = safetensors.torch.load(data)
        return {
            name: tensor.float() if tensor.is_floating_point() else tensor
            for name, tensor in tensors.items()
        }

    def _require_committed(self, round: int) -> int:
        round_number = _check_integer("round", round, 1)
        if not self._sql("SELECT 1 FROM blobs WHERE round = ? LIMIT 1", round_number):
            rounds = self.rounds()
            listed = rounds if len(rounds) <= 10 else f"{rounds[:3]}...{rounds[-3:]}"
            raise ConfigError("round", round, f"a committed round of {self.root}: {listed}")
        return round_number

    def _require_uncommitted(self, round_number: int) -> None:
        if self._sql("SELECT 1 FROM blobs WHERE round = ? LIMIT 1", round_number):
            raise ConfigError(
                "round",
                round_number,
                f"a new round, but round {round_number} is already committed in {self.root} "
                "(rounds are immutable); write another round",
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._connection.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._connection.execute("COMMIT")
        except BaseException:
            if self._connection.in_transaction:  # also when COMMIT itself failed (busy, I/O)
                self._connection.execute("ROLLBACK")
            raise

    def _insert_rows(self, round_number: int, rows: list[tuple]) -> None:
        with self._transaction():
            self._require_uncommitted(round_number)
            self._connection.executemany(
                f"INSERT INTO blobs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows
            )

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the write lock: re-entrant within this object, exclusive across objects."""
        if self._lock_depth == 0:
            handle = open(self.root / _LOCK, "a+b")  # noqa: SIM115 - held beyond this block
            if fcntl is not None:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    raise StoreBusyError(
                        f"another writer holds {self.root / _LOCK}; a store has "
                        "one writer at a time - retry once it is done"
                    ) from None
            self._lock_handle = handle
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                self._lock_handle.close()  # closing the file releases the flock
                self._lock_handle = None

    def _delete_where(self, condition: str, value: int) -> list[tuple[int, str]]:
        """Delete the index rows matching ``condition`` (SQL with one ``?``), then their files;
        return the (round, path) of each. Rows go first: a crash before the unlinks then leaves
        unindexed files, which the next open removes, rather than rows naming missing files."""
        rows = self._sql(f"SELECT round, path FROM blobs WHERE {condition}", value)
        with self._transaction():
            self._sql(f"DELETE FROM blobs WHERE {condition}", value)
        for _, path in rows:
            (self.root / path).unlink(missing_ok=True)
        for directory in {(self.root / path).parent for _, path in rows}:
            _fsync_directory(directory)
        return rows

    def _remove_unindexed(self, directory: Path, committed: set[str]) -> None:
        """Remove this module's files in ``directory`` that no committed index row names."""
        removed = False
        for file in directory.iterdir():
            relative = f"{_BLOBS}/{directory.name}/{file.name}"
            if _OWN_FILE.fullmatch(file.name) and relative not in committed:
                file.unlink()
                removed = True
        if not any(directory.iterdir()):
            directory.rmdir()
            _fsync_directory(directory.parent)
        elif removed:
            _fsync_directory(directory)

    def _remove_uncommitted_files(self) -> None:
        """Delete blobs and temporary files of rounds that never committed (a crash's leftovers)."""
        try:
            with self._exclusive():
                committed = {row[0] for row in self._sql("SELECT path FROM blobs")}
                for directory in (self.root / _BLOBS).iterdir():
                    if directory.is_dir() and _ROUND_DIRECTORY.fullmatch(directory.name):
                        self._remove_unindexed(directory, committed)
                (self.root / f".{_HEADER}.tmp").unlink(missing_ok=True)
        except StoreBusyError:
            pass  # a writer is mid-round right now: its files are work in progress, not leftovers
