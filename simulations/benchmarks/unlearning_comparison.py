"""Acceptance benchmark of FedEraser: the comparison (FedAvg, FedEraser, FedAccum, FedRetrain) on
several settings, each one ``fedunlearn-run`` (train → unlearn three ways → table), collected into
one table ``unlearning_comparison.csv``/``.md``.

Usage::

    python -m simulations.benchmarks.unlearning_comparison --data-root ~/data \\
        --output-dir results/federaser [--only mnist-iid adult] [--app PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from simulations import run as runner
from simulations.benchmarks import default_data_root
from simulations.benchmarks._args import common_args

SIMULATIONS = Path(__file__).resolve().parents[1]
SETTINGS = {
    "mnist-iid": ("mnist.toml", []),
    "adult": ("adult.toml", []),
    "fashion-mnist": ("fashion_mnist.toml", []),
    "mnist-dirichlet-0.5": ("mnist.toml", ["partitioning='dirichlet'", "alpha=0.5"]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-root",
        default=default_data_root(),
        help="dataset root holding MNIST, FashionMNIST and adult (default: $FEDUNLEARN_DATA_ROOT, else ~/data)",
    )
    common_args(
        parser,
        "results/federaser",
        data_root=False,  # the home folder even when missing: the run names what is absent
        extra_set="for every run",
        app=True,
        summarize_only="",
    )
    parser.add_argument("--only", nargs="*", choices=list(SETTINGS), help="run only these settings")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    names = args.only or list(SETTINGS)
    for name in names if not args.summarize_only else []:
        config, sets = SETTINGS[name]
        argv_run = [
            str(SIMULATIONS / config),
            "--data-root",
            args.data_root,
            "--output-dir",
            str(output),
        ]
        argv_run += ["--app", str(args.app), "--set", f"run-name='{name}'"]
        argv_run += [x for s in args.set + sets for x in ("--set", s)]
        print(f"=== {name}: fedunlearn-run {' '.join(argv_run)}", flush=True)
        started = time.perf_counter()
        code = runner.main(argv_run)
        print(f"=== {name}: exit {code}, {time.perf_counter() - started:.1f}s wall", flush=True)
        if code != 0:
            return code
    tables = []
    for name in names:
        path = output / name / "unlearning.csv"
        if path.exists():
            table = pd.read_csv(path)
            table.insert(0, "setting", name)
            tables.append(table)
    if not tables:
        print("no results yet", file=sys.stderr)
        return 1
    combined = pd.concat(tables, ignore_index=True)
    combined.to_csv(output / "unlearning_comparison.csv", index=False)
    markdown = combined.to_markdown(index=False, floatfmt=".4f")
    (output / "unlearning_comparison.md").write_text(markdown + "\n")
    print(markdown)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
