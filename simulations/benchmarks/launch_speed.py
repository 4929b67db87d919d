"""How long the commands that start nothing take: this checkout next to a baseline checkout.

Times, side by side and interleaved (``--repeats`` rounds, each command once per checkout per
round), the commands that need neither PyTorch nor Flower to answer, or only the data:

* ``fedunlearn-run --dry-run simulations/digits.toml`` (validates, loads and partitions digits),
* ``fedunlearn-run --set roudns=5`` (a misspelt key) and ``--set rounds=abc`` (a bad value),
* ``fedunlearn methods``, ``fedunlearn store info RUN`` (``--store``), ``fedunlearn data check digits``.

Each runs in a fresh interpreter of this environment with the checkout first on ``PYTHONPATH`` (so
the baseline's code runs with the same packages), from the checkout's folder; it also records which
of torch, flwr, ray, pandas, sklearn and scipy the command imported. The baseline is any checkout,
e.g. ``git worktree add --detach ../baseline 40ea318``.

Writes ``launch_speed.csv`` (one row per run) and ``launch_speed.md`` (median and fastest seconds
per command and checkout, and what each imported) in ``--output-dir``.

Usage (about a minute; an idle machine, for figures to compare)::

    python -m simulations.benchmarks.launch_speed --baseline ../baseline --store RUN_DIR \\
        --output-dir simulations/benchmarks/results/launch_speed
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from simulations.run_parser import PROJECT_ROOT

HEAVY = ("torch", "flwr", "ray", "pandas", "sklearn", "scipy")
#: Runs ``main`` of a module as its console script does, then names the heavy packages it imported.
WRAPPER = (
    "import sys\n"
    "from {module} import main\n"
    "try:\n"
    "    code = main()\n"
    "finally:\n"
    f"    print('IMPORTED', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def commands(store: Path | None) -> list[tuple[str, str, list[str]]]:
    """(label, module, arguments) of each timed command."""
    run = "simulations.run_args"
    chosen = [
        (
            "fedunlearn-run --dry-run simulations/digits.toml",
            run,
            ["--dry-run", "simulations/digits.toml"],
        ),
        ("fedunlearn-run --set roudns=5", run, ["--set", "roudns=5"]),
        ("fedunlearn-run --set rounds=abc", run, ["--set", "rounds=abc"]),
        ("fedunlearn methods", "fedunlearn.cli", ["methods"]),
        ("fedunlearn data check digits", "fedunlearn.cli", ["data", "check", "digits"]),
    ]
    if store is not None:
        chosen.append(
            ("fedunlearn store info RUN", "fedunlearn.cli", ["store", "info", str(store)])
        )
    return chosen


def time_one(checkout: Path, module: str, arguments: list[str]) -> tuple[float, int, str]:
    """(seconds, exit status, imported heavy packages) of one command run from ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    script = WRAPPER.format(module=module)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    imported = [line for line in done.stderr.splitlines() if line.startswith("IMPORTED")]
    return seconds, done.returncode, " ".join(imported[-1].split()[1:]) if imported else "?"


def summary(rows: list[dict]) -> str:
    """The markdown table: per command, each checkout's median and fastest seconds and imports."""
    lines = [
        "| command | checkout | median s | fastest s | exit | imported |",
        "|---|---|---|---|---|---|",
    ]
    for label in dict.fromkeys(r["command"] for r in rows):
        for checkout in dict.fromkeys(r["checkout"] for r in rows):
            mine = [r for r in rows if r["command"] == label and r["checkout"] == checkout]
            seconds = [r["seconds"] for r in mine]
            lines.append(
                f"| `{label}` | {checkout} | {statistics.median(seconds):.2f} | {min(seconds):.2f} "
                f"| {mine[-1]['exit']} | {mine[-1]['imported'] or 'none of them'} |"
            )
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.benchmarks.launch_speed", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--baseline", type=Path, required=True, help="the checkout to compare with")
    parser.add_argument("--store", type=Path, help="a run directory for `store info`")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of every command (5)")
    parser.add_argument("--output-dir", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    checkouts = {"baseline": args.baseline.resolve(), "this": PROJECT_ROOT}
    rows = []
    for repeat in range(1, args.repeats + 1):
        for label, module, arguments in commands(args.store):
            for name, checkout in checkouts.items():
                seconds, code, imported = time_one(checkout, module, arguments)
                rows.append(
                    {"repeat": repeat, "command": label, "checkout": name, "seconds": round(seconds, 3),
                     "exit": code, "imported": imported, "load": round(os.getloadavg()[0], 2)}
                )  # fmt: skip
    args.output_dir.mkdir(parents=True, exist_ok=True)
    with (args.output_dir / "launch_speed.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    loads = [r["load"] for r in rows]
    text = (
        summary(rows) + f"\nLoad average during the runs: {min(loads):.2f} to {max(loads):.2f}.\n"
    )
    (args.output_dir / "launch_speed.md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
