"""A comparison or a judge run repeated over K training seeds: every seed's row, mean ± sd, and for
the judge each method's verdict per seed and at how many seeds it holds.

One ``fedunlearn-run`` per seed (``--set seed=S``; the split, the initial model and the batch order
all change), skipped when its run directory already holds the result (rerun to resume). A verdict
printed from one seed is that seed's; what the README and RESULTS claim of a method holds at
every one of at least three seeds.

Writes, in ``--output-dir``:

* a comparison (``unlearning.csv`` per seed): ``seeds.csv`` (every seed's rows, a ``seed``
  column), ``seeds.md`` and ``seeds_summary.csv`` (per method: mean ± sd of test accuracy, gap to
  FedRetrain, client-epochs, then each seed's value and flag);
* a judge run (``judge.csv`` per seed, ``judge-models`` > 0): ``judge_seeds.csv`` (every seed's
  table), ``judge_seeds.md`` and ``judge_seeds_summary.csv`` (per method and seed the verdict, F
  and U-LiRA), ``judge_seeds_holds.md`` ("holds at k of K seeds").

**Stacked** (``--stack N``): the seeds are N model seeds of one split instead (``seed`` fixed: the
split, the target and its backdoor stay seed's; each member's initial model and batch order are
its own, :func:`fedunlearn.training.stacked.member_seeds`). The methods that stack
(:attr:`fedunlearn.method_spec.MethodSpec.stacks`) run once over the N federations as one
``stack-models = N`` run (``stack/``), every member's rows equal to its single run's
(``tests/unlearning/test_stacked_comparison.py``); every other method runs as before, one
``fedunlearn-run`` per member with ``model-seed`` = the member's seed (``member-<i>/``), beside
the stack's FedRetrain. ``seeds.csv``'s ``seed`` is then the member index, ``model_seed`` its seed.

Usage::

    python -m simulations.benchmarks.repeat simulations/judge_every_method_digits.toml \\
        --seeds 3 --set judge-models=16 --output-dir results/judge-seeds
    python -m simulations.benchmarks.repeat simulations/digits.toml --seeds 3 \\
        --output-dir results/digits-seeds [--data-root DIR] [--first-seed 0 | --seed-list 0 1 7]
    python -m simulations.benchmarks.repeat simulations/digits.toml --stack 3 \\
        --output-dir results/digits-stack
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedunlearn.config import ExperimentConfig
from fedunlearn.judge.report import INDISTINGUISHABLE, judge_verdicts
from fedunlearn.registry import UNLEARNING
from simulations import run as runner
from simulations.benchmarks._args import common_args

RESULT_FILES = ("unlearning.csv", "judge.csv")


def run_point(
    config: Path,
    output: Path,
    name: str,
    sets: Sequence[str],
    *,
    data_root: str | None = None,
    app: Path = runner.PROJECT_ROOT,
    engine: str = "flower",
) -> Path:
    """``fedunlearn-run CONFIG --engine ENGINE`` as run ``name`` under ``output`` with ``sets``;
    nothing is run when the run directory already holds a result, and a run interrupted before
    its result (its ``config.json`` written) is resumed (``resume = true``). Returns the run
    directory."""
    directory = output / name
    if any((directory / f).is_file() for f in RESULT_FILES):
        return directory
    argv = [str(config), "--output-dir", str(output), "--app", str(app), "--engine", engine]
    argv += ["--set", f"run-name='{name}'"] + [x for s in sets for x in ("--set", s)]
    if (directory / "config.json").is_file():
        argv += ["--set", "resume=true"]
    if data_root:
        argv += ["--data-root", data_root]
    print(f"=== {name}: fedunlearn-run {' '.join(argv)}", flush=True)
    code = runner.main(argv)
    if code != 0:
        raise SystemExit(f"{name} failed (exit {code}); see the lines above")
    return directory


def run_options(args: argparse.Namespace, **overrides) -> dict:
    """:func:`run_point`'s keywords from the options :func:`add_run_options` added (the data
    root, the app, the engine), with ``overrides`` (e.g. ``data_root=None`` for the digits)."""
    return {"data_root": args.data_root, "app": args.app, "engine": args.engine} | overrides


def add_run_options(parser: argparse.ArgumentParser, output_dir: str) -> None:
    """The options every benchmark that runs ``fedunlearn-run`` points shares: where results
    go, the data root, extra ``--set`` values, the app, and summarising what is there."""
    common_args(
        parser, output_dir, extra_set="per run", app=True, summarize_only="only tabulate what ran"
    )


def mean_sd(values: Sequence[float]) -> str:
    """``mean ± sd`` (sample sd; one value: the value)."""
    array = np.asarray(values, dtype=float)
    if len(array) < 2:
        return f"{array.mean():.4f}"
    return f"{array.mean():.4f} ± {array.std(ddof=1):.4f}"


def with_gaps(table: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``table`` (rows of several comparisons, identified by ``keys``) with each row's test
    accuracy gap to FedRetrain of the same comparison, in points, and its client-epochs as a
    share of FedRetrain's."""
    table = table.copy()
    reference = table.loc[
        table["method"] == "fedretrain", [*keys, "test_accuracy", "client_epochs"]
    ]
    joined = table[list(keys)].merge(reference, on=list(keys), how="left")
    retrained, epochs = joined["test_accuracy"].to_numpy(), joined["client_epochs"].to_numpy()
    table["gap_points"] = 100 * (table["test_accuracy"].to_numpy() - retrained)
    table["client_epochs_share"] = table["client_epochs"].to_numpy() / epochs
    return table


