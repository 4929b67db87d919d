"""No function outside ``simulations/benchmarks/`` and ``tests/`` is longer than 80 lines: short
functions are read whole (Opacus has 9 of ~410 over 80, Flower's serverapp 1 of ~130)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
EXEMPT = ("simulations/benchmarks/", "tests/")


def _python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPOSITORY_ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return [REPOSITORY_ROOT / name for name in listed if not name.startswith(EXEMPT)]


def _long_functions(path: Path, root: Path = REPOSITORY_ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > LIMIT
    ]


def test_the_walk_finds_the_projects_modules():
    names = {path.relative_to(REPOSITORY_ROOT).as_posix() for path in _python_files()}
    assert {"server/server_app.py", "clients/client_app.py", "simulations/run.py"} <= names
    assert not any(name.startswith(EXEMPT) for name in names)


def test_a_long_function_is_caught(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    sample = tmp_path / "sample.py"
    sample.write_text(f"def long():\n{body}\n")
    assert _long_functions(sample, tmp_path) == [f"sample.py:1 long ({LIMIT + 1} lines)"]
    sample.write_text("class A:\n    def short(self):\n        return 1\n")
    assert _long_functions(sample, tmp_path) == []


def test_no_function_is_longer_than_80_lines():
    offenders = [line for path in _python_files() for line in _long_functions(path)]
    assert not offenders, "functions over 80 lines:\n" + "\n".join(offenders)
