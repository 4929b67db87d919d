"""Inputs that used to end in a Python traceback: each is one line naming the path, exit 2 for a
bad argument and exit 1 for a damaged store; nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fedunlearn import cli
from fedunlearn.store.update_store import UpdateStore
from simulations import run as runner


def _store(root: Path) -> Path:
    store = UpdateStore(root / "store")
    store.write_round(1, {"w": torch.zeros(3)}, {0: ({"w": torch.ones(3)}, 5)})
    store.close()
    return root


def _deep_header(root: Path) -> str:
    (_store(root) / "store" / "store.json").write_text("[" * 100_000)
    return str(root / "store" / "store.json")


def _index_a_directory(root: Path) -> str:
    index = _store(root) / "store" / "index.sqlite"
    index.unlink()
    index.mkdir()
    return str(index)


def _loop(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    os.symlink(root / "b", root / "a")
    os.symlink(root / "a", root / "b")
    return str(root / "a")


def _deep_config(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "deep.toml").write_text("rounds = " + "[" * 5000 + "]" * 5000 + "\n")
    return str(root / "deep.toml")


def _huge_config(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "huge.toml").write_text("# padding\n" * 200_000 + "rounds = 2\n")
    return str(root / "huge.toml")


#: (command, its arguments with {tmp} and {target}, how to prepare {target}, exit, the path named)
CASES = [
    ("fedunlearn-run", ["--output-dir", "~nosuchuser-fu/x"], None, 2, "~nosuchuser-fu"),
    ("fedunlearn-run", ["--set", "output-dir=~nosuchuser-fu/x"], None, 2, "~nosuchuser-fu"),
    ("fedunlearn-run", ["--data-root", "~nosuchuser-fu/d"], None, 2, "~nosuchuser-fu"),
    ("fedunlearn-run", ["--output-dir", "{target}"], _loop, 2, "{target}"),
    ("fedunlearn-run", ["{target}"], _deep_config, 2, "{target}"),
    ("fedunlearn-run", ["{target}"], _huge_config, 2, "{target}"),
    ("fedunlearn-run", ["--set", "rounds=" + "[" * 5000 + "]" * 5000], None, 2, "rounds"),
    ("fedunlearn", ["store", "info", "{tmp}/run"], _deep_header, 1, "{target}"),
    ("fedunlearn", ["store", "verify", "{tmp}/run"], _deep_header, 1, "{target}"),
    ("fedunlearn", ["store", "verify", "{tmp}/run"], _index_a_directory, 1, "{target}"),
    ("fedunlearn", ["store", "info", "{tmp}/run"], _index_a_directory, 1, "{target}"),
    ("fedunlearn", ["config-docs", "/dev/full"], None, 2, "/dev/full"),
    ("fedunlearn", ["config-docs", "{tmp}/no/such/x.md"], None, 0, None),  # folders made
]


@pytest.mark.parametrize(
    ("command", "argv", "prepare", "status", "named"),
    CASES,
    ids=[f"{c} {' '.join(a)[:60]} {p.__name__ if p else ''}" for c, a, p, _, _ in CASES],
)
def test_a_hostile_input_is_one_line_naming_the_path(
    command, argv, prepare, status, named, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    target = prepare(tmp_path / "run") if prepare else ""
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{target}", target) for a in argv]
    if command == "fedunlearn-run":
        code = runner.main(["--dry-run", *argv])
    else:
        code = cli.main(argv)
    printed = capsys.readouterr()
    assert code == status, printed
    if named is None:
        return
    said = printed.out + printed.err
    assert "Traceback" not in said
    assert named.replace("{target}", target) in said
    assert not (tmp_path / "fedunlearn-runs").exists()
