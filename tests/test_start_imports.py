"""A run's apps start without what only later phases need: the ServerApp's module imports neither
scikit-learn, SciPy nor matplotlib (the judge, the audits, the certified head and the figures import
them when a run asks for them), the ClientApp's no SciPy; the certified package gives the same
names as its modules, imported on first use. Each import runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
LATER = ("sklearn", "scipy", "matplotlib")


def _imported(statement: str) -> list[str]:
    """The packages of :data:`LATER` that ``statement`` imports in a fresh interpreter."""
    script = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps(sorted({{n.split('.')[0] for n in sys.modules}} & set({LATER!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "statement",
    [
        "import server.server_app",
        "import clients.client_app",
        "import fedunlearn.certified.dp_accounting",
    ],
)
def test_an_app_module_starts_without_the_later_phases_packages(statement):
    assert _imported(statement) == []


def test_the_later_phases_still_import_what_they_need():
    assert _imported("from fedunlearn.certified import FastFactor") == ["scipy"]
    assert "matplotlib" in _imported("import fedunlearn.plots")


def test_the_certified_package_gives_every_public_name_of_its_modules():
    import importlib

    import fedunlearn.certified as certified

    for name in certified.__all__:
        module = importlib.import_module(certified._SOURCES[name])
        assert getattr(certified, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        certified.no_such_name  # noqa: B018
    namespace: dict = {}
    exec("from fedunlearn.certified import *", namespace)
    assert set(certified.__all__) <= set(namespace)


def _loads_flower_link_state(statement: str) -> list[str]:
    """Whether ``statement`` loads Flower's in-memory LinkState, and whether the ServerApp's
    message index is then installed, in a fresh interpreter."""
    script = (
        f"import sys\n{statement}\nimport server.server_app as app\n"
        f"print(app.IN_MEMORY_LINKSTATE in sys.modules, app.index_simulation_messages())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True, check=True
    )
    return done.stdout.split()[-2:]


def test_the_message_index_is_installed_where_flowers_simulation_runs_and_only_there():
    # flwr-simulation (the process a `flwr run` simulation serves the ServerApp in) has loaded
    # the in-memory LinkState before the ServerApp starts: the index must be installed there ...
    assert _loads_flower_link_state("import flwr.simulation.app") == ["True", "True"]
    # ... while a ServerApp elsewhere (a deployment, the local engine) does not import it
    assert _loads_flower_link_state("pass") == ["False", "False"]
