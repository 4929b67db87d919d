"""The house's shape, held: no two modules import each other (directly or around a circle, type-only
and function-level imports included), no module outside the tests and benchmarks is over 600 lines
(one over 500 is reported as a :class:`LongModuleWarning`: split it along its seams before it grows),
and the ServerApp's top folder holds at most 8 modules (the rest are its phase packages)."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedunlearn", "server", "clients", "strategies", "simulations")
#: A product module over this many lines fails the house test.
MAX_LINES = 600
#: A product module over this many lines is reported (:class:`LongModuleWarning`), the test passes.
WARN_LINES = 500


class LongModuleWarning(UserWarning):
    """A product module is over :data:`WARN_LINES` lines: split it along its seams (never trim it)."""


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports anywhere in it (``from a import b``: ``a.b`` when
    that is a module, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                out.add(child if child in modules else base)
    return {module for module in out if module in modules and module != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other_around_a_circle():
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_planted_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def _long_modules(paths, limit: int, root: Path = ROOT) -> dict[str, int]:
    """Path (relative to ``root``) -> line count of each of ``paths`` over ``limit`` lines, leaving
    out the benchmarks."""
    return {
        str(path.relative_to(root)): n
        for path in paths
        if "benchmarks" not in path.relative_to(root).parts
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > limit
    }


def test_no_module_is_over_600_lines_outside_the_tests_and_benchmarks():
    assert _long_modules(_modules().values(), MAX_LINES) == {}


def _report_long_modules(paths, root: Path = ROOT) -> dict[str, int]:
    """Warn (:class:`LongModuleWarning`, in pytest's warnings summary) of each of ``paths`` over
    :data:`WARN_LINES` lines; return them with their line counts."""
    long = _long_modules(paths, WARN_LINES, root)
    for path, n in sorted(long.items()):
        warnings.warn(
            f"{path} has {n} lines (over {WARN_LINES}; the cap is {MAX_LINES}): split it along its "
            "seams into modules named for their concerns",
            LongModuleWarning,
            stacklevel=2,
        )
    return long


def test_a_module_over_500_lines_is_reported_as_a_warning():
    _report_long_modules(_modules().values())


def test_the_line_counter_reports_a_planted_long_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "benchmarks").mkdir()
    long, short = tmp_path / "pkg" / "long.py", tmp_path / "pkg" / "short.py"
    bench = tmp_path / "benchmarks" / "long.py"
    long.write_text("x = 1\n" * (WARN_LINES + 1))
    short.write_text("x = 1\n" * WARN_LINES)
    bench.write_text("x = 1\n" * (MAX_LINES + 1))
    planted = [long, short, bench]
    with pytest.warns(LongModuleWarning, match=r"pkg/long\.py has 501 lines") as caught:
        reported = _report_long_modules(planted, tmp_path)
    assert reported == {"pkg/long.py": WARN_LINES + 1} and len(caught) == 1
    assert _long_modules(planted, MAX_LINES, tmp_path) == {}
    short.write_text("x = 1\n" * (MAX_LINES + 1))
    assert _long_modules(planted, MAX_LINES, tmp_path) == {"pkg/short.py": MAX_LINES + 1}


def test_the_server_top_holds_few_modules_and_its_phases_are_packages():
    top = sorted(path.name for path in (ROOT / "server").glob("*.py"))
    assert len(top) <= 8, top
    phases = sorted(p.name for p in (ROOT / "server").iterdir() if (p / "__init__.py").is_file())
    assert phases == ["audit", "certified", "federation", "scrubbing", "training", "unlearning"]
