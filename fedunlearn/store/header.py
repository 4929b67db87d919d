"""The update store's header (``store.json``: format, dtype, the store's and the run's identity, the
metadata with a seal per field) and its write lock (an advisory ``flock`` on ``.lock``, re-entrant
within one store object): :class:`HeaderAndLock`, the part of
:class:`fedunlearn.store.update_store.UpdateStore` that opens, reads and writes them. The header is
bound to its index (:mod:`fedunlearn.store.store_identity`) and to its run
(:mod:`fedunlearn.store.sealing`)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import secrets
from collections.abc import Iterator, Mapping

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store import store_identity
from fedunlearn.store.blobs import BLOBS, FORMAT_NAME, HEADER, INDEX, LOCK, STORE_DTYPES
from fedunlearn.store.durable_io import (
    atomic_write_json,
    json_loads,
    json_sha256,
    open_private_file,
    private_directory,
)
from fedunlearn.store.index import StoreBusyError, StoreReadOnlyError
from fedunlearn.store.sealing import Sealer, run_folder_of, sealer_of

try:
    import fcntl
except ImportError:  # no advisory locks on Windows: the single-writer rule is then the caller's
    fcntl = None

#: 2: index rows carry checksums; 3: so does every field of the header's metadata (the retention
#: record and the policies' states, which decide what a method reads and where it rolls back); 4:
#: the header names its store and run, its checksums are sealed with them, and the index holds the
#: seal of the header it goes with.
FORMAT_VERSION = 4
#: The first format whose header is bound to its store, index and run.
BOUND_VERSION = 4
#: The header's per-field checksums of its metadata (format 3; sealed from format 4).
METADATA_DIGESTS = "metadata_sha256"


def metadata_digests(
    metadata: Mapping[str, object], sealer: Sealer | None = None, store_id: str | None = None
) -> dict[str, str]:
    """A checksum of each metadata field: the sha256 of its canonical JSON (format 3), or its seal
    at its place (the store, the field) in its run (``sealer``, format 4)."""
    if sealer is None:
        return {key: json_sha256(value) for key, value in metadata.items()}
    place = {"store": store_id, "file": HEADER}
    return {key: sealer.seal({**place, "field": key}, value) for key, value in metadata.items()}


class HeaderAndLock:
    """The header and the write lock of a store at ``self.root`` (opened ``self.readonly`` or
    not); :class:`~fedunlearn.store.update_store.UpdateStore` is one."""

    root: os.PathLike
    readonly: bool
    _index: object = None

    @property
    def sealer(self) -> Sealer:
        """The sealer of the run this store belongs to (the run of its parent folder)."""
        if getattr(self, "_sealer", None) is None:
            self._sealer = sealer_of(run_folder_of(self.root))
        return self._sealer

    def _open_header(self, dtype: str | None) -> dict:
        """The validated header; a new store's, written, when there is none (writable only)."""
        if (self.root / HEADER).exists():
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
        if (self.root / INDEX).exists():
            raise StoreCorruptionError(
                f"{self.root / HEADER} is missing but the index exists; "
                "restore store.json from a backup"
            )
        blobs = self._blob_files()
        if blobs:
            raise StoreCorruptionError(
                f"{self.root} holds {len(blobs)} file(s) under {BLOBS}/ but neither {HEADER} "
                f"nor {INDEX}; the files were left untouched - restore both from a backup, or "
                "point the store at an empty or new folder"
            )
        if self.readonly:
            raise ConfigError(
                "root",
                str(self.root),
                "a store folder holding store.json (readonly=True creates none)",
            )
        private_directory(self.root)
        header = {  # written unbound; the writable open binds it to its index and run (_prepare)
            "format": FORMAT_NAME,
            "format_version": BOUND_VERSION - 1,
            "dtype": dtype or "float32",
            "metadata": {},
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
        }
        self._write_header(header)
        return header

    def _read_header(self) -> dict:
        try:
            header = json_loads((self.root / HEADER).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise StoreCorruptionError(
                f"{self.root / HEADER} is unreadable ({error}), expected "
                "the store's JSON header; restore it from a backup"
            ) from error
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            found = header.get("format") if isinstance(header, dict) else header
            raise StoreCorruptionError(
                f"{self.root / HEADER} has format {found!r}, expected "
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
                f"{self.root / HEADER} lacks a valid format_version, dtype or metadata "
                f"(found {version!r}, {header.get('dtype')!r}); restore it from a backup"
            )
        if version >= BOUND_VERSION:
            self._check_bound(header)
        if version >= 3:
            self._check_metadata(header)
        return header

    def _header_seal(self, header: dict) -> str:
        return self.sealer.seal({"store": header["store_id"], "file": HEADER}, header)

    def _check_bound(self, header: dict) -> None:
        """A format-4 header names this run and this store, and is the header its index goes with
        (checked once the index is open)."""
        path = self.root / HEADER
        if header.get("run_id") != self.sealer.run_id:
            raise StoreCorruptionError(
                f"{path} belongs to run {header.get('run_id')}, but {run_folder_of(self.root)} is run "
                f"{self.sealer.run_id}: the store or its header was copied from another run; "
                "restore it from this run's backup"
            )
        if self._index is None:
            return
        identity = store_identity.read(self._index)
        if identity is None or identity.store_id != header.get("store_id"):
            found = identity.store_id if identity else "none (no identity)"
            raise StoreCorruptionError(
                f"{path} names store {header.get('store_id')}, but its index belongs to store "
                f"{found}: the header (or the index) was copied from another store; restore the "
                f"store from a backup (then run `fedunlearn store verify {self.root}`)"
            )
        if not identity.accepts(self._header_seal(header)):
            raise StoreCorruptionError(
                f"{path} is not the header its index goes with (its seal is neither the one the "
                "index committed nor the one being written): a copy of this store's header from "
                "another moment (before or after a round or a request), or an edit; restore "
                f"store.json from a backup (then run `fedunlearn store verify {self.root}`)"
            )

    def _check_metadata(self, header: dict) -> None:
        """Every metadata field matches its checksum (format 3): an edited retention record or
        policy state is refused by name before any decision reads it."""
        recorded = header.get(METADATA_DIGESTS)
        if not isinstance(recorded, dict):
            raise StoreCorruptionError(
                f"{self.root / HEADER} lacks its metadata checksums ({METADATA_DIGESTS}); "
                "restore it from a backup"
            )
        actual = self._metadata_digests(header)
        edited = sorted(k for k in set(recorded) | set(actual) if recorded.get(k) != actual.get(k))
        if edited:
            raise StoreCorruptionError(
                f"{self.root / HEADER}: metadata field(s) {edited} were edited or damaged: their "
                "checksums do not match; restore store.json from a backup (then run `fedunlearn "
                f"store verify {self.root}`)"
            )

    def _metadata_digests(self, header: dict) -> dict[str, str]:
        if header["format_version"] < BOUND_VERSION:
            return metadata_digests(header["metadata"])
        return metadata_digests(header["metadata"], self.sealer, header["store_id"])

    def _write_header(self, header: dict) -> None:
        """Write ``header`` atomically; a format-4 one in two steps around the rename (its seal
        pending in the index, then committed), so a crash leaves a header the index accepts."""
        header = {**header, METADATA_DIGESTS: self._metadata_digests(header)}
        if header["format_version"] < BOUND_VERSION:
            atomic_write_json(self.root / HEADER, header)
            return
        seal = self._header_seal(header)
        store_identity.begin_header(self._index, header["store_id"], seal)
        atomic_write_json(self.root / HEADER, header)
        store_identity.commit_header(self._index, seal)

    def _bind_header(self, header: dict) -> dict:
        """Give a store of format 3 or older (or a new one) its identity: a random store id, this
        run's id, and the header's seal in the index (writable open, under the lock). A header of
        an older format beside an index with a committed identity is a downgrade, refused."""
        identity = store_identity.read(self._index)
        if identity is not None and identity.header_seal is not None:
            raise StoreCorruptionError(
                f"{self.root / HEADER} is of format {header['format_version']}, but its index "
                f"belongs to store {identity.store_id} of format {BOUND_VERSION}: the header was "
                "replaced by an older one; restore store.json from a backup"
            )
        store_id = identity.store_id if identity is not None else secrets.token_hex(16)
        bound = {
            **header,
            "format_version": FORMAT_VERSION,
            "store_id": store_id,
            "run_id": self.sealer.run_id,
        }
        store_identity.begin_header(self._index, store_id, self._header_seal(bound))
        store_identity.bind_rows(self._index, self.sealer)
        self._write_header(bound)
        return bound

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
        lock = self.root / LOCK
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
