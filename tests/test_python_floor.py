"""The interpreter floor that pyproject declares is one the code runs on."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Standard-library modules newer than Python 3.10, with the version that added them.
NEWER_STDLIB = {"tomllib": (3, 11)}


def _declared_floor() -> tuple[int, int]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", project["project"]["requires-python"].strip())
    assert match, "requires-python should be a plain '>=X.Y' floor"
    return int(match.group(1)), int(match.group(2))


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_imports_a_standard_library_module_newer_than_the_floor():
    floor = _declared_floor()
    too_new = []
    for folder in ("fedunlearn", "server", "clients", "strategies", "simulations"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for module in _imported_modules(path) & set(NEWER_STDLIB):
                if NEWER_STDLIB[module] > floor:
                    too_new.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not too_new, f"requires-python >= {floor} but {too_new}"


def test_ruff_targets_the_declared_floor():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    major, minor = _declared_floor()
    assert tool["ruff"]["target-version"] == f"py{major}{minor}"
