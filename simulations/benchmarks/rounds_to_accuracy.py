"""How many rounds each retraining needs to reach FedRetrain's accuracy: read from the per-round
test accuracy every retraining-style method logs (``accuracy_by_round`` in ``unlearning_log.jsonl``:
FedRetrain, rapid retraining, and the post-training of PGA, FedQUIT) in the run directories of a
suite (or any folder of runs).

Rapid retraining's headline (Liu et al., INFOCOM 2022) is that it gets to retraining's accuracy in
fewer rounds; the target here is FedRetrain's final accuracy less ``--tolerance`` points, and a
method's rounds are the first round whose accuracy reaches it ("never" when none does).

Writes ``rounds_to_accuracy.csv`` / ``.md`` (one row per run and method) and
``rounds_to_accuracy.png`` (accuracy per round, FedRetrain against rapid retraining, one panel per
partition, mean over seeds) into ``--output-dir`` (default: the runs' folder).

Usage::

    python -m simulations.benchmarks.rounds_to_accuracy results/suite [--tolerance 1.0]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.plots import display_name, legend_outside, method_colour, save_figure  # noqa: E402

COMPARED = ("fedretrain", "rapid-retraining")


def curves(run: Path) -> dict[str, list[float]]:
    """The per-round accuracies the run's last unlearning request logged, by method."""
    lines = (run / "unlearning_log.jsonl").read_text().splitlines()
    details = json.loads(lines[-1])["details"]
    return {m: d["accuracy_by_round"] for m, d in details.items() if d.get("accuracy_by_round")}


def first_reaching(curve: list[float], target: float) -> int | None:
    """The first round (1-based) whose accuracy is at least ``target``; None when none is."""
    return next((i + 1 for i, value in enumerate(curve) if value >= target), None)


def table(runs: list[Path], tolerance: float) -> pd.DataFrame:
    rows = []
    for run in runs:
        found = curves(run)
        if "fedretrain" not in found:
            continue
        target = found["fedretrain"][-1] - tolerance / 100
        for method, curve in found.items():
            reached = first_reaching(curve, target)
            rows.append(
                {
                    "run": run.name,
                    "method": method,
                    "rounds": len(curve),
                    "target_accuracy": round(target, 4),
                    "rounds_to_target": reached if reached is not None else "never",
                    "final_accuracy": curve[-1],
                }
            )
    return pd.DataFrame(rows)


def figure(runs: list[Path], path: Path) -> None:
    """Accuracy per round of the compared methods, one panel per partition (runs named
    ``<dataset>-<partition>-s<seed>`` by the suite), mean over seeds."""
    groups: dict[str, dict[str, list[list[float]]]] = {}
    for run in runs:
        setting = re.sub(r"-s?\d+$", "", run.name)  # digits-iid-s0: one panel per setting
        setting = run.parent.name if setting == "seed" else setting  # repeat's seed-<n> runs
        for method, curve in curves(run).items():
            if method in COMPARED:
                groups.setdefault(setting, {}).setdefault(method, []).append(curve)
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.2), squeeze=False)
    for ax, (setting, by_method) in zip(axes[0], sorted(groups.items())):
        for method, all_curves in by_method.items():
            length = min(map(len, all_curves))
            mean = np.mean([c[:length] for c in all_curves], axis=0)
            ax.plot(range(1, length + 1), mean, marker="o", ms=3, color=method_colour(method),
                    label=display_name(method))  # fmt: skip
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("test accuracy (mean over seeds)")
    legend_outside(axes[0][-1])
    fig.suptitle("Retraining without the forgotten client: accuracy per round", fontsize=10)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="a folder of run directories (a suite's output)")
    parser.add_argument("--tolerance", type=float, default=1.0, help="points below FedRetrain")
    parser.add_argument("--output-dir", type=Path)
    args = parser.parse_args(argv)
    runs = sorted(p for p in args.runs.iterdir() if (p / "unlearning_log.jsonl").is_file())
    if not runs:
        parser.error(f"{args.runs} holds no run directory with an unlearning_log.jsonl")
    output = args.output_dir or args.runs
    output.mkdir(parents=True, exist_ok=True)
    result = table(runs, args.tolerance)
    result.to_csv(output / "rounds_to_accuracy.csv", index=False)
    text = result.to_markdown(index=False, floatfmt=".4f")
    (output / "rounds_to_accuracy.md").write_text(text + "\n")
    figure(runs, output / "rounds_to_accuracy.png")
    print(text)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
