"""The house's shape, held: no two modules import each other (directly or around a circle, type-only
and function-level imports included), no module outside the tests and benchmarks is over 600 lines,
and the ServerApp's top folder holds at most 8 modules (the rest are its phase packages)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fedunlearn", "server", "clients", "strategies", "simulations")


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


def test_no_module_is_over_600_lines_outside_the_tests_and_benchmarks():
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if "benchmarks" not in path.parts
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert long == {}


def test_the_server_top_holds_few_modules_and_its_phases_are_packages():
    top = sorted(path.name for path in (ROOT / "server").glob("*.py"))
    assert len(top) <= 8, top
    phases = sorted(p.name for p in (ROOT / "server").iterdir() if (p / "__init__.py").is_file())
    assert phases == ["audit", "certified", "federation", "scrubbing", "training", "unlearning"]
