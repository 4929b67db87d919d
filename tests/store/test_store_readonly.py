"""`fedunlearn store info|verify` and `fedunlearn certificates` only read: they work on a read-only
file system and leave every byte, name, size, mtime and mode of a run directory as it was."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from fedunlearn import cli
from fedunlearn.certified.certificate import CertifiedRemovalParams
from fedunlearn.certified.head_data import CentralHeadData
from fedunlearn.certified.losses import normalize_features, one_vs_rest_targets
from fedunlearn.certified.removal import CertifiedHead
from fedunlearn.store.update_store import UpdateStore

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
TORN = b'{"request": 3, "kind": "remo'  # what a crash mid-append leaves


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (itself included) with mode, size, mtime and contents."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        content = path.read_bytes() if path.is_file() else None
        found[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns, content)
    return found


def write_ledger(path: Path) -> None:
    rng = np.random.default_rng(0)
    x = normalize_features(rng.normal(size=(40, 3)) + 0.3)
    labels = (x @ np.array([1.0, -1.0, 0.5]) > 0).astype(int)
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, [0, 1])),
        CertifiedRemovalParams(sigma=0.1, lam=1e-2),
        ledger=path,
    )
    head.fit()
    head.remove([0])
    head.remove([1])


def make_runs(root: Path) -> None:
    """``root/run``: a store of 2 rounds (its lock file gone, as after a copy) and a ledger whose
    last line is torn; ``root/broken``: a store whose index is missing."""
    for name in ("run", "broken"):
        store = UpdateStore(root / name / "store")
        for round_number in (1, 2):
            store.write_round(
                round_number,
                {"w": torch.full((4,), float(round_number))},
                {client: ({"w": torch.ones(4) * client}, 10 + client) for client in (0, 1, 2)},
            )
        store.close()
        (root / name / "store" / ".lock").unlink()
    write_ledger(root / "run" / "certified_removal.jsonl")
    with open(root / "run" / "certified_removal.jsonl", "ab") as handle:
        handle.write(TORN)
    (root / "broken" / "store" / "index.sqlite").unlink()


COMMANDS = [
    ("verify", ["store", "verify", "run"]),
    ("info", ["store", "info", "run", "--index"]),
    ("certificates", ["certificates", "run"]),
    ("broken", ["store", "verify", "broken"]),
]


def check_outputs(results: dict[str, tuple[int, str]]) -> None:
    rc, out = results["verify"]
    assert rc == 0 and "8 blob(s) checked, 0 problem(s)" in out, out
    rc, out = results["info"]
    assert rc == 0 and "2 retained round(s)" in out and "clients: [0, 1, 2]" in out, out
    rc, out = results["certificates"]
    assert rc == 0 and "3 certificate(s)" in out, out
    assert "warning:" in out and "certified_removal.jsonl: skipped a torn last line" in out, out
    rc, out = results["broken"]
    assert rc == 1 and "index.sqlite is missing" in out and "left untouched" in out, out


def readonly_mount_prefix() -> list[str] | None:
    """A way to get a private mount namespace here, or None (no privilege for it)."""
    if shutil.which("unshare") is None or sys.platform != "linux":
        return None
    for prefix in (["unshare", "-m"], ["unshare", "--user", "--map-root-user", "--mount"]):
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    return None


MOUNTED = textwrap.dedent("""
    tree="$1"; out="$2"
    mount --bind "$tree" "$tree" && mount -o remount,bind,ro "$tree" || exit 90
    if touch "$tree/probe" 2>/dev/null; then exit 91; fi  # the mount must really refuse writes
    cd "$tree"
    run() { name="$1"; shift
            "$PYTHON" -m fedunlearn.cli "$@" > "$out/$name.out" 2>&1; echo $? > "$out/$name.rc"; }
    run verify store verify run
    run info store info run --index
    run certificates certificates run
    run broken store verify broken
    "$PYTHON" -c 'import sys; from fedunlearn.store.update_store import UpdateStore; UpdateStore(sys.argv[1])' \\
        run/store > "$out/writable.out" 2>&1; echo $? > "$out/writable.rc"
