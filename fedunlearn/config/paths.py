"""Checks on the text of paths and run names, before any file is touched."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from fedunlearn.errors import ConfigError

#: A run directory's name: portable across file systems and shells, never hidden, never an option.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
RUN_NAME_ALLOWED = (
    "a plain folder name without path separators: 1 to 100 characters from A-Z, a-z, 0-9, '.', "
    "'_', '-', not starting with '.' or '-' (or empty for <dataset>-<timestamp>)"
)
#: Longest output-dir (bytes, once ~ and $VARS are expanded): PATH_MAX is 4096 on Linux, and the run
#: directory adds its name and the store's nested files.
MAX_PATH_BYTES = 3072


def _unsafe_character(text: str) -> tuple[int, str] | None:
    """The first character (position, char) a path should not hold: control and format characters,
    unassigned or private-use code points, lone surrogates, line separators, non-ASCII spaces, and
    emoji with their modifiers and variation selectors. Letters of every script, combining accents,
    digits and punctuation are fine."""
    for position, char in enumerate(text):
        category = unicodedata.category(char)
        if (
            category[0] == "C"
            or category in ("So", "Me", "Zl", "Zp")
            or (category == "Zs" and char != " ")
            or (category == "Sk" and not char.isascii())
            or 0xFE00 <= ord(char) <= 0xFE0F
        ):
            return position, char
    return None


def check_path_text(key: str, value: str) -> None:
    """Refuse a path (``output-dir``, ``data-root``) that holds a character a folder name should
    not (:func:`_unsafe_character`), or that is too long to hold a run directory."""
    expanded = os.path.expanduser(os.path.expandvars(value))
    found = _unsafe_character(expanded)
    if found is not None:
        position, char = found
        raise ConfigError(
            key,
            value,
            "a folder path without control characters, emoji or other symbols (found "
            f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')} at position {position}"
            + (f" of {expanded!r}" if expanded != value else "")
            + ")",
        )
    size = len(expanded.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise ConfigError(key, value, f"a path of at most {MAX_PATH_BYTES} bytes (found {size})")
    too_long = [part for part in expanded.split(os.sep) if len(part.encode("utf-8")) > 255]
    if too_long:
        raise ConfigError(key, value, f"folder names of at most 255 bytes ({too_long[0][:20]}...)")


def check_run_name(key: str, value: str) -> None:
    """Refuse a run name that is not a portable folder name (empty: ``<dataset>-<timestamp>``)."""
    if value and not RUN_NAME.fullmatch(value):
        raise ConfigError(key, value, RUN_NAME_ALLOWED)


def expand_path(key: str, value: str, base: Path | None = None, *, resolve: bool = False) -> Path:
    r"""``value`` (a path of ``key``) with ``$VARS`` and ``~`` expanded; a relative one made
    absolute against ``base`` and resolved (when ``base`` is given), an absolute one resolved
    when ``resolve``. A ``~user`` with no home on this machine and a symbolic-link loop are
    :class:`ConfigError`\ s naming the path (not the ``RuntimeError`` of :mod:`pathlib`)."""
    expanded = os.path.expanduser(os.path.expandvars(value))
    if expanded.startswith("~"):
        user = expanded.split(os.sep, 1)[0]
        raise ConfigError(key, value, f"a folder path; {user} is no user's home on this machine")
    path = Path(expanded)
    if base is not None and not path.is_absolute():
        path, resolve = base / path, True
    if not resolve:
        return path
    try:
        return path.resolve()
    except (RuntimeError, OSError) as error:  # 3.11: RuntimeError("Symlink loop ..."), later ELOOP
        raise ConfigError(key, value, f"a folder path that resolves ({error})") from None
