"""The suite's tiers, held: a test that starts Ray carries ``@pytest.mark.ray``, and one that starts a
SuperLink, a SuperNode, ``flwr`` or ``fedunlearn-run`` as a process carries
``@pytest.mark.deployment``; an unmarked one fails at the call, before anything starts. Under
``pytest -n auto`` (pytest-xdist, ``--dist loadgroup``) the marked tests run one after another on
one worker (:data:`PROCESS_GROUP`), beside the parallel rest.

The fast tier (``pytest -m "not ray and not deployment"``) is then exactly the tests that start
neither, and the markers cannot drift from what the tests do. Loaded by ``tests/conftest.py``
(``pytest_plugins``); it wraps ``ray.init``, ``flwr.simulation.run_simulation`` and
``subprocess.Popen`` for the whole session and asks the running test's markers at each call.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

#: Executables whose start is a deployment: Flower's SuperLink, SuperNodes, its CLI, our launcher,
#: and the headless browser that renders a report page.
DEPLOYMENT_PROGRAMS = frozenset(
    {
        "fedunlearn-run",
        "flwr",
        "flower-superlink",
        "flower-supernode",
        "flower-superexec",
        "start_superlink.sh",
        "start_supernode.sh",
        "nginx",
        "chromium",
    }
)

#: Words that make a ``python -c`` script or a ``python -m`` module a Ray simulation or a launch.
RAY_SCRIPT_WORDS = ("run_simulation", "simulate_in_process", "ray.init")
LAUNCH_MODULES = frozenset({"simulations.run", "flwr.cli.app"})

#: The items running now (a stack: pytester may run a session inside a test).
_RUNNING: list[pytest.Item] = []
#: What the guards call once a test may start it; a test of the guard stubs these.
ORIGINALS: dict[str, object] = {}


class TierError(RuntimeError):
    """A test started Ray or a deployment without the marker that puts it in its tier."""


def needed_marker(
    argv: Sequence[str | bytes | os.PathLike] | str | bytes | os.PathLike,
) -> str | None:
    """The marker a process started with ``argv`` needs: ``deployment`` for Flower's programs and
    our launcher, ``ray`` for a Python script that runs a Ray simulation, else None."""
    if isinstance(argv, str | bytes):  # a shell line (shell=True) or one program's name
        words = os.fsdecode(argv).split()
    elif isinstance(argv, os.PathLike):
        words = [os.fspath(argv)]
    else:
        words = [os.fsdecode(a) for a in argv]
    if not words:
        return None
    if Path(words[0]).name == "ray":  # ray start, ray stop: a Ray cluster's node
        return "ray"
    if Path(words[0]).name in DEPLOYMENT_PROGRAMS:
        return "deployment"
    if any(Path(word).name in DEPLOYMENT_PROGRAMS for word in words[1:2]):  # sh script.sh, env flwr
        return "deployment"
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "-m" and value in LAUNCH_MODULES:
            return "deployment"
        if flag == "-c" and any(word in value for word in RAY_SCRIPT_WORDS):
            return "ray"
    return None


def check(marker: str, what: str) -> None:
    """Raise :class:`TierError` when the running test lacks ``marker`` (outside a test: allowed)."""
    if not _RUNNING:
        return
    item = _RUNNING[-1]
    if item.get_closest_marker(marker) is None:
        raise TierError(
            f"{item.nodeid} starts {what} but is not marked @pytest.mark.{marker}: mark it "
            f'(pytestmark = pytest.mark.{marker}) so that `pytest -m "not ray and not '
            f'deployment"` leaves it out, or use the Ray-free federation (tests/federation_grid.py)'
        )


def _guard_ray_init(*args, **kwargs):
    check("ray", "Ray (ray.init)")
    return ORIGINALS["ray.init"](*args, **kwargs)


def _guard_run_simulation(*args, **kwargs):
    check("ray", "a Ray simulation (flwr.simulation.run_simulation)")
    return ORIGINALS["run_simulation"](*args, **kwargs)


def _guard_popen_init(self, args, *rest, **kwargs):
    marker = needed_marker(args)
    if marker is not None:
        shown = args if isinstance(args, str) else " ".join(str(a) for a in args)[:120]
        check(marker, f"a process ({shown})")
    return ORIGINALS["Popen.__init__"](self, args, *rest, **kwargs)


def install() -> None:
    """Wrap the three entry points, once per process."""
    if ORIGINALS:
        return
    import flwr.simulation
    import ray

    ORIGINALS["ray.init"], ray.init = ray.init, _guard_ray_init
    ORIGINALS["run_simulation"] = flwr.simulation.run_simulation
    flwr.simulation.run_simulation = _guard_run_simulation
    ORIGINALS["Popen.__init__"] = subprocess.Popen.__init__
    subprocess.Popen.__init__ = _guard_popen_init


def pytest_configure(config: pytest.Config) -> None:
    install()


#: The xdist group of the tests that start Ray or processes of a deployment: they run one after
#: another on one worker (fixed ports, Ray's start on a busy machine), beside the parallel rest.
PROCESS_GROUP = "ray-and-deployment"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist's workers must collect the same ids: one holding an object's address differs per process
    unstable = [item.nodeid for item in items if re.search(r" at 0x[0-9a-f]+", item.nodeid)]
    if unstable:
        raise pytest.UsageError(f"test ids hold an object's address (give ids=): {unstable[:3]}")
    if not getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("ray") or item.get_closest_marker("deployment"):
            join_group(item, PROCESS_GROUP)


def join_group(item: pytest.Item, group: str) -> None:
    """Put ``item`` in xdist's ``group``: ``--dist loadgroup`` sends the tests whose id ends in
    ``@group`` to one worker. xdist's own ``xdist_group`` marker writes that suffix into
    ``item._nodeid``, which pytest 9 no longer reads (it keeps the id as ``item._id``), so the
    marker alone groups nothing there; this writes it where the running pytest reads it
    (``tests/test_tiers.py`` checks that a group lands on one worker)."""
    grouped = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest >= 9
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(grouped)
    else:
        item._nodeid = grouped


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    _RUNNING.append(item)
    try:
        return (yield)
    finally:
        _RUNNING.pop()
