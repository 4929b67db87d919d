"""The membership-inference comparison over seeds: one ``fedunlearn-run`` of a run config
with ``mia = true`` per seed (train → unlearn with every method → attack every model), then each
column's mean ± std over the seeds in ``membership_mean_std.csv``/``.md``, and the wall time.

Usage::

    python -m simulations.benchmarks.membership_comparison simulations/mia_digits.toml \\
        --output-dir results/mia-digits [--seeds 0,1,2] [--data-root ~/data] [--set k=v]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from fedunlearn.membership.evaluation import mean_std
from simulations import run as runner
from simulations.benchmarks.repeat import add_run_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="a run config with mia = true")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (>= 3 for std)")
    add_run_options(parser, "results/membership")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    stem = args.config.stem
    started = time.perf_counter()
    for seed in seeds if not args.summarize_only else []:
        argv_run = [str(args.config), "--output-dir", str(output), "--app", str(args.app)]
        argv_run += ["--data-root", args.data_root] if args.data_root else []
        argv_run += ["--set", f"seed={seed}", "--set", f"run-name='{stem}-seed{seed}'"]
        argv_run += [x for s in args.set for x in ("--set", s)]
        print(f"=== seed {seed}: fedunlearn-run {' '.join(argv_run)}", flush=True)
        seed_started = time.perf_counter()
        code = runner.main(argv_run)
        print(
            f"=== seed {seed}: exit {code}, {time.perf_counter() - seed_started:.1f}s", flush=True
        )
        if code != 0:
            return code
    wall = time.perf_counter() - started
    tables = [
        pd.read_csv(path)
        for seed in seeds
        if (path := output / f"{stem}-seed{seed}" / "membership.csv").exists()
    ]
    if not tables:
        print("no results yet", file=sys.stderr)
        return 1
    summary = mean_std(tables)
    verdicts = pd.concat(tables).groupby("method", sort=False)["verdict"]
    summary["verdicts"] = summary["method"].map(
        verdicts.agg(lambda v: ", ".join(f"{k} x{n}" for k, n in v.value_counts().items()))
    )
    summary.to_csv(output / "membership_mean_std.csv", index=False)
    markdown = summary.to_markdown(index=False, floatfmt=".4g")
    (output / "membership_mean_std.md").write_text(markdown + "\n")
    print(markdown)
    print(f"{len(tables)} seed(s); wall time {wall:.1f}s; results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