""")


def test_read_only_commands_work_on_a_real_read_only_mount(tmp_path):
    prefix = readonly_mount_prefix()
    if prefix is None:
        pytest.skip(
            "no mount namespace here; test_read_only_commands_under_a_write_refusing_hook "
            "simulates the read-only file system instead"
        )
    make_runs(tmp_path / "tree")
    before = tree(tmp_path / "tree")
    out = tmp_path / "out"
    out.mkdir()
    environment = dict(
        os.environ,
        PYTHON=sys.executable,
        PYTHONPATH=str(REPOSITORY_ROOT),
        PYTHONDONTWRITEBYTECODE="1",
    )
    completed = subprocess.run(
        [*prefix, "sh", "-c", MOUNTED, "sh", str(tmp_path / "tree"), str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if completed.returncode == 90:
        pytest.skip(f"read-only bind mount refused: {completed.stderr.strip()}")
    assert completed.returncode == 0, completed.stderr
    results = {
        name: (int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_text())
        for name, _ in [*COMMANDS, ("writable", None)]
    }
    check_outputs(results)
    rc, text = results["writable"]
    assert rc == 1 and "StoreReadOnlyError" in text and "readonly=True" in text, text
    assert tree(tmp_path / "tree") == before


AUDITED = textwrap.dedent("""
    import os, runpy, sys

    tree = os.path.realpath(sys.argv[1])
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path):
        try:
            return os.path.realpath(os.fsdecode(path)).startswith(tree)
        except (TypeError, ValueError):
            return False

    def refuse(event, args):
        # A read-only file system, as Python sees it: no write, create, rename, remove or chmod
        # under the tree, and SQLite only through a read-only URI.
        if event == "open" and inside(args[0]):
            mode, flags = args[1] or "", args[2] or 0
            if any(c in str(mode) for c in "wax+") or flags & WRITE:
                raise OSError(30, "Read-only file system (simulated)", args[0])
        elif event in {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir",
                       "os.chmod", "os.truncate", "os.utime", "os.link", "os.symlink"}:
            if inside(args[0]) or (len(args) > 1 and isinstance(args[1], (str, bytes))
                                   and inside(args[1])):
                raise OSError(30, "Read-only file system (simulated)", args[0])
        elif event == "sqlite3.connect":
            database = os.fsdecode(args[0])
            if database.startswith("file:"):
                refused = "mode=ro" not in database and "immutable=1" not in database
            else:
                refused = inside(database)
            if refused:
                raise OSError(30, f"Read-only file system (simulated): SQLite opened {database}")

    sys.addaudithook(refuse)
    os.chdir(sys.argv[1])
    sys.argv = ["fedunlearn", *sys.argv[2:]]
    try:
        runpy.run_module("fedunlearn.cli", run_name="__main__")
    except SystemExit as stop:
        sys.exit(stop.code)
""")


def test_read_only_commands_under_a_write_refusing_hook(tmp_path):
    """The simulation that runs everywhere: an audit hook refuses every write under the tree
    (SQLite's own file access is C code the hook does not see; it sees how it is opened)."""
    make_runs(tmp_path / "tree")
    before = tree(tmp_path / "tree")
    script = tmp_path / "audited.py"
    script.write_text(AUDITED)
    environment = dict(os.environ, PYTHONPATH=str(REPOSITORY_ROOT), PYTHONDONTWRITEBYTECODE="1")
    results = {}
    for name, argv in COMMANDS:
        completed = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "tree"), *argv],
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        results[name] = (completed.returncode, completed.stdout + completed.stderr)
    check_outputs(results)
    assert tree(tmp_path / "tree") == before


def test_the_hook_does_refuse_what_the_old_commands_did(tmp_path):
    """The simulation is not vacuous: a writable open, what `store verify` used to do, fails."""
    make_runs(tmp_path / "tree")
    script = tmp_path / "audited.py"
    script.write_text(
        AUDITED.replace(
            'runpy.run_module("fedunlearn.cli", run_name="__main__")',
            ('from fedunlearn.store.update_store import UpdateStore; UpdateStore("run/store")'),
        )
    )
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "tree")],
        env=dict(os.environ, PYTHONPATH=str(REPOSITORY_ROOT), PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode != 0 and "Read-only file system (simulated)" in completed.stderr


@pytest.mark.parametrize(
    "argv", [name_argv[1] for name_argv in COMMANDS], ids=[c[0] for c in COMMANDS]
)
def test_read_only_commands_leave_the_tree_unchanged(tmp_path, monkeypatch, capsys, argv):
    """In process, on a writable file system: names, sizes, mtimes, modes and bytes all kept,
    also where the old code cleaned up (the leftover round) or deleted (the broken store)."""
    make_runs(tmp_path)
    leftover = tmp_path / "run" / "store" / "blobs" / "round_000007"
    leftover.mkdir()
    (leftover / "client_000001.safetensors").write_bytes(b"a crashed round's blob")
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    cli.main(argv)
    capsys.readouterr()
    assert tree(tmp_path) == before


def test_certificates_with_a_damaged_middle_line_names_file_and_line(tmp_path, capsys):
    ledger = tmp_path / "certified_removal.jsonl"
    write_ledger(ledger)
    lines = ledger.read_bytes().splitlines(keepends=True)
    ledger.write_bytes(lines[0] + b"{damaged\n" + b"".join(lines[1:]))
    assert cli.main(["certificates", str(tmp_path)]) == 1  # a damaged file: 1, as store verify
    assert f"{ledger}, line 2: not a JSON record" in capsys.readouterr().err


def test_verify_exits_1_on_an_edited_num_examples(tmp_path, capsys):
    make_runs(tmp_path)
    connection = sqlite3.connect(tmp_path / "run" / "store" / "index.sqlite")
    connection.execute("UPDATE blobs SET num_examples = 1000 WHERE round = 2 AND client = 1")
    connection.commit()
    connection.close()
    assert cli.main(["store", "verify", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "the row of round 2, client 1" in out and "num_examples=1000" in out
    assert "8 blob(s) checked, 1 problem(s)" in out
