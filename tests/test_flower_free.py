"""The core (``fedunlearn/``) never imports Flower: every module of it, imported in a fresh
interpreter, leaves no ``flwr`` module behind (the server, clients and strategies are the Flower
layers; ``fedunlearn.cli`` is Flower-free too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fedunlearn

REPOSITORY = Path(__file__).resolve().parents[1]

_SCRIPT = """
import importlib, pkgutil, sys
import fedunlearn

modules = pkgutil.walk_packages(fedunlearn.__path__, "fedunlearn.")
names = ["fedunlearn", *sorted(m.name for m in modules)]
for name in names:
    importlib.import_module(name)
    flower = sorted(m for m in sys.modules if m == "flwr" or m.startswith("flwr."))
    if flower:
        sys.exit(f"importing {name} imported {flower[0]}")
print(len(names))
"""


def _module_files() -> list[Path]:
    root = Path(fedunlearn.__file__).parent
    return [path for path in root.rglob("*.py") if "__pycache__" not in path.parts]


def test_every_module_of_the_core_imports_without_flower():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=REPOSITORY, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == len(_module_files())  # none was left out