def comparison_summary(long: pd.DataFrame, keys: Sequence[str] = ()) -> pd.DataFrame:
    """Per method (and ``keys``): mean ± sd over seeds of test accuracy, gap and client-epochs
    share, how many seeds flagged it, and every seed's gap."""
    rows = []
    for group, part in long.groupby([*keys, "method"], sort=False):
        group = group if isinstance(group, tuple) else (group,)
        flags = part["flag"].fillna("").astype(str)
        rows.append(
            {
                **dict(zip([*keys, "method"], group)),
                "seeds": len(part),
                "test_accuracy": mean_sd(part["test_accuracy"]),
                "gap_points": mean_sd(part["gap_points"]),
                "client_epochs_share": mean_sd(part["client_epochs_share"]),
                "flagged": f"{int((flags != '').sum())} of {len(part)}",
                "gap_per_seed": ", ".join(
                    f"s{s}: {g:+.2f}{' FLAG' if f else ''}"
                    for s, g, f in zip(part["seed"], part["gap_points"], flags)
                ),
            }
        )
    return pd.DataFrame(rows)


def judge_seed_rows(tables: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """Per seed and method: the verdict (:func:`judge_verdicts`), F and U-LiRA accuracy with
    their intervals, backdoor success."""
    rows = []
    for seed, table in tables.items():
        indexed = table.set_index("population")
        for population, verdict in judge_verdicts(table).items():
            row = indexed.loc[population]
            rows.append(
                {
                    "seed": seed,
                    "method": population,
                    "verdict": verdict["verdict"],
                    "closer to fedretrain than retraining": verdict["closer"],
                    "backdoor_removed": verdict["backdoor_removed"],
                    "backdoor_problem": verdict.get("backdoor_problem", ""),
                    "f": f"{row['f']:.3f} [{row['f-low']:.3f}, {row['f-high']:.3f}]",
                    "ulira": (
                        f"{row['ulira-accuracy']:.3f} [{row['ulira-accuracy-low']:.3f}, "
                        f"{row['ulira-accuracy-high']:.3f}]"
                    ),
                    "f_retrain_independent": (
                        f"{indexed.loc['retrain-independent', 'f']:.3f} "
                        f"[{indexed.loc['retrain-independent', 'f-low']:.3f}, "
                        f"{indexed.loc['retrain-independent', 'f-high']:.3f}]"
                    ),
                }
            )
    return pd.DataFrame(rows)


def holds(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method: at how many seeds it was indistinguishable from retraining, and removed the
    backdoor."""
    out = []
    for method, part in rows.groupby("method", sort=False):
        k = len(part)
        same = int((part["verdict"] == INDISTINGUISHABLE).sum())
        removed = part["backdoor_removed"].dropna()
        out.append(
            {
                "method": method,
                "indistinguishable from retraining": f"holds at {same} of {k} seeds",
                "backdoor removed": _removed_count(part, removed),
            }
        )
    return pd.DataFrame(out)


def _removed_count(part: pd.DataFrame, removed: pd.Series) -> str:
    """``holds at r of m seeds`` over the seeds whose backdoor could tell, then how many could
    not (their original did not learn it); ``n/a`` without a backdoor."""
    unmeasurable = int(
        part.get("backdoor_problem", pd.Series(dtype=str)).fillna("").astype(bool).sum()
    )
    text = (
        f"holds at {int(removed.astype(bool).sum())} of {len(removed)} seeds"
        if len(removed)
        else ""
    )
    if unmeasurable:
        text += f"{'; ' if text else ''}not measurable at {unmeasurable} seed(s)"
    return text or "n/a"


def _write(table: pd.DataFrame, path: Path, title: str = "") -> str:
    """``path``.md (``title``, then ``table``) and the table as ``path``_summary.csv (``path``.csv
    keeps every seed's rows)."""
    markdown = (f"{title}\n\n" if title else "") + table.to_markdown(index=False) + "\n"
    table.to_csv(path.with_name(f"{path.name}_summary.csv"), index=False)
    path.with_suffix(".md").write_text(markdown, encoding="utf-8")
    return markdown


def summarize(output: Path, seeds: Sequence[int]) -> str:
    """Read every seed's result under ``output`` and write the tables; returns the markdown."""
    names = {seed: output / f"seed-{seed}" for seed in seeds}
    if all((d / "judge.csv").is_file() for d in names.values()):
        tables = {seed: pd.read_csv(d / "judge.csv") for seed, d in names.items()}
        long = pd.concat([t.assign(seed=s) for s, t in tables.items()], ignore_index=True)
        long.to_csv(output / "judge_seeds.csv", index=False)
        rows = judge_seed_rows(tables)
        text = _write(holds(rows), output / "judge_seeds_holds", "Verdicts over seeds")
        return text + "\n" + _write(rows, output / "judge_seeds", "Every seed")
    missing = [str(d) for d in names.values() if not (d / "unlearning.csv").is_file()]
    if missing:
        raise SystemExit(f"no result yet in {', '.join(missing)}")
    long = pd.concat(
        [pd.read_csv(d / "unlearning.csv").assign(seed=s) for s, d in names.items()],
        ignore_index=True,
    )
    long = with_gaps(long, ["seed"])
    long.to_csv(output / "seeds.csv", index=False)
    return _write(comparison_summary(long), output / "seeds", "Over seeds (mean ± sd)")


def split_methods(config: Path, sets: Sequence[str]) -> tuple[list[str], list[str]]:
    """The run's unlearning methods that stack, and the others (each in run-config order)."""
    methods = ExperimentConfig.from_run_config(runner.load_run_config(config, sets)).methods
    stacking = [m for m in methods if UNLEARNING[m].stacks]
    return stacking, [m for m in methods if m not in stacking]


def run_stacked(args, output: Path, members: int) -> list[int]:
    """``--stack N``: the stacking methods as one ``stack-models = N`` run, every other method one
    run per member (its ``model-seed``); returns the members' model seeds."""
    stacking, others = split_methods(args.config, args.set)
    if "fedretrain" not in stacking:
        raise SystemExit("--stack: unlearn-methods must include fedretrain (the reference)")
    sets = [*args.set, f"stack-models={members}", f"unlearn-methods='{','.join(stacking)}'"]
    stack = run_point(
        args.config,
        output,
        "stack",
        sets,
        **run_options(args),
    )
    seeds = json.loads((stack / "stack.json").read_text(encoding="utf-8"))["model_seeds"]
    for member, seed in enumerate(seeds if others else []):
        single = [*args.set, f"model-seed={seed}", f"unlearn-methods='{','.join(others)}'"]
        name = f"member-{member}"
        run_point(
            args.config,
            output,
            name,
            single,
            **run_options(args),
        )
    return seeds


def summarize_stacked(output: Path, members: int) -> str:
    """The ``--stack`` runs' rows as one comparison per member (the stack's rows, then the
    members' single runs' methods beside them), written and summarised as :func:`summarize` does."""
    stack = pd.read_csv(output / "stack" / "unlearning.csv")
    parts = [stack]
    for member in range(members):
        single = output / f"member-{member}" / "unlearning.csv"
        if single.is_file():
            rows = pd.read_csv(single)
            seed = stack.loc[stack["member"] == member, "model_seed"].iloc[0]
            parts.append(rows[rows["method"] != "fedavg"].assign(member=member, model_seed=seed))
    long = pd.concat(parts, ignore_index=True).rename(columns={"member": "seed"})
    long = with_gaps(long, ["seed"])
    long.to_csv(output / "seeds.csv", index=False)
    title = f"Over {members} model seeds of one split, stacked (mean ± sd)"
    return _write(comparison_summary(long), output / "seeds", title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--seeds", type=int, default=3, help="how many training seeds (>= 1)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--seed-list", type=int, nargs="+", help="these seeds instead of --seeds/--first-seed"
    )
    parser.add_argument(
        "--stack",
        type=int,
        default=0,
        metavar="N",
        help="N model seeds of one split as one stacked run (stack-models = N, N >= 2)",
    )
    add_run_options(parser, "results/seeds")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: a whole number >= 1")
    if args.stack == 1 or args.stack < 0:
        parser.error(f"--stack {args.stack}: 0 (off) or a whole number >= 2")
    output = args.output_dir.resolve()
    if args.stack:
        if not args.summarize_only:
            run_stacked(args, output, args.stack)
        print(summarize_stacked(output, args.stack))
        print(f"results in {output}")
        return 0
    seeds = args.seed_list or list(range(args.first_seed, args.first_seed + args.seeds))
    for seed in [] if args.summarize_only else seeds:
        run_point(
            args.config,
            output,
            f"seed-{seed}",
            [*args.set, f"seed={seed}"],
            **run_options(args),
        )
    print(summarize(output, seeds))
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
