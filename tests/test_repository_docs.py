"""The README and docs/ are for users: no path outside the repository, a README a newcomer reads in
ten minutes, links that resolve, commands that parse (``--dry-run`` or ``--help``), pages that speak
of the project alone (no work-item numbers) and results that say when they were measured."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from fedunlearn import cli
from simulations import run as runner

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "simulations" / "benchmarks" / "RESULTS.md"
#: Pages a user reads: the README, docs/ (figures' page included), the measured results and the
#: reference implementations' set-up.
READ_PAGES = [
    README,
    *sorted((ROOT / "docs").rglob("*.md")),
    RESULTS,
    ROOT / "simulations" / "benchmarks" / "reference" / "README.md",
]
README_MAX_LINES = 350
#: A run that continues an earlier one can only be checked up to the point where it needs that run.
NEEDS_EARLIER_RUN = "a finished run under"
#: The launch-time error for a dataset the local copy does not hold (CI has no CIFAR-10).
DATA_MISSING = re.compile(r"a folder holding the (\S+) files")
#: ``fedunlearn`` groups whose commands are a second word (``store info``, ``data download``).
GROUPS_WITH_COMMANDS = {"store", "data"}


def _tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [ROOT / name for name in listed.stdout.split("\0") if name]


def _shell_commands(page: Path) -> list[str]:
    """Every command of the page's ``bash`` blocks: continuation lines joined, comments dropped,
    ``a && b`` split, a virtual environment's ``.venv/bin/`` prefix removed."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line).strip()
            for part in line.split("&&"):
                commands.append(re.sub(r"^\.venv/bin/", "", part.strip()))
    return [command for command in commands if command]


def _documented(prefixes: tuple[str, ...]) -> list:
    return [
        pytest.param(command, id=f"{page.name}: {command[:70]}")
        for page in PAGES
        for command in _shell_commands(page)
        if command.startswith(prefixes)
    ]


#: The benchmark data's folder beside the project, which users of the project do not have (spelt in
#: two parts so that this file does not name it).
OUTSIDE = "../" + "shared"


def test_no_file_in_the_repository_points_outside_it():
    outside = [
        str(path.relative_to(ROOT))
        for path in _tracked_files()
        if path.name != "run" or path.parent.name != ".ci"
        if path.is_file() and OUTSIDE in path.read_text(errors="replace")
    ]
    assert outside == []


def test_the_readme_is_short_enough_to_read():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_every_docs_link_in_the_readme_resolves():
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text())
    assert links, "the README links its docs/ pages"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert missing == []


def test_the_readme_test_command_is_what_ci_runs():
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in README.read_text()


_LOADED: dict[tuple, object] = {}


@pytest.fixture
def datasets_loaded_once(monkeypatch):
    """The dry runs load and partition the data (read-only); load each dataset once for all of them."""
    from fedunlearn.data import federated_data

    original = federated_data.load_dataset

    def cached(name, data_root=None, *, download=False, seed=0, **options):
        key = (name, str(data_root), download, seed, tuple(sorted(options.items())))
        if key not in _LOADED:
            _LOADED[key] = original(name, data_root, download=download, seed=seed, **options)
        return _LOADED[key]

    monkeypatch.setattr(federated_data, "load_dataset", cached)


@pytest.mark.parametrize("command", _documented(("fedunlearn-run", "python -m simulations.run")))
def test_documented_runs_pass_the_dry_run(
    command, tmp_path, monkeypatch, capsys, datasets_loaded_once
):
    """Each documented run validates (keys, flags, data, run directory) exactly as it would start,
    writing nothing: into a fresh output folder, with ``~/data`` read from FEDUNLEARN_DATA_ROOT."""
    argv = shlex.split(command)
    argv = argv[1:] if argv[0] == "fedunlearn-run" else argv[3:]
    if "~/data" in argv:
        data_root = os.environ.get("FEDUNLEARN_DATA_ROOT")
        if not data_root:
            pytest.skip("the command reads ~/data: set FEDUNLEARN_DATA_ROOT to a local copy")
        argv = [data_root if word == "~/data" else word for word in argv]
    monkeypatch.chdir(ROOT)
    code = runner.main([*argv, "--output-dir", str(tmp_path), "--dry-run"])
    error = capsys.readouterr().err
    dataset = DATA_MISSING.search(error)
    if code == 2 and dataset:
        pytest.skip(f"the local copy holds no {dataset.group(1)}")
    if "unlearn-only=true" in argv:
        assert code == 2 and NEEDS_EARLIER_RUN in error, error
    else:
        assert code == 0, error


@pytest.mark.parametrize("command", _documented(("fedunlearn ",)))
def test_documented_fedunlearn_commands_parse(command, capsys):
    """``fedunlearn <group> [<command>] --help``: the documented subcommand exists (no side effects)."""
    words = shlex.split(command)[1:]
    subcommand = words[:2] if words[0] in GROUPS_WITH_COMMANDS else words[:1]
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*subcommand, "--help"])
    assert exited.value.code == 0
    assert f"usage: fedunlearn {' '.join(subcommand)}" in capsys.readouterr().out


def _documented_benchmarks() -> list[str]:
    modules = {shlex.split(p.values[0])[2] for p in _documented(("python -m simulations.benchmarks.",))}
    return sorted(modules)


