"""What N models cost: one ``fedunlearn-run`` of a judge config (N federations as one stack, every
method, the independent retrain and the judge's tests) against one ``fedunlearn-run`` of the same
setting as a single federation (``judge-models = 0``: train, then every method), wall time of each
whole command. The stacked run is ``ratio`` times cheaper per model when
``single seconds / (stacked seconds / N) = ratio``; written to ``judge_cost.csv``/``.md``.

Usage::

    python -m simulations.benchmarks.judge_cost simulations/judge_digits.toml \\
        --output-dir results/judge-cost [--data-root ~/data] [--set k=v]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from fedunlearn.config import ExperimentConfig
from simulations import run as runner
from simulations.benchmarks import default_data_root
from simulations.benchmarks._args import common_args


def _timed_run(config: Path, output: Path, name: str, data_root: str, sets: list[str]) -> float:
    argv = [str(config), "--output-dir", str(output), "--set", f"run-name='{name}'"]
    argv += ["--data-root", data_root] if data_root else []
    argv += [x for s in sets for x in ("--set", s)]
    print(f"=== {name}: fedunlearn-run {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    code = runner.main(argv)
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"{name}: fedunlearn-run exited {code}")
    print(f"=== {name}: {seconds:.1f}s", flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="a judge run config (judge-models = N)")
    common_args(parser, None, data_root=False)  # its --data-root: "" rather than None
    parser.add_argument("--data-root", default=default_data_root(must_exist=True) or "")
    parser.add_argument("--set", action="append", default=[], help="extra key=value for both runs")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    values = runner.load_run_config(args.config, args.set)
    models = ExperimentConfig.from_run_config(values).judge_models
    stem = args.config.stem
    single_sets = [*args.set, "judge-models=0", "judge-backdoor=false"]
    single = _timed_run(args.config, output, f"{stem}-single", args.data_root, single_sets)
    stacked = _timed_run(args.config, output, f"{stem}-stacked", args.data_root, args.set)
    judge = json.loads((output / f"{stem}-stacked" / "judge.json").read_text())
    row = {
        "setting": stem,
        "models": models,
        "single_run_seconds": round(single, 1),
        "stacked_run_seconds": round(stacked, 1),
        "stacked_seconds_per_model": round(stacked / models, 2),
        "cheaper_per_model": round(single / (stacked / models), 2),
        "judge_app_seconds": round(judge["seconds"], 1),
    }
    table = pd.DataFrame([row])
    table.to_csv(output / "judge_cost.csv", index=False)
    (output / "judge_cost.md").write_text(table.to_markdown(index=False) + "\n")
    print(table.to_markdown(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
