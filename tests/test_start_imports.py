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
