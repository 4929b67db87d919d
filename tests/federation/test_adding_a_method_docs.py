"""docs/adding-a-method.md, executed as written: its modules are written where it says (in a
temporary folder added to their packages' paths), its registry lines run in the namespace of
``fedunlearn/registry.py``, and the toys are then listed, validated, documented, coloured, put in
the bad-input cases and run like built-in methods, with no other file edited; only the two
generated files (``pyproject.toml``'s block, ``docs/configuration.md``) would be rewritten."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from doc_pages import python_blocks
from test_malicious_clients import ClientAppGrid

import fedunlearn.registry as registry_module
from fedunlearn.config import ExperimentConfig, constraints_markdown, parameter_table
from fedunlearn.config.pyproject import method_keys_block, with_method_keys
from fedunlearn.errors import ConfigError
from fedunlearn.plots import method_colour
from fedunlearn.registry import SCRUBBING, UNLEARNING, run_retention
from server.training.original import train_federated
from server.unlearning.request import run_unlearning

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-method.md"
REGISTRY_LINE = ("UNLEARNING.register(", "SCRUBBING.register(")
FROM_A_TEST = "with SCRUBBING.registered("

pytestmark = pytest.mark.usefixtures("flower_task_identity")


def _blocks() -> list[tuple[str | None, str]]:
    return python_blocks(DOC)


def _modules() -> dict[str, str]:
    """The page's modules: path -> code (not its registry lines, not its test snippet)."""
    return {
        path: code
        for path, code in _blocks()
        if path and not code.startswith((*REGISTRY_LINE, FROM_A_TEST))
    }


def _run(code: str, namespace: dict) -> None:
    exec(compile(code, str(DOC), "exec"), namespace)


@pytest.fixture
def toys(tmp_path, monkeypatch):
    """The page's modules written and importable, its registry lines run; undone afterwards."""
    for path, code in _modules().items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code, encoding="utf-8")
        package = importlib.import_module(path.rpartition("/")[0].replace("/", "."))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(target.parent)])
    before = {registry: set(registry.names()) for registry in (UNLEARNING, SCRUBBING)}
    try:
        for _, code in _blocks():
            if code.startswith(REGISTRY_LINE):
                _run(code, dict(vars(registry_module)))
        yield
    finally:
        for registry, names in before.items():
            for name in set(registry.names()) - names:
                registry.unregister(name)
        for path in _modules():
            sys.modules.pop(path.removesuffix(".py").replace("/", "."), None)


def _test_module(path: str):
    """A test module of this repository, loaded by path (their folders are no packages)."""
    name = f"as_loaded_by_the_docs_test.{Path(path).stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_the_page_has_the_two_toys_and_their_registry_lines():
    assert set(_modules()) == {"server/zero_head.py", "fedunlearn/unlearning/snapshots.py"}
    assert sum(code.startswith(REGISTRY_LINE) for _, code in _blocks()) == 2


def test_the_scrubbing_toy_is_listed_validated_and_refused_misspelt(toys):
    assert SCRUBBING["zero-head"].resolve().__module__ == "server.zero_head"
    config = ExperimentConfig.from_run_config({"scrub-methods": "newton,zero-head"})
    assert config.scrubbing_methods == ["newton", "zero-head"]
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"scrub-methods": "zero-hed"})
    message = str(info.value)
    assert message.startswith(
        "invalid scrub-methods='zero-hed': a comma-separated subset of newton"
    )
    assert message.endswith("zero-head; did you mean zero-head?")


def test_the_retention_toys_key_is_read_checked_and_documented(toys):
    [row] = [row for row in parameter_table() if row.key == "snapshot-every"]
    assert (row.method, row.group, row.default) == ("first-snapshot", "unlearning", 2)
    config = ExperimentConfig.from_run_config(
        {"unlearn-methods": "fedretrain,first-snapshot", "snapshot-every": 3}
    )
    assert config.snapshot_every == config.unlearning.snapshot_every == 3
    [policy] = run_retention(config)
    assert type(policy).__name__ == "Snapshots" and policy.every == 3
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"snapshot-every": 0})
    assert str(info.value).startswith("invalid snapshot-every=0: a whole number >= 1")
    assert "| `snapshot-every` | int | `2` | a whole number >= 1 |" in constraints_markdown()
    assert "snapshot-every = 2  # first-snapshot: " in method_keys_block()
    assert re.fullmatch(r"#[0-9a-f]{6}", method_colour("first-snapshot"))


def test_the_other_tests_need_no_edit_for_the_toys(toys):
    """The bad-input cases, the table's and the colours' checks read the registry: they take the
    toys in as they are. Only the generated block of pyproject.toml would change (for flwr run)."""
    bad = _test_module("tests/test_bad_run_inputs.py")._generic_cases()
    assert {case.id for case in bad} >= {"snapshot-every=5.0", "snapshot-every='many'"}
    table = _test_module("tests/test_config_table.py")
    table.test_each_interval_error_says_what_the_page_says()
    table.test_every_key_has_one_group_a_description_and_a_default_its_constraint_allows()
    figures = _test_module("tests/test_figures.py")
    figures.test_every_method_name_has_one_fixed_colour_and_unknown_names_a_stable_one()
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    added = set(with_method_keys(text).splitlines()) - set(text.splitlines())
    assert [line.split(" = ")[0] for line in added] == ["snapshot-every"]


def test_registering_from_a_test_is_as_the_page_shows():
    [code] = [code for _, code in _blocks() if code.startswith(FROM_A_TEST)]
    seen = []
    namespace = {
        "SCRUBBING": SCRUBBING,
        "zero_head": lambda context, name: None,
        "overrides": {"scrub": True, "scrub-methods": "zero-head"},
        "register_the_name_on_clients": object(),
        "simulate": lambda overrides, **kwargs: seen.append("zero-head" in SCRUBBING),
    }
    _run(code, namespace)
    assert seen == [True] and "zero-head" not in SCRUBBING


def test_the_retention_toy_forgets_a_client_through_the_real_client_app(toys, tmp_path):
    values = {
        "num-clients": 4,
        "rounds": 3,
        "local-epochs": 1,
        "output-dir": str(tmp_path),
        "run-name": "toy",
        "node-wait-seconds": 5,
        "unlearn-clients": "1",
        "unlearn-methods": "fedretrain,first-snapshot",
        "snapshot-every": 2,
    }
    grid = ClientAppGrid(values)
    outcome = train_federated(grid, ExperimentConfig.from_run_config(values), log=lambda _: None)
    run_unlearning(grid, outcome, [1], log=lambda _: None)
    table = pd.read_csv(outcome.run.path / "unlearning.csv").set_index("method")
    assert table.loc["first-snapshot", "did"] == "rolled back to round 1"
    assert SimpleNamespace(**table.loc["fedretrain"].to_dict()).test_accuracy > 0.5
