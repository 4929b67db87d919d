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

Formats: 2 (this version) checksums index rows; a format-1 store (no row checksums) is migrated
by the first writable open, and read as it is, with a note, by a read-only one.

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

import contextlib
import datetime
import errno
import hashlib
import json
import numbers
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import safetensors.torch
import torch
from safetensors import SafetensorError, safe_open

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.durable_io import (
    PRIVATE_DIRECTORY_MODE,
    PRIVATE_FILE_MODE,
    atomic_write_bytes,
    atomic_write_json,
    fsync_directory,
    json_loads,
    json_sha256,
    open_private_file,
    private_directory,
)
from fedunlearn.store.index import (
    COLUMNS,
    BlobRow,
    NormsRow,
    StoreBusyError,
    StoreIndex,
    StoreReadOnlyError,
    blob_path,
)

try:
    import fcntl
except ImportError:  # no advisory locks on Windows: the single-writer rule is then the caller's
    fcntl = None

__all__ = [
    "FORMAT_VERSION",
    "STORE_DTYPES",
    "RetainedRound",
    "RoundWriter",
    "StoreBusyError",
    "StoreReadOnlyError",
    "UpdateStore",
]

State = Mapping[str, torch.Tensor]
FORMAT_NAME = "fedunlearn-update-store"
#: 2: index rows carry checksums; 3: so does every field of the header's metadata (the retention
#: record and the policies' states, which decide what a method reads and where it rolls back).
FORMAT_VERSION = 3
#: The header's per-field checksums of its metadata (format 3).
METADATA_DIGESTS = "metadata_sha256"
STORE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
_HEADER, _INDEX, _LOCK, _BLOBS = "store.json", "index.sqlite", ".lock", "blobs"
_ROUND_DIRECTORY = re.compile(r"round_\d{6,}")
# Only names this module creates are ever removed, so foreign files under blobs/ survive.
_OWN_FILE = re.compile(
    r"(client_\d{6,}|global)\.safetensors|\.(client_\d{6,}|global)\.safetensors(\.\w+)?\.tmp"
)
#: Metadata key of an update blob's squared norms per tensor (JSON), covered by the blob's sha256.
SQUARES_KEY = "squares"
_BLOB_ADVICE = "restore it from a backup or retrain; store.verify() lists every damaged blob"


@dataclass
class RetainedRound:
    """One retained round: the global model M^t and the selected clients' updates U_k^t.

    A client kept as norms only (``retain-mode = norms``) has ``num_examples`` and ``squares`` but
    no entry in ``updates``; a round that kept no global model has ``global_model = None``."""

    round: int
    global_model: dict[str, torch.Tensor] | None
    updates: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    num_examples: dict[int, int] = field(default_factory=dict)
    #: Per client and floating tensor, the squared norm ‖U_k^t[tensor]‖² the store recorded for the
    #: update: computed from the stored values, or given by the writer (a rewritten history keeps
    #: the norms of the updates it replaces, which is all FedEraser's eq. 2 reads of them).
    squares: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def clients(self) -> list[int]:
        """Clients this round kept (an update, or its norms), ascending."""
        return sorted(self.num_examples)

    @property
    def norms_only(self) -> list[int]:
        """Clients of which this round kept only the norms, ascending."""
        return sorted(set(self.num_examples) - set(self.updates))


