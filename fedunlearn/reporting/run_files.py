"""A run directory read as untrusted input, for the report and the comparison: only regular files
inside the run (a symbolic link is followed only while it stays inside), each read up to a cap,
every table parsed by :mod:`csv` and every JSON file by :mod:`json`; nothing is written and nothing
heavier than the standard library is imported.

A file that cannot be used (too large, a link out of the run, not valid UTF-8, JSON or PNG) is left
out and noted in :attr:`RunFolder.skipped`, which the report shows.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError

#: At most this many bytes of one table, JSON file or log are read.
TEXT_CAP = 4 * 1024 * 1024
#: At most this many bytes of one figure are embedded, and of all figures together.
FIGURE_CAP = 8 * 1024 * 1024
FIGURES_TOTAL_CAP = 64 * 1024 * 1024
#: Folders searched for figures besides the run's own: those a request leaves (``original-<n>``)
#: and any other, but never the stores nor hidden folders (at most this deep).
FIGURE_DEPTH = 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's header, or None when ``data`` is not a PNG."""
    if len(data) < 24 or not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def number(text: str) -> float | None:
    """A table cell as a finite number, or None (text, empty, nan, inf)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class Table:
    """A CSV table: its header and rows (each a dict of column to text), from file ``name``."""

    name: str
    columns: list[str]
    rows: list[dict[str, str]]

    def column(self, name: str) -> list[str]:
        return [row.get(name, "") for row in self.rows]


@dataclass
class RunFolder:
    """The files of one run directory, read safely. Build it with :func:`open_run`."""

    path: Path
    root: Path
    skipped: list[str] = field(default_factory=list)
    _figure_bytes: int = 0

    def file(self, name: str) -> Path | None:
        """The regular file ``name`` (relative to the run) when it stays inside the run, else None."""
        candidate = self.path / name
        try:
            resolved = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not resolved.is_relative_to(self.root):
            self.skipped.append(f"{name}: a link out of the run, not followed")
            return None
        return resolved if resolved.is_file() else None

    def read_bytes(self, name: str, cap: int | None = None) -> bytes | None:
        """Up to ``cap`` (default :data:`TEXT_CAP`) bytes of ``name``; None (noted) when absent,
        larger or unreadable."""
        cap = TEXT_CAP if cap is None else cap
        target = self.file(name)
        if target is None:
            return None
        try:
            with open(target, "rb") as handle:
                data = handle.read(cap + 1)
        except OSError as error:
            self.skipped.append(f"{name}: cannot be read ({error.strerror})")
            return None
        if len(data) > cap:
            self.skipped.append(f"{name}: over {cap:,} bytes, left out")
            return None
        return data

    def read_text(self, name: str) -> str | None:
        data = self.read_bytes(name)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.skipped.append(f"{name}: not UTF-8 text, left out")
            return None

    def read_json(self, name: str) -> Any:
        """The JSON value of ``name``, or None (noted when present but not JSON)."""
        text = self.read_text(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            self.skipped.append(f"{name}: not valid JSON, left out")
            return None

    def read_jsonl(self, name: str) -> list[dict]:
        """The JSON objects of a log, one a line (a torn or odd line is skipped and noted); the
        seals are not checked here: ``fedunlearn store verify`` does that."""
        text = self.read_text(name)
        records = []
        for number_, line in enumerate((text or "").splitlines(), start=1):
            try:
                record = json.loads(line)
            except ValueError:
                self.skipped.append(f"{name}: line {number_} is not JSON, left out")
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def read_table(self, name: str) -> Table | None:
        """The CSV table ``name``, or None when absent or unreadable."""
        text = self.read_text(name)
        if text is None:
            return None
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            rows = [{k: v or "" for k, v in row.items() if isinstance(k, str)} for row in reader]
            columns = list(reader.fieldnames or [])
        except csv.Error as error:
            self.skipped.append(f"{name}: not a CSV table ({error}), left out")
            return None
        return Table(name, columns, rows)

    def read_png(self, name: str) -> tuple[bytes, int, int] | None:
        """A figure's bytes, width and height, when it is a PNG within the caps."""
        left = FIGURES_TOTAL_CAP - self._figure_bytes
        data = self.read_bytes(name, min(FIGURE_CAP, max(left, 0)))
        if data is None:
            return None
        size = png_size(data)
        if size is None:
            self.skipped.append(f"{name}: not a PNG image, left out")
            return None
        self._figure_bytes += len(data)
        return data, *size

    def names(self, pattern: str) -> list[str]:
        """Names of the run's own files matching ``pattern`` (sorted), links out left out."""
        return [p.name for p in sorted(self.path.glob(pattern)) if self.file(p.name) is not None]

    def figures(self) -> list[str]:
        """Every ``*.png`` of the run and of its folders (but the stores' and hidden ones), as
        paths relative to the run, the run's own first."""
        found = self.names("*.png")
        for folder in _folders(self.path, FIGURE_DEPTH):
            relative = folder.relative_to(self.path)
            found += [
                str(relative / p.name)
                for p in sorted(folder.glob("*.png"))
                if self.file(str(relative / p.name)) is not None
            ]
        return found


def _folders(path: Path, depth: int) -> list[Path]:
    """Sub-folders of ``path`` up to ``depth`` levels (no links, no stores, no hidden ones)."""
    if depth <= 0:
        return []
    found = []
    for child in sorted(path.iterdir()):
        if child.is_symlink() or not child.is_dir() or child.name.startswith((".", "store")):
            continue
        found += [child, *_folders(child, depth - 1)]
    return found


def open_run(path: Path, parameter: str = "RUN") -> RunFolder:
    """The run directory ``path``; a :class:`ConfigError` naming it when it is not one (a run
    holds ``config.json``, written first)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(parameter, str(path), "a run directory (the folder a run wrote)")
    run = RunFolder(path, path.resolve())
    if run.file("config.json") is None:
        raise ConfigError(
            parameter, str(path), "a run directory holding config.json (the folder a run wrote)"
        )
    return run
