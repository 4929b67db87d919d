"""Whether two runs left the same models, bit for bit (streaming aggregation: a round folded
reply by reply must give the model the round aggregated whole gave).

Compares every ``model_*.safetensors`` of two run directories tensor by tensor (``torch.equal``:
the same values and dtypes, not close) and writes ``same_models.csv``/``.md``: one row per model
file, with the largest absolute difference where they differ. Exit code 1 when any model differs
or is missing from one run.

Usage: the main job from a checkout before the change and from this one, then::

    git worktree add /tmp/before a944b22   # the commit before streaming aggregation
    (cd /tmp/before && python -c "import sys; from simulations.run_args import main; \\
        sys.exit(main(sys.argv[1:]))" simulations/digits.toml --output-dir /tmp/runs/before \\
        --set unlearn-methods=federaser,fedretrain)
    fedunlearn-run simulations/digits.toml --output-dir /tmp/runs/after \\
        --set unlearn-methods=federaser,fedretrain
    python -m simulations.benchmarks.same_models /tmp/runs/before/digits-* /tmp/runs/after/digits-* \\
        --output-dir simulations/benchmarks/results/streaming
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import safetensors.torch


def compare(before: Path, after: Path) -> pd.DataFrame:
    """One row per model file of either run: identical, and the largest difference."""
    names = sorted({p.name for run in (before, after) for p in run.glob("model_*.safetensors")})
    rows = []
    for name in names:
        if not (before / name).is_file() or not (after / name).is_file():
            rows.append({"model": name, "identical": False, "max_abs_difference": "missing"})
            continue
        one, two = (safetensors.torch.load_file(run / name) for run in (before, after))
        same = one.keys() == two.keys() and all(
            one[k].dtype == two[k].dtype and bool((one[k] == two[k]).all()) for k in one
        )
        largest = max(
            (float((one[k].double() - two[k].double()).abs().max()) for k in one if k in two),
            default=float("nan"),
        )
        rows.append({"model": name, "identical": same, "max_abs_difference": largest})
    return pd.DataFrame(rows, columns=["model", "identical", "max_abs_difference"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a run directory")
    parser.add_argument("after", type=Path, help="the same run, another checkout")
    parser.add_argument("--output-dir", type=Path, help="where same_models.csv/.md go")
    args = parser.parse_args(argv)
    for run in (args.before, args.after):
        if not run.is_dir():
            parser.error(f"{run} is not a run directory")
    table = compare(args.before, args.after)
    if table.empty:
        parser.error("neither run directory holds a model_*.safetensors file")
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.output_dir / "same_models.csv", index=False)
        (args.output_dir / "same_models.md").write_text(table.to_markdown(index=False) + "\n")
    print(table.to_markdown(index=False))
    return 0 if bool(table["identical"].all()) else 1


if __name__ == "__main__":
    sys.exit(main())
