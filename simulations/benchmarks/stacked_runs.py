"""N federations as N runs against N federations as one stacked run: wall time and the same rows.

For a run config (default: the main job, ``simulations/digits.toml``) and N = ``--members``, each
of ``--repeats`` rounds times, one after the other (the order alternating between rounds so that a
change of machine load hits both sides), whole ``fedunlearn-run`` commands (start included):

* **separate**: N runs, member i's with ``model-seed`` = the i-th stack seed
  (:func:`fedunlearn.training.stacked.member_seeds` of the run's seed);
* **stacked**: one run with ``stack-models = N`` (:mod:`server.unlearning.stacked`),

with the run config's stacking methods (:attr:`fedunlearn.method_spec.MethodSpec.stacks`). Then,
member by member and method by method, how far the stacked rows are from the separate runs' (test
and target accuracy, backdoor success: the largest absolute difference; client-epochs: equal or
not). Writes ``stacked_runs.csv/.md`` (one row per round and side: seconds) and
``stacked_rows.csv/.md`` (the differences).

Usage::

    python -m simulations.benchmarks.stacked_runs [simulations/digits.toml] --members 3 \\
        --output-dir results/stacked-runs [--repeats 1] [--set rounds=5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from fedunlearn.config import ExperimentConfig
from fedunlearn.training.stacked import member_seeds
from simulations import run as runner
from simulations.benchmarks._args import common_args
from simulations.benchmarks.repeat import run_options, run_point, split_methods

#: The measured columns compared member by member.
COMPARED = ("test_accuracy", "target_accuracy", "attack_success")


def _timed_runs(args, output: Path, side: str, members: int, sets: list[str]) -> float:
    """Seconds of ``side``'s whole ``fedunlearn-run`` command(s) under ``output/side``."""
    where = output / side
    shutil.rmtree(where, ignore_errors=True)
    started = time.perf_counter()
    if side == "stacked":
        run_point(args.config, where, "stack", [*sets, f"stack-models={members}"], **args.run)
    else:
        for member, seed in enumerate(args.seeds):
            name, single = f"member-{member}", [*sets, f"model-seed={seed}"]
            run_point(args.config, where, name, single, **args.run)
    return time.perf_counter() - started


def row_differences(output: Path, members: int) -> pd.DataFrame:
    """Per member and method: the largest absolute difference of :data:`COMPARED` between the
    stacked run's row and the member's single run's, and whether client-epochs are equal."""
    stack = pd.read_csv(output / "stacked" / "stack" / "unlearning.csv")
    rows = []
    for member in range(members):
        single = pd.read_csv(output / "separate" / f"member-{member}" / "unlearning.csv")
        mine = stack[stack["member"] == member].set_index("method")
        for method, theirs in single.set_index("method").iterrows():
            diffs = [abs(float(mine.loc[method, c]) - float(theirs[c])) for c in COMPARED]
            rows.append(
                {
                    "member": member,
                    "method": method,
                    "max_abs_difference": max((d for d in diffs if d == d), default=0.0),
                    "test_accuracy_stacked": float(mine.loc[method, "test_accuracy"]),
                    "test_accuracy_separate": float(theirs["test_accuracy"]),
                    "client_epochs_equal": bool(
                        mine.loc[method, "client_epochs"] == theirs["client_epochs"]
                    ),
                }
            )
    return pd.DataFrame(rows)


def _write(table: pd.DataFrame, path: Path, title: str) -> None:
    table.to_csv(path.with_suffix(".csv"), index=False)
    text = f"{title}\n\n{table.to_markdown(index=False, floatfmt='.4f')}\n"
    path.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, nargs="?", default=Path("simulations/digits.toml"))
    parser.add_argument("--members", type=int, default=3, help="N federations (>= 2)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds (>= 1)")
    common_args(parser, "results/stacked-runs", extra_set="per run", app=True)
    args = parser.parse_args(argv)
    if args.members < 2 or args.repeats < 1:
        parser.error(f"--members {args.members} (>= 2), --repeats {args.repeats} (>= 1)")
    output = args.output_dir.resolve()
    output.mkdir(parents=True, exist_ok=True)
    stacking, _ = split_methods(args.config, args.set)
    sets = [*args.set, f"unlearn-methods='{','.join(stacking)}'"]
    config = ExperimentConfig.from_run_config(runner.load_run_config(args.config, sets))
    args.seeds = member_seeds(config.training_seed, args.members)
    args.run = run_options(args)
    timings = []
    for repeat in range(args.repeats):
        order = ("separate", "stacked") if repeat % 2 == 0 else ("stacked", "separate")
        for side in order:
            seconds = _timed_runs(args, output, side, args.members, sets)
            timings.append({"round": repeat, "side": side, "seconds": seconds})
            print(f"round {repeat}: {side} {seconds:.1f}s", flush=True)
    table = pd.DataFrame(timings)
    means = table.groupby("side")["seconds"].mean()
    title = (
        f"{args.members} federations of {args.config.name} ({', '.join(stacking)}): separate "
        f"{means['separate']:.1f}s, stacked {means['stacked']:.1f}s, "
        f"{means['separate'] / means['stacked']:.2f}x"
    )
    _write(table, output / "stacked_runs", title)
    differences = row_differences(output, args.members)
    worst = differences["max_abs_difference"].max()
    _write(
        differences, output / "stacked_rows", f"Stacked rows against single runs: worst {worst:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