def _check_integer(parameter: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(parameter, value, f"an integer >= {minimum}")
    return int(value)


def _client_set(parameter: str, clients: int | Iterable[int]) -> set[int]:
    values = [clients] if isinstance(clients, numbers.Integral) else clients
    return {_check_integer(parameter, client, 0) for client in values}


def _non_finite(tensor: torch.Tensor) -> int:
    """How many NaN or ±Inf values a floating tensor holds (0 for other dtypes)."""
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return 0  # the common case in one reduction
    return int((~torch.isfinite(tensor)).sum())


def squared_norms(tensors: State) -> dict[str, float]:
    """``‖t‖²`` of each floating tensor, summed in float64 (the arithmetic FedEraser's eq. 2 uses)."""
    return {
        name: float(t.detach().double().pow(2).sum())
        for name, t in tensors.items()
        if t.is_floating_point()
    }


def _check_squares(what: str, squares: Mapping[str, float], tensors: State) -> dict[str, float]:
    """Recorded squared norms: one finite number >= 0 per floating tensor of ``tensors``."""
    names = {name for name, t in tensors.items() if t.is_floating_point()}
    values = {}
    for name, value in dict(squares).items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(f"{what} squares[{name!r}]", value, "a number")
        values[name] = float(value)
    if set(values) != names or not all(v >= 0 and v < float("inf") for v in values.values()):
        raise ConfigError(
            f"{what} squares",
            values,
            f"one finite number >= 0 per floating tensor ({sorted(names)})",
        )
    return values


def _metadata_digests(metadata: Mapping[str, object]) -> dict[str, str]:
    """sha256 of each metadata field's canonical JSON (sorted keys, no spaces)."""
    return {key: json_sha256(value) for key, value in metadata.items()}


def _blob_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file held in ``data`` (its JSON header)."""
    size = int.from_bytes(data[:8], "little")
    try:
        header = json_loads(data[8 : 8 + size])
    except ValueError:
        return {}
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _encode(tensors: State, store_dtype: torch.dtype, what: str, metadata: dict) -> bytes:
    """Serialize a state dict: floats cast to the store dtype, all contiguous on the CPU."""
    return safetensors.torch.save(_prepare(tensors, store_dtype, what), metadata=metadata)


def _prepare(tensors: State, store_dtype: torch.dtype, what: str) -> dict[str, torch.Tensor]:
    """The tensors as they will be stored: checked finite, floats cast to the store dtype,
    contiguous on the CPU, no two sharing memory."""
    if not isinstance(tensors, Mapping):
        raise ConfigError(what, type(tensors).__name__, "a state dict (str -> torch.Tensor)")
    prepared: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"{what}[{name!r}]", type(tensor).__name__, "a torch.Tensor")
        tensor = tensor.detach()
        bad = _non_finite(tensor)
        if bad:  # a NaN or Inf in U_k^t would poison every calibrated model built from it
            raise ConfigError(
                f"{what}[{name!r}]",
                f"{bad} NaN/Inf value(s) of {tensor.numel()}",
                "finite values only; the store never keeps a non-finite tensor (a diverged "
                "client or model: lower the learning rate or leave the client out)",
            )
        if not tensor.is_floating_point():
            cast = tensor.to(device="cpu")
        else:
            cast = tensor.to(device="cpu", dtype=store_dtype)
            # float16 overflows to inf past 65504; an infinite update would poison calibration.
            if not torch.isfinite(cast).all():
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
    return prepared


def _recorded_squares(row, metadata: Mapping[str, str], update: State) -> dict[str, float]:
    """The squared norms recorded with an update (its own values' for stores written before
    norms were recorded); a blob whose recorded norms do not fit its tensors is corrupt."""
    if SQUARES_KEY not in metadata:
        return squared_norms(update)
    try:
        return _check_squares(row.who, json_loads(metadata[SQUARES_KEY]), update)
    except (ValueError, ConfigError) as error:
        raise StoreCorruptionError(
            f"{row.who}: its recorded norms are unreadable ({error})"
        ) from None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # chunked: never a whole blob held
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class RoundWriter:
    """Writes one round's blobs and commits its index rows only on a clean ``with`` exit.

    Obtained from :meth:`UpdateStore.begin_round`. Entering the block takes the store's write
    lock and writes the global model; :meth:`add_update` writes each blob at once, so memory
    holds one update at a time. Leaving the block by an exception removes the round's files.
    """

    def __init__(self, store: UpdateStore, round_number: int, global_model: State | None) -> None:
        self._store, self.round, self._global_model = store, round_number, global_model
        self._directory = store.root / _BLOBS / f"round_{round_number:06d}"
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
        prepared = _prepare(update, STORE_DTYPES[self._store.dtype], what)
        squares = squared_norms(prepared) if squares is None else squares
        self._norms.append((client, num_examples, _check_squares(what, squares, prepared)))

    def _check_new(self, client: int, num_examples: int, method: str) -> tuple[int, int]:
        if not self._open:
            raise ConfigError("round-writer", self.round, f"{method} inside its `with` block")
        client = _check_integer("client", client, 0)
        num_examples = _check_integer("num_examples", num_examples, 1)
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
        prepared = _prepare(tensors, STORE_DTYPES[dtype], what)
        if client is not None:
            squares = squared_norms(prepared) if squares is None else squares
            metadata[SQUARES_KEY] = json.dumps(_check_squares(what, squares, prepared))
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


class UpdateStore:
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
        if not self.readonly:
            try:
                self._prepare(header)
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
        round_number = _check_integer("round", round, 1)
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

    def delete_client(self, client: int) -> int:
        """Physically remove every blob and index row of ``client``; return the blob count.

        Rows go first: a crash before the unlinks then leaves unindexed files, which the next
        open removes, rather than rows naming missing files. VACUUM then rebuilds the index so
        that no page keeps the rows. Erasing the disk blocks of unlinked files is up to the
        filesystem; keep the store on encrypted storage where that matters. Every row is
        verified first: a damaged index could otherwise hide a row of ``client``.
        """
        self._require_writable("delete_client")
        client = _check_integer("client", client, 0)
        with self._exclusive():
            norms = [row for row in self._index.norms_rows() if row.client == client]
            deleted = self._delete_rows(
                [row for row in self._rows() if row.client == client], norms
            )
            self._index.vacuum()
        return len(deleted)

    def delete_rounds_after(self, round: int) -> list[int]:
        """Physically remove every committed round after ``round`` (>= 0); return those rounds.

        A resumed training run calls this with its last checkpointed round: a round the store
        committed after that checkpoint (the crash came between the two) is trained again, and
        would otherwise be retained twice. Rows go first, as in :meth:`delete_client`.
        """
        self._require_writable("delete_rounds_after")
        round_number = _check_integer("round", round, 0)
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
        wanted = None if clients is None else _client_set("clients", clients)
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
        return self._read_blob(self._global_row(rows))

    def read_update(self, round: int, client: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s update U_k^round, checksum-verified, floating tensors as float32."""
        round_number = self._require_committed(round)
        client = _check_integer("client", client, 0)
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
        return self._read_blob(found[0])

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
        rows = self._rows(round_number)
        has_global = any(row.kind == "global" for row in rows)
        retained = RetainedRound(
            round_number, self._read_blob(self._global_row(rows)) if has_global else None
        )
        tensors = self._index.norms_layout()
        for row in self._index.norms_rows(round_number):
            if row.client not in excluded and (wanted is None or row.client in wanted):
                retained.num_examples[row.client] = row.num_examples
                retained.squares[row.client] = row.values(tensors)
        for row in rows:
            if row.kind != "update" or row.client in excluded:
                continue
            if wanted is None or row.client in wanted:
                update, metadata = self._read_blob(row, with_metadata=True)
                retained.updates[row.client] = update
                retained.num_examples[row.client] = row.num_examples
                retained.squares[row.client] = _recorded_squares(row, metadata, update)
        return retained

    def iter_rounds(
        self, clients: int | Iterable[int] | None = None, exclude: int | Iterable[int] = ()
    ) -> Iterator[RetainedRound]:
        """Yield :meth:`read_round` of each committed round, ascending, one round in memory."""
        # sets now: a generator argument would otherwise be used up by the first round
        clients = None if clients is None else _client_set("clients", clients)
        exclude = _client_set("exclude", exclude)
        rounds = self.rounds()  # verifies every norms row: an edited round cannot hide one
        for round_number in rounds:
            yield self.read_round(round_number, clients=clients, exclude=exclude)

    def verify(self) -> list[str]:
        """Check the index (SQLite's quick_check, every row's checksum) and every blob (sha256,
        readable, finite values); return the problems, one line each (never raises)."""
        try:
            problems = self._index.integrity_problems()
            rows, row_problems = self._index.checked_rows()
        except StoreCorruptionError as error:
            return [str(error)]
        problems += row_problems
        for row in rows:
            problems += self._blob_problems(row)
        try:
            problems += self._index.checked_norms_rows()[1]
        except StoreCorruptionError as error:
            problems.append(str(error))
        return problems

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
        client = _check_integer("client", client, 0)
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

    # ------------------------------------------------------------------ opening
    def _open_header(self, dtype: str | None) -> dict:
        """The validated header; a new store's, written, when there is none (writable only)."""
        if (self.root / _HEADER).exists():
            header = self._read_header()
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
            return header
        if (self.root / _INDEX).exists():
            raise StoreCorruptionError(
                f"{self.root / _HEADER} is missing but the index exists; "
                "restore store.json from a backup"
            )
        blobs = self._blob_files()
        if blobs:
            raise StoreCorruptionError(
                f"{self.root} holds {len(blobs)} file(s) under {_BLOBS}/ but neither {_HEADER} "
                f"nor {_INDEX}; the files were left untouched - restore both from a backup, or "
                "point the store at an empty or new folder"
            )
        if self.readonly:
            raise ConfigError(
                "root",
                str(self.root),
                "a store folder holding store.json (readonly=True creates none)",
            )
        private_directory(self.root)
        header = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "dtype": dtype or "float32",
            "metadata": {},
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
        }
        self._write_header(header)
        return header

    def _open_index(self) -> StoreIndex:
        """The index; blobs without a readable index raise, and are never touched."""
        path = self.root / _INDEX
        if path.exists() and not path.is_file():
            raise StoreCorruptionError(
                f"store {self.root}: its index {path} is not a file (a directory or a device); "
                f"move it aside and restore {_INDEX} from a backup (then run `fedunlearn store "
                f"verify {self.root}`); the blobs were left untouched"
            )
        if not path.is_file() or path.stat().st_size == 0:
            # zero bytes: created 0600, then a crash before SQLite wrote a page
            blobs = self._blob_files()
            if blobs:
                state = "empty" if path.is_file() else "missing"
                raise StoreCorruptionError(
                    f"store {self.root}: its index {path} is {state} but {len(blobs)} blob "
                    f"file(s) exist under {self.root / _BLOBS}; without the index no blob can be "
                    "attributed or trusted, and the blobs were left untouched - restore "
                    f"{_INDEX} from a backup (then run `fedunlearn store verify {self.root}`), "
                    "or move the store aside and retrain"
                )
            if self.readonly:
                return StoreIndex.empty(path)
            private_directory(self.root / _BLOBS)
            return StoreIndex.create(path)
        if self.readonly:
            return StoreIndex.open_readonly(path)
        index = StoreIndex.open_writable(path)
        private_directory(self.root / _BLOBS)
        return index

    def _prepare(self, header: dict) -> None:
        """Writable open: migrate a format-1 store, then remove a crashed round's leftovers."""
        try:
            with self._exclusive():
                if self._index.migrate() or header["format_version"] < FORMAT_VERSION:
                    self._tighten_modes()
                    header = self._read_header()
                    header["format_version"] = FORMAT_VERSION
                    self._write_header(header)
                self._remove_uncommitted_files()
        except StoreBusyError:
            if not self._index.checksummed:
                raise
            # a writer is mid-round right now: its files are work in progress, not leftovers

    def _require_writable_file_system(self) -> None:
        existing = self.root
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if hasattr(os, "statvfs") and os.statvfs(existing).f_flag & os.ST_RDONLY:
            raise StoreReadOnlyError(
                f"store {self.root} is on a read-only file system; open it with "
                "UpdateStore(root, readonly=True) to read it (fedunlearn store info/verify do)"
            )

    def _require_writable(self, method: str) -> None:
        if self.readonly:
            raise StoreReadOnlyError(
                f"{method}() writes, but store {self.root} was opened with readonly=True; "
                "open it with UpdateStore(root) to change it"
            )

    # ------------------------------------------------------------------ internals
    def _rows(self, round_number: int | None = None) -> list[BlobRow]:
        return self._index.rows(round_number)

    def _model_rounds(self) -> list[int]:
        return [row.round for row in self._rows() if row.kind == "global"]

    def _global_row(self, rows: list[BlobRow]) -> BlobRow:
        found = [row for row in rows if row.kind == "global"]
        if len(found) != 1:
            raise StoreCorruptionError(
                f"{self.root / _INDEX}: round {rows[0].round} has {len(found)} global-model rows, "
                "expected 1; restore index.sqlite from a backup"
            )
        return found[0]

    def _blob_files(self) -> list[Path]:
        blobs = self.root / _BLOBS
        return [path for path in blobs.rglob("*") if path.is_file()] if blobs.is_dir() else []

    def _read_header(self) -> dict:
        try:
            header = json_loads((self.root / _HEADER).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise StoreCorruptionError(
                f"{self.root / _HEADER} is unreadable ({error}), expected "
                "the store's JSON header; restore it from a backup"
            ) from error
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            found = header.get("format") if isinstance(header, dict) else header
            raise StoreCorruptionError(
                f"{self.root / _HEADER} has format {found!r}, expected "
                f"{FORMAT_NAME!r}; point UpdateStore at a store directory"
            )
        version = header.get("format_version")
        if (
            type(version) is not int
            or version < 1
            or header.get("dtype") not in STORE_DTYPES
            or not isinstance(header.get("metadata"), dict)
        ):
            raise StoreCorruptionError(
                f"{self.root / _HEADER} lacks a valid format_version, dtype or metadata "
                f"(found {version!r}, {header.get('dtype')!r}); restore it from a backup"
            )
        if version >= 3:
            self._check_metadata(header)
        return header

    def _check_metadata(self, header: dict) -> None:
        """Every metadata field matches its checksum (format 3): an edited retention record or
        policy state is refused by name before any decision reads it."""
        recorded = header.get(METADATA_DIGESTS)
        if not isinstance(recorded, dict):
            raise StoreCorruptionError(
                f"{self.root / _HEADER} lacks its metadata checksums ({METADATA_DIGESTS}); "
                "restore it from a backup"
            )
        actual = _metadata_digests(header["metadata"])
        edited = sorted(k for k in set(recorded) | set(actual) if recorded.get(k) != actual.get(k))
        if edited:
            raise StoreCorruptionError(
                f"{self.root / _HEADER}: metadata field(s) {edited} were edited or damaged: their "
                "checksums do not match; restore store.json from a backup (then run `fedunlearn "
                f"store verify {self.root}`)"
            )

    def _write_header(self, header: dict) -> None:
        header = {**header, METADATA_DIGESTS: _metadata_digests(header["metadata"])}
        atomic_write_json(self.root / _HEADER, header)

    def _read_blob(self, row: BlobRow, *, with_metadata: bool = False):
        """The blob's tensors (floats as float32), checksum-verified; with ``with_metadata`` also
        its safetensors metadata."""
        who = f"{row.who}: blob {self.root / row.path}"
        try:
            data = (self.root / row.path).read_bytes()
        except FileNotFoundError:
            raise StoreCorruptionError(f"{who} is missing but indexed; {_BLOB_ADVICE}") from None
        found = hashlib.sha256(data).hexdigest()
        if found != row.checksum:
            raise StoreCorruptionError(
                f"{who} has sha256 {found}, expected {row.checksum}; {_BLOB_ADVICE}"
            )
        try:
            tensors = safetensors.torch.load(data)
        except SafetensorError as error:
            raise StoreCorruptionError(f"{who} is not a safetensors file ({error})") from None
        for name, tensor in tensors.items():  # written by a version that did not refuse them
            if _non_finite(tensor):
                raise StoreCorruptionError(
                    f"{who} holds NaN/Inf values in tensor {name!r}; {_BLOB_ADVICE}"
                )
        tensors = {
            name: tensor.float() if tensor.is_floating_point() else tensor
            for name, tensor in tensors.items()
        }
        return (tensors, _blob_metadata(data)) if with_metadata else tensors

    def _blob_problems(self, row: BlobRow) -> list[str]:
        who = f"{row.who}: blob {self.root / row.path}"
        try:
            digest = _file_sha256(self.root / row.path)
        except OSError as error:
            return [f"{who} is missing or unreadable ({error})"]
        if digest != row.checksum:
            return [
                f"{who} has sha256 {digest}, expected {row.checksum} "
                f"(recorded size {row.bytes} bytes)"
            ]
        problems = []
        try:
            with safe_open(str(self.root / row.path), framework="pt") as handle:
                for name in handle.keys():  # one tensor in memory at a time
                    tensor = handle.get_tensor(name)
                    if _non_finite(tensor):
                        problems.append(
                            f"{who} holds {_non_finite(tensor)} NaN/Inf value(s) of "
                            f"{tensor.numel()} in tensor {name!r}; {_BLOB_ADVICE}"
                        )
        except (SafetensorError, OSError) as error:
            problems.append(f"{who} is not a readable safetensors file ({error})")
        return problems

    def _require_committed(self, round: int) -> int:
        round_number = _check_integer("round", round, 1)
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

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the write lock: re-entrant within this object, exclusive across objects."""
        self._require_writable("a write")
        if self._lock_depth == 0:
            self._lock_descriptor = self._take_lock()
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                os.close(self._lock_descriptor)  # closing the file releases the flock
                self._lock_descriptor = None

    def _take_lock(self) -> int:
        lock = self.root / _LOCK
        try:
            descriptor = open_private_file(lock, os.O_RDWR | os.O_CREAT)
        except OSError as error:
            if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise StoreReadOnlyError(
                    f"cannot open the write lock {lock} ({error.strerror}); to read a store "
                    "you cannot write, open it with UpdateStore(root, readonly=True)"
                ) from None
            raise
        if fcntl is not None:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                raise StoreBusyError(
                    f"another writer holds {lock}; a store has one writer at a time - retry "
                    "once it is done"
                ) from None
        return descriptor

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
            relative = f"{_BLOBS}/{directory.name}/{file.name}"
            if _OWN_FILE.fullmatch(file.name) and relative not in committed:
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
        for directory in (self.root / _BLOBS).iterdir():
            if directory.is_dir() and _ROUND_DIRECTORY.fullmatch(directory.name):
                self._remove_unindexed(directory, committed)
        for temporary in self.root.glob(f".{_HEADER}.*tmp"):
            temporary.unlink(missing_ok=True)

    def _tighten_modes(self) -> None:
        """Give a store written by an older fedunlearn (0644 files, 0755 folders) private modes."""
        folders = [self.root, self.root / _BLOBS]
        folders += [p for p in (self.root / _BLOBS).iterdir() if _ROUND_DIRECTORY.fullmatch(p.name)]
        for folder in folders:
            if folder.is_dir():
                os.chmod(folder, PRIVATE_DIRECTORY_MODE)
                for file in folder.iterdir():
                    own = {_HEADER, _INDEX, _LOCK} if folder == self.root else ()
                    if file.is_file() and (file.name in own or _OWN_FILE.fullmatch(file.name)):
                        os.chmod(file, PRIVATE_FILE_MODE)
