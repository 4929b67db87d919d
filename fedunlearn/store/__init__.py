"""Durable storage: the retained-update store, its index, run directories and atomic I/O.

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.store.blobs import FORMAT_NAME, SQUARES_KEY, STORE_DTYPES, squared_norms
from fedunlearn.store.durable_io import (
    PRIVATE_DIRECTORY_MODE,
    PRIVATE_FILE_MODE,
    LogCorruptionError,
    TornLineWarning,
    atomic_write_bytes,
    atomic_write_json,
    fsync_directory,
    log_size,
    open_private_file,
    private_directory,
    truncate_log,
)
from fedunlearn.store.header import FORMAT_VERSION, HeaderAndLock
from fedunlearn.store.index import INDEX_VERSION, StoreBusyError, StoreIndex, StoreReadOnlyError
from fedunlearn.store.index_rows import COLUMNS, BlobRow, blob_path, describe
from fedunlearn.store.json_lines import append_jsonl, read_jsonl
from fedunlearn.store.round_writer import RoundWriter
from fedunlearn.store.run_directory import (
    CHECKPOINT,
    RunDirectory,
)
from fedunlearn.store.update_store import RetainedRound, UpdateStore

__all__ = [
    "PRIVATE_FILE_MODE",
    "PRIVATE_DIRECTORY_MODE",
    "LogCorruptionError",
    "TornLineWarning",
    "fsync_directory",
    "private_directory",
    "open_private_file",
    "atomic_write_bytes",
    "atomic_write_json",
    "append_jsonl",
    "read_jsonl",
    "log_size",
    "truncate_log",
    "INDEX_VERSION",
    "COLUMNS",
    "StoreBusyError",
    "StoreReadOnlyError",
    "blob_path",
    "describe",
    "BlobRow",
    "StoreIndex",
    "CHECKPOINT",
    "RunDirectory",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "STORE_DTYPES",
    "SQUARES_KEY",
    "RetainedRound",
    "squared_norms",
    "RoundWriter",
    "HeaderAndLock",
    "UpdateStore",
]
