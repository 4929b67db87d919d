"""What binds a record to its run: the run identity and the seal every digest is made with.

A digest that covers only a record's own bytes says nothing about *where* the record belongs: a
genuine file copied from another run, another store or another moment of the same run (a store
header written after a request, ``model_initial`` put in the place of ``model_final``) passes its own
checksum. So every digest fedunlearn writes is a **seal of a place and a content**: the run's
identity, and where the record sits (the file, the store, the round and client, the model's role),
hashed together with the record. A record moved to another place no longer matches its seal.

* **The run identity** (``identity.json``, written with the run directory): a random ``run_id``
  (128 bits from :mod:`secrets`, never derived from the public seed), when it was created, and the
  integrity mode. A folder without one is a run written before identities (or a file outside any
  run, such as a ledger handed to ``fedunlearn certificates``): its records are sealed with the run
  ``None``.
* **Integrity mode** (the default, ``sha256``): a seal is the SHA-256 of the place and the content.
  It catches damage, edits, and genuine files moved between places. It does **not** stop a forger
  who edits a file and recomputes its seals: the algorithm and every input are on disk.
* **Authenticity mode** (``hmac-sha256``, off by default): with ``FEDUNLEARN_INTEGRITY_KEY`` naming a
  key file kept *outside* the run directory, a seal is an HMAC-SHA256 under that key (RFC 2104).
  A forger without the key cannot compute a seal, so an edited or forged record is refused even
  when its digests were recomputed. The run records which mode and which key (a key id: the HMAC of
  a fixed text, never the key) sealed it; a run sealed with a key is refused without that key, and
  while a key is set a run sealed without one is refused (no downgrade by rewriting the mode). It
  does not stop an attacker who holds the key, nor one who replaces the whole run directory with an
  older genuine copy of itself (a backup restore looks the same).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError, StoreCorruptionError

#: The run identity's file, in the run directory.
IDENTITY = "identity.json"
#: The environment variable naming the key file of authenticity mode.
KEY_VARIABLE = "FEDUNLEARN_INTEGRITY_KEY"
SHA256, HMAC_SHA256 = "sha256", "hmac-sha256"
#: Shortest key accepted (bytes): HMAC-SHA256's block of security needs 32 random bytes.
MIN_KEY_BYTES = 32
_KEY_ID_TEXT = b"fedunlearn key id"


def canonical(value: Any) -> bytes:
    """``value``'s canonical JSON (sorted keys, no spaces), as bytes: what a seal covers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class Sealer:
    """Seals places and contents for one run (``run_id`` None: no identity), with ``key`` in
    authenticity mode (None: integrity mode, plain SHA-256)."""

    run_id: str | None = None
    key: bytes | None = None

    @property
    def mode(self) -> str:
        return SHA256 if self.key is None else HMAC_SHA256

    def seal(self, place: Mapping[str, Any], content: bytes | str | Any) -> str:
        """The hex seal of ``content`` (bytes, a hex digest, or a JSON value) at ``place`` in
        this run: SHA-256, or HMAC-SHA256 under the key, of the run, the place and the content."""
        if isinstance(content, str):
            content = content.encode("utf-8")
        elif not isinstance(content, bytes | bytearray):
            content = canonical(content)
        header = canonical({"run": self.run_id, **place}) + b"\0"
        if self.key is None:
            return hashlib.sha256(header + content).hexdigest()
        return hmac.new(self.key, header + content, hashlib.sha256).hexdigest()

    def matches(self, place: Mapping[str, Any], content: Any, recorded: object) -> bool:
        """Whether ``recorded`` is the seal of ``content`` at ``place`` (compared in constant time)."""
        return isinstance(recorded, str) and hmac.compare_digest(
            recorded.encode(), self.seal(place, content).encode()
        )


# ---------------------------------------------------------------------- the key
def key_id(key: bytes) -> str:
    """A name for ``key`` that reveals nothing of it: the HMAC of a fixed text, 16 hex digits."""
    return hmac.new(key, _KEY_ID_TEXT, hashlib.sha256).hexdigest()[:16]


def configured_key() -> bytes | None:
    """The key of authenticity mode, read from the file ``FEDUNLEARN_INTEGRITY_KEY`` names (None:
    the variable is unset or empty, integrity mode)."""
    name = os.environ.get(KEY_VARIABLE, "").strip()
    if not name:
        return None
    path = Path(name).expanduser()
    try:
        key = path.read_bytes()
    except OSError as error:
        raise ConfigError(
            KEY_VARIABLE, name, f"a readable key file ({error.strerror or error})"
        ) from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            KEY_VARIABLE,
            name,
            f"a key file of at least {MIN_KEY_BYTES} random bytes (this one has {len(key)}); "
            f"make one with: head -c 32 /dev/urandom > {name}",
        )
    return key


