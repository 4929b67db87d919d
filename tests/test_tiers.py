"""The tiers hold: an unmarked test that starts Ray, a Ray simulation, a SuperLink or the launcher
fails before anything starts; the same test with its marker runs; the markers are strict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tier_guard import needed_marker

TESTS = Path(__file__).resolve().parent

#: Each case: the test body's call. ``tier_guard.ORIGINALS`` is stubbed so that nothing starts.
CALLS = {
    "ray.init": ("ray", "import ray\n    assert ray.init() == 'started'"),
    "run_simulation": (
        "ray",
        "from flwr.simulation import run_simulation\n    assert run_simulation() == 'started'",
    ),
    "Popen.__init__": (
        "deployment",
        "import subprocess\n    subprocess.Popen(['flower-superlink', '--insecure'])",
    ),
}


#: What the stubbed entry points do instead of starting anything (``__init__`` returns None).
STARTED = "lambda *a, **k: 'started'"
STUBS = {"Popen.__init__": "lambda self, *a, **k: setattr(self, '_child_created', False)"}


def _planted_tests() -> str:
    """One test per entry point and marker (none, its own, the other tier's), each call stubbed."""
    lines = ["import pytest, tier_guard", ""]
    for stub, (own, call) in CALLS.items():
        other = "deployment" if own == "ray" else "ray"
        name = stub.replace(".", "_")
        lines.append(f"tier_guard.ORIGINALS[{stub!r}] = {STUBS.get(stub, STARTED)}")
        for marker in (None, own, other):
            lines += ["", ""]
            if marker:
                lines.append(f"@pytest.mark.{marker}")
            lines += [f"def test_{name}_marked_{marker}():", f"    {call}"]
    return "\n".join(lines) + "\n"


def test_an_unmarked_test_that_starts_a_tier_fails_and_a_marked_one_runs(pytester, monkeypatch):
    """The guard, shown on planted tests in a pytest of their own: each of the three entry points
    fails unmarked (naming the marker it needs) and under the other tier's marker, and runs under
    its own."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makepyfile(test_planted=_planted_tests())
    pytester.makeini("[pytest]\nmarkers =\n    ray: r\n    deployment: d\n")
    result = pytester.runpytest_subprocess("-p", "tier_guard", "-p", "no:cacheprovider", "-rA")
    outcomes = {}
    for line in result.outlines:
        for word in ("PASSED", "FAILED"):
            if line.startswith(word + " "):
                outcomes[line.split("::")[1].split()[0]] = word
    for stub, (own, _) in CALLS.items():
        name = stub.replace(".", "_")
        other = "deployment" if own == "ray" else "ray"
        assert outcomes[f"test_{name}_marked_None"] == "FAILED", result.outlines
        assert outcomes[f"test_{name}_marked_{own}"] == "PASSED", result.outlines
        assert outcomes[f"test_{name}_marked_{other}"] == "FAILED", result.outlines
    result.stdout.fnmatch_lines(["*TierError*not marked @pytest.mark.ray*"])
    result.stdout.fnmatch_lines(["*TierError*not marked @pytest.mark.deployment*"])


@pytest.mark.parametrize(
    ("argv", "marker"),
    [
        (["/venv/bin/fedunlearn-run", "--set", "rounds=1"], "deployment"),
        (["flwr", "supernode", "register", "key.pub"], "deployment"),
        (["/venv/bin/flower-supernode", "--insecure"], "deployment"),
        (["sh", "/repo/simulations/deploy/start_superlink.sh", "creds"], "deployment"),
        ([sys.executable, "-m", "simulations.run", "x.toml"], "deployment"),
        ([sys.executable, "-c", "from tests.conftest import simulate_in_process"], "ray"),
        ("fedunlearn-run --dry-run", "deployment"),
        (b"flwr run . --stream", "deployment"),
        (Path("/venv/bin/flower-superlink"), "deployment"),
        (b"ls -l", None),
        (
            [b"bash", b"/repo/simulations/deploy/start_supernode.sh", b"127.0.0.2:9092"],
            "deployment",
        ),
        (["/venv/bin/ray", "start", "--head"], "ray"),
        ([sys.executable, "-c", "print(1)"], None),
        ([sys.executable, "-m", "fedunlearn.cli", "data", "check", "digits"], None),
        (["ps", "-o", "stat=", "-p", "1"], None),
        ([], None),
    ],
)
def test_which_processes_need_a_marker(argv, marker):
    assert needed_marker(argv) == marker


def test_markers_are_strict(pytestconfig):
    assert pytestconfig.getoption("strict_markers") or "--strict-markers" in str(
        pytestconfig.getini("addopts")
    )
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {"ray", "deployment"} <= declared


def test_under_xdist_the_marked_tests_run_on_one_worker_beside_the_rest(pytester, monkeypatch):
    """``-n 2 --dist loadgroup`` on planted tests (their calls stubbed): every test marked ``ray``
    or ``deployment`` runs on the same worker, and the unmarked ones are shared out (on this
    pytest and pytest-xdist: a version where the group stopped grouping fails here)."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    record = pytester.path / "workers.txt"
    pytester.makepyfile(
        test_planted=f"""
import os, time
import pytest


def _record(kind):
    time.sleep(0.2)
    with open({str(record)!r}, "a") as out:
        out.write(f"{{kind}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")


@pytest.mark.parametrize("i", range(4))
@pytest.mark.ray
def test_ray(i):
    _record("marked")


@pytest.mark.parametrize("i", range(4))
@pytest.mark.deployment
def test_deployment(i):
    _record("marked")


@pytest.mark.parametrize("i", range(16))
def test_plain(i):
    _record("plain")
"""
    )
    pytester.makeini("[pytest]\nmarkers =\n    ray: r\n    deployment: d\n")
    result = pytester.runpytest_subprocess(
        "-p", "tier_guard", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"
    )
    result.assert_outcomes(passed=24)
    seen = [line.split() for line in record.read_text().splitlines()]
    marked = {worker for kind, worker in seen if kind == "marked"}
    plain = {worker for kind, worker in seen if kind == "plain"}
    assert len([1 for kind, _ in seen if kind == "marked"]) == 8
    assert len(marked) == 1, seen
    assert plain - marked, seen  # the other worker ran the rest meanwhile
