"""Durable storage: the retained-update store, its index, run directories and atomic I/O.

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.lazy import homes_of, lazy_getattr

#: Where each public name lives. The package imports nothing until a name is asked for (PEP 562):
#: a command that reads only the index or the run directory's JSON need not import PyTorch.
_HOMES = {
    "blobs": ("FORMAT_NAME", "SQUARES_KEY", "STORE_DTYPES", "squared_norms"),
    "durable_io": (
        "PRIVATE_DIRECTORY_MODE",
        "PRIVATE_FILE_MODE",
        "LogCorruptionError",
        "TornLineWarning",
        "atomic_write_bytes",
        "atomic_write_json",
        "fsync_directory",
        "log_size",
        "open_private_file",
        "private_directory",
        "truncate_log",
    ),
    "json_lines": ("append_jsonl", "read_jsonl"),
    "header": ("FORMAT_VERSION", "HeaderAndLock"),
    "index": ("INDEX_VERSION", "StoreBusyError", "StoreIndex", "StoreReadOnlyError"),
    "index_rows": ("COLUMNS", "BlobRow", "blob_path", "describe"),
    "round_writer": ("RoundWriter",),
    "run_directory": ("CHECKPOINT", "RunDirectory"),
    "update_store": ("RetainedRound", "UpdateStore"),
}
_HOME = homes_of(_HOMES)

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


__getattr__ = lazy_getattr(__name__, _HOMES)