def _refuse_key_inside(folder: Path) -> None:
    """A key kept inside the run directory seals nothing: whoever can edit the run can read it."""
    name = os.environ.get(KEY_VARIABLE, "").strip()
    if not name:
        return
    key, run = Path(name).expanduser().resolve(), folder.resolve()
    if key == run or run in key.parents:
        raise ConfigError(
            KEY_VARIABLE,
            name,
            f"a key file kept outside the run directory {folder} (whoever can edit the run can "
            "read a key inside it, and forge every seal)",
        )


# ---------------------------------------------------------------------- the identity
#: Where a request archives a replaced history inside its run (``original-<n>/``, kept with
#: ``keep-original``; ``.discarded-<n>/`` while it is being removed).
_ARCHIVE = re.compile(r"(original|\.discarded)-[0-9]+")


def run_folder_of(store_root: str | os.PathLike) -> Path:
    """The run directory a store belongs to: its parent, or its run when the parent is an archive
    of a replaced history (``original-<n>/store``)."""
    parent = Path(store_root).parent
    if _ARCHIVE.fullmatch(parent.name) and not (parent / IDENTITY).exists():
        return parent.parent
    return parent


def create_identity(folder: str | os.PathLike) -> Sealer:
    """Write a new run's ``identity.json`` in ``folder`` (a random run id, the mode and key id of
    the configured key) and return its sealer."""
    from fedunlearn.store.durable_io import atomic_write_json

    folder = Path(folder)
    _refuse_key_inside(folder)
    key = configured_key()
    identity = {
        "run_id": secrets.token_hex(16),
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "integrity": SHA256 if key is None else HMAC_SHA256,
        "key_id": None if key is None else key_id(key),
    }
    sealer = Sealer(identity["run_id"], key)
    identity["sha256"] = sealer.seal({"file": IDENTITY}, {k: v for k, v in identity.items()})
    atomic_write_json(folder / IDENTITY, identity)
    return sealer


def sealer_of(folder: str | os.PathLike) -> Sealer:
    """The sealer of the run in ``folder``: its identity's, checked against the configured key;
    a folder without ``identity.json`` gets the run ``None`` (a run written before identities, or a
    file outside any run), refused only while a key is configured (a downgrade)."""
    folder = Path(folder)
    key = configured_key()
    path = folder / IDENTITY
    if not path.is_file():
        if key is not None:
            raise StoreCorruptionError(
                f"{folder} has no {IDENTITY} while {KEY_VARIABLE} is set: a run sealed with a key "
                "always has one (it was removed), and a run written without a key cannot be "
                f"authenticated; unset {KEY_VARIABLE} to read it in integrity mode"
            )
        return Sealer()
    return _checked_identity(path, key)


def _checked_identity(path: Path, key: bytes | None) -> Sealer:
    from fedunlearn.store.durable_io import json_loads

    try:
        identity = json_loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise StoreCorruptionError(
            f"{path} is unreadable ({error}); restore it from a backup"
        ) from None
    run_id = identity.get("run_id") if isinstance(identity, dict) else None
    mode = identity.get("integrity") if isinstance(identity, dict) else None
    if not isinstance(run_id, str) or mode not in (SHA256, HMAC_SHA256):
        raise StoreCorruptionError(
            f"{path} lacks a run_id or a valid integrity mode ({SHA256} or {HMAC_SHA256}); "
            "restore it from a backup"
        )
    _check_mode(path, mode, identity.get("key_id"), key)
    sealer = Sealer(run_id, key if mode == HMAC_SHA256 else None)
    fields = {k: v for k, v in identity.items() if k != "sha256"}
    if not sealer.matches({"file": IDENTITY}, fields, identity.get("sha256")):
        raise StoreCorruptionError(
            f"{path} was edited or damaged: its fields do not match its seal; restore it from "
            "a backup"
        )
    return sealer


def _check_mode(path: Path, mode: str, recorded_key: object, key: bytes | None) -> None:
    """The run's mode against the configured key: no key for a keyed run, the wrong key, or a key
    set for a run sealed without one (a downgrade) is refused."""
    if mode == HMAC_SHA256 and key is None:
        raise StoreCorruptionError(
            f"{path}: this run is sealed with a key (key id {recorded_key}); set {KEY_VARIABLE} "
            "to its key file to read it"
        )
    if mode == HMAC_SHA256 and recorded_key != key_id(key):
        raise StoreCorruptionError(
            f"{path}: this run is sealed with key id {recorded_key}, not with the key "
            f"{KEY_VARIABLE} names (key id {key_id(key)}); set it to the run's key file"
        )
    if mode == SHA256 and key is not None:
        raise StoreCorruptionError(
            f"{path}: this run is sealed without a key (integrity mode) while {KEY_VARIABLE} is "
            "set: it cannot be authenticated, and a keyed run rewritten to integrity mode looks "
            f"the same; unset {KEY_VARIABLE} to read it in integrity mode"
        )
