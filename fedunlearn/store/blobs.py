"""The update store's blobs (:mod:`fedunlearn.store.update_store`): their layout on disk, how a
state dict is checked and encoded into one (no NaN or Inf, floats in the store's dtype, an update's
squared norms in its metadata) and how one is read back and verified against its index row.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError, safe_open

from fedunlearn.errors import ConfigError, StoreCorruptionError
from fedunlearn.store.durable_io import PRIVATE_DIRECTORY_MODE, PRIVATE_FILE_MODE, json_loads
from fedunlearn.store.index_rows import BlobRow

State = Mapping[str, torch.Tensor]
#: The name in every header and blob of the store's format.
FORMAT_NAME = "fedunlearn-update-store"
#: The store's layout: its header, index, write lock and blob folder under the root.
HEADER, INDEX, LOCK, BLOBS = "store.json", "index.sqlite", ".lock", "blobs"
STORE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
ROUND_DIRECTORY = re.compile(r"round_\d{6,}")
# Only names this module creates are ever removed, so foreign files under blobs/ survive.
OWN_FILE = re.compile(
    r"(client_\d{6,}|global)\.safetensors|\.(client_\d{6,}|global)\.safetensors(\.\w+)?\.tmp"
)
#: Metadata key of an update blob's squared norms per tensor (JSON), covered by the blob's sha256.
SQUARES_KEY = "squares"
BLOB_ADVICE = "restore it from a backup or retrain; store.verify() lists every damaged blob"


def check_integer(parameter: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(parameter, value, f"an integer >= {minimum}")
    return int(value)


def client_set(parameter: str, clients: int | Iterable[int]) -> set[int]:
    values = [clients] if isinstance(clients, numbers.Integral) else clients
    return {check_integer(parameter, client, 0) for client in values}


def non_finite(tensor: torch.Tensor) -> int:
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


def check_squares(what: str, squares: Mapping[str, float], tensors: State) -> dict[str, float]:
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


def blob_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file held in ``data`` (its JSON header)."""
    size = int.from_bytes(data[:8], "little")
    try:
        header = json_loads(data[8 : 8 + size])
    except ValueError:
        return {}
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def encode_blob(tensors: State, store_dtype: torch.dtype, what: str, metadata: dict) -> bytes:
    """Serialize a state dict: floats cast to the store dtype, all contiguous on the CPU."""
    return safetensors.torch.save(prepare_tensors(tensors, store_dtype, what), metadata=metadata)


def prepare_tensors(tensors: State, store_dtype: torch.dtype, what: str) -> dict[str, torch.Tensor]:
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
        bad = non_finite(tensor)
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


def recorded_squares(row, metadata: Mapping[str, str], update: State) -> dict[str, float]:
    """The squared norms recorded with an update (its own values' for stores written before
    norms were recorded); a blob whose recorded norms do not fit its tensors is corrupt."""
    if SQUARES_KEY not in metadata:
        return squared_norms(update)
    try:
        return check_squares(row.who, json_loads(metadata[SQUARES_KEY]), update)
    except (ValueError, ConfigError) as error:
        raise StoreCorruptionError(
            f"{row.who}: its recorded norms are unreadable ({error})"
        ) from None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # chunked: never a whole blob held
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_blob(root: Path, row: BlobRow, *, with_metadata: bool = False):
    """The tensors of ``row``'s blob under the store ``root``: The blob's tensors (floats as float32), checksum-verified; with ``with_metadata`` also
    its safetensors metadata."""
    who = f"{row.who}: blob {root / row.path}"
    try:
        data = (root / row.path).read_bytes()
    except FileNotFoundError:
        raise StoreCorruptionError(f"{who} is missing but indexed; {BLOB_ADVICE}") from None
    found = hashlib.sha256(data).hexdigest()
    if found != row.checksum:
        raise StoreCorruptionError(
            f"{who} has sha256 {found}, expected {row.checksum}; {BLOB_ADVICE}"
        )
    try:
        tensors = safetensors.torch.load(data)
    except SafetensorError as error:
        raise StoreCorruptionError(f"{who} is not a safetensors file ({error})") from None
    for name, tensor in tensors.items():  # written by a version that did not refuse them
        if non_finite(tensor):
            raise StoreCorruptionError(
                f"{who} holds NaN/Inf values in tensor {name!r}; {BLOB_ADVICE}"
            )
    tensors = {
        name: tensor.float() if tensor.is_floating_point() else tensor
        for name, tensor in tensors.items()
    }
    return (tensors, blob_metadata(data)) if with_metadata else tensors


def blob_problems(root: Path, row: BlobRow) -> list[str]:
    who = f"{row.who}: blob {root / row.path}"
    try:
        digest = file_sha256(root / row.path)
    except OSError as error:
        return [f"{who} is missing or unreadable ({error})"]
    if digest != row.checksum:
        return [
            f"{who} has sha256 {digest}, expected {row.checksum} (recorded size {row.bytes} bytes)"
        ]
    problems = []
    try:
        with safe_open(str(root / row.path), framework="pt") as handle:
            for name in handle.keys():  # one tensor in memory at a time
                tensor = handle.get_tensor(name)
                if non_finite(tensor):
                    problems.append(
                        f"{who} holds {non_finite(tensor)} NaN/Inf value(s) of "
                        f"{tensor.numel()} in tensor {name!r}; {BLOB_ADVICE}"
                    )
    except (SafetensorError, OSError) as error:
        problems.append(f"{who} is not a readable safetensors file ({error})")
    return problems


def tighten_modes(root: Path) -> None:
    """Give a store written by an older fedunlearn (0644 files, 0755 folders) private modes."""
    folders = [root, root / BLOBS]
    folders += [p for p in (root / BLOBS).iterdir() if ROUND_DIRECTORY.fullmatch(p.name)]
    for folder in folders:
        if folder.is_dir():
            os.chmod(folder, PRIVATE_DIRECTORY_MODE)
            for file in folder.iterdir():
                own = {HEADER, INDEX, LOCK} if folder == root else ()
                if file.is_file() and (file.name in own or OWN_FILE.fullmatch(file.name)):
                    os.chmod(file, PRIVATE_FILE_MODE)