@pytest.mark.parametrize("module", _documented_benchmarks())
def test_documented_benchmarks_exist_and_parse(module, capsys):
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(module).main(["--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


#: Settings that make a documented training run short; they do not change what the recipe does.
TINY = ("--set", "rounds=2", "--set", "local-epochs=1")


def _sequential_recipes() -> list:
    """Documented pairs: a training run, then ``unlearn-only`` on the same ``run-name`` (a pair
    documented on several pages, once)."""
    pairs = {}
    for page in PAGES:
        runs = [c for c in _shell_commands(page) if c.startswith("fedunlearn-run")]
        for first, second in zip(runs, runs[1:]):
            name = re.search(r"run-name=(\S+)", first)
            if name and "unlearn-only=true" in second and f"run-name={name.group(1)}" in second:
                pairs.setdefault((first, second), f"{page.name}: {name.group(1)}")
    return [pytest.param(*pair, id=name) for pair, name in pairs.items()]


@pytest.mark.parametrize(("train", "request_"), _sequential_recipes())
def test_documented_sequential_recipes_run(train, request_, tmp_path, monkeypatch, simulate):
    """Each documented train-then-forget recipe runs as written (training made short), in one
    process: the second command reopens the first's run and forgets its client."""
    import tomllib

    monkeypatch.chdir(ROOT)
    run_dirs = []
    for command, extra in ((train, TINY), (request_, ())):
        argv = [*shlex.split(command)[1:], *extra, "--output-dir", str(tmp_path)]
        config, text = runner.check_run(runner.parser().parse_args(argv))
        simulate(tomllib.loads(text), num_supernodes=config.num_clients)
        run_dirs.append(config.run_directory())
    assert run_dirs[0] == run_dirs[1]
    log = (run_dirs[0] / "unlearning_log.jsonl").read_text().splitlines()
    asked = [re.search(r"unlearn-clients=(\S+)", c) for c in (train, request_)]
    first = asked[0].group(1) if asked[0] else "0"  # the main job's default target
    expected = [[int(first)], [int(asked[1].group(1))]]
    assert [json.loads(line)["targets"] for line in log] == expected


#: How a page would cite a work item by number instead of saying what it means: "issue 25",
#: "issues 12 and 14", "work item 7", "item 4", "acceptance 1", "PR 3", "(#27)". A colour
#: (``#1f77b4``, ``#000000``), an anchor (``page.md#3-x``), an address (``.../issues/2``) and an
#: HTML entity (``&#8212;``) are not citations.
WORK_ITEM = re.compile(
    r"\bissues?\s+#?\d+"
    r"|\b(?:work[- ])?items?\s+#?\d+"
    r"|\bacceptance\s+#?\d+"
    r"|\b(?:PR|pull request)\s*#?\d+"
    r"|(?<![\w/&#])#(?![0-9a-fA-F]{6}(?:[0-9a-fA-F]{2})?\b)\d+\b",
    re.IGNORECASE,
)
#: A RESULTS.md section's heading ends with the date its numbers were measured.
SECTION_DATE = re.compile(r"\((\d{4}-\d{2}-\d{2})\)$")


def _work_item_citations(text: str) -> list[str]:
    """Each line that cites a work item by number; a heading's own ``#`` marks are not read."""
    return [
        f"{number}: {line.strip()[:100]}"
        for number, line in enumerate(text.splitlines(), 1)
        if WORK_ITEM.search(re.sub(r"^#+\s", "", line))
    ]


def test_the_work_item_pattern_catches_a_citation_and_nothing_else():
    for cited in (
        "The skewed runs behind issue 25 rolled back.",
        "as in Issue 31",
        "issues 12 and 14",
        "the fix (#27)",
        "work item 7",
        "work-item 7",
        "issue 27 item 4",
        "(acceptance 1 and 2)",
        "see PR #3",
    ):
        assert _work_item_citations(cited), cited
    for clean in (
        "## The judge over seeds (2026-11-26)",
        'color: "#1f77b4", "#000000"',
        "[Data](#data), docs/scale.md#3-rounds",
        "github.com/Liar-Mask/FedAU/issues/2",
        "a dash &#8212; here",
        "| # | hot spot |",
        "the issue's run, the items listed, issued 3 certificates",
    ):
        assert not _work_item_citations(clean), clean


@pytest.mark.parametrize("page", READ_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_pages_cite_no_work_item_numbers(page):
    """A reader has no tracker: a page says what it means ("the label-skew runs"), not a number."""
    assert _work_item_citations(page.read_text()) == []


def _results_sections() -> list[str]:
    """RESULTS.md's ``## `` headings, outside code blocks."""
    headings, fenced = [], False
    for line in RESULTS.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            headings.append(line)
    return headings


def test_every_results_section_is_dated():
    """Each section names what it measured and ends with the date it was measured: (YYYY-MM-DD)."""
    sections = _results_sections()
    assert len(sections) > 10, "RESULTS.md is read by its ## sections"
    undated = [heading for heading in sections if not SECTION_DATE.search(heading)]
    assert undated == []
    for heading in sections:
        datetime.date.fromisoformat(SECTION_DATE.search(heading).group(1))  # a real day
