"""FedEraser's parameter sweeps, as in Liu et al.'s Figs. 5-7: the calibration ratio r, the retain
interval Δt, the number of clients K and the local epochs E_loc, one ``fedunlearn-run`` per point (train → unlearn → table).

Writes ``sweep_<parameter>.csv``/``.md`` (every method at every value) and ``sweep_<parameter>.png``
(test accuracy, target accuracy and unlearning time of FedEraser, FedAccum and FedRetrain).

Usage::

    python -m simulations.benchmarks.federaser_sweeps simulations/digits.toml \\
        --output-dir results/sweeps [--data-root DIR] [--only calibration-ratio]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.plots import display_name, method_colour  # noqa: E402
from simulations import run as runner  # noqa: E402
from simulations.benchmarks._args import common_args  # noqa: E402

SWEEPS = {
    "calibration-ratio": [0.1, 0.25, 0.5, 1.0],
    "retain-interval": [1, 2, 5, 10],
    "num-clients": [5, 10, 20, 25],
    # E_loc sets E_cali = ceil(r E_loc): how the main job's defaults were chosen (repeat with
    # --set seed=S for more seeds)
    "local-epochs": [2, 5, 10],
}
METHODS = ("federaser", "fedaccum", "fedretrain")


def _point(args, parameter: str, value, output: Path) -> pd.DataFrame:
    name = f"{parameter}-{value}"
    run_dir = output / name
    if not (run_dir / "unlearning.csv").exists():
        argv = [str(args.config), "--output-dir", str(output), "--set", f"run-name='{name}'"]
        argv += ["--set", f"{parameter}={value}", "--app", str(args.app)]
        argv += [x for s in args.set for x in ("--set", s)]
        if args.data_root:
            argv += ["--data-root", args.data_root]
        print(f"=== {name}", flush=True)
        if runner.main(argv) != 0:
            raise SystemExit(f"sweep point {name} failed")
    table = pd.read_csv(run_dir / "unlearning.csv")
    table.insert(0, parameter, value)
    return table


def plot_sweep(table: pd.DataFrame, parameter: str, path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for method in METHODS:
        rows = table[table["method"] == method]
        if rows.empty:
            continue
        style = {"marker": "o", "color": method_colour(method), "label": display_name(method)}
        axes[0].plot(rows[parameter], rows["test_accuracy"], **style)
        axes[1].plot(rows[parameter], rows["target_accuracy"], **style)
        axes[2].plot(rows[parameter], rows["seconds"], **style)
    for ax, label in zip(
        axes, ("test accuracy", "target's accuracy", "unlearning seconds"), strict=True
    ):
        ax.set_xlabel(parameter)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[2].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    common_args(parser, "results/sweeps", extra_set="for every run", app=True)
    parser.add_argument("--only", nargs="*", choices=list(SWEEPS))
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    for parameter in args.only or list(SWEEPS):
        table = pd.concat(
            [_point(args, parameter, v, output) for v in SWEEPS[parameter]], ignore_index=True
        )
        table.to_csv(output / f"sweep_{parameter}.csv", index=False)
        markdown = table.to_markdown(index=False, floatfmt=".4f")
        (output / f"sweep_{parameter}.md").write_text(markdown + "\n")
        plot_sweep(table, parameter, output / f"sweep_{parameter}.png")
        print(markdown, flush=True)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
