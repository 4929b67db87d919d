"""The unlearning methods when clients are sampled per round: the main job (``simulations/digits.toml``: digits,
K = 10, 20 rounds of 10 local epochs, Δt = 2, forget client 0) with ``fraction-train`` 1 and 0.5, on
IID, Dirichlet(0.1) and label-shard partitions, over seeds. With sampling, FedRetrain samples the
same fraction of the remaining clients, and FedEraser calibrates each retained round over its
remaining participants (docs/scale.md); the acceptance compares the two within 1 point.
``--methods`` adds others that hold under sampling (FedRecover, Crab, SIFU: each compared with
the FedRetrain of the same run). ``--calibration-clients 0 9`` runs each point under each value
of FedEraser's ``calibration-clients`` (0, the default: each retained round calibrated by its
remaining participants, the paper's rule; m > 0: topped up to m remaining clients, ours), as
separate points (``-calibration<m>`` in the run's name; 0 keeps the plain name).

Each point is one ``fedunlearn-run`` (skipped when its directory already holds a result). Writes
into ``--output-dir``:

* ``sampling.csv`` / ``.md``: per point each method's test accuracy gap to FedRetrain (points,
  ``<method>_gap``) and flag, FedRetrain's accuracy, FedEraser's client-epochs as a share of
  FedRetrain's; then per method, partition and fraction the mean and the worst gap;
* ``sampling.png``: per partition, each method's gap to FedRetrain at each fraction, each seed a
  dot, the ±1 point band shaded (with several ``--calibration-clients``: FedEraser alone, once
  per value).

Usage::

    python -m simulations.benchmarks.sampling [--fractions 1.0 0.5]
        [--partitionings iid dirichlet-0.1 shards] [--seeds 3] [--output-dir results/sampling]
        [--methods federaser,fedaccum,fedretrain,fedrecover,crab,sifu] [--calibration-clients 0 9]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.plots import save_figure  # noqa: E402
from simulations.benchmarks.repeat import add_run_options, run_options, run_point  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "digits.toml"
PARTITIONS = {
    "iid": ["partitioning='iid'"],
    "dirichlet-0.1": ["partitioning='dirichlet'", "alpha=0.1"],
    "shards": ["partitioning='shards'"],
}


def point(run: Path, partitioning: str, fraction: float, seed: int, calibration: int = 0) -> dict:
    """One run's row: each method against FedRetrain (both sampled alike)."""
    table = pd.read_csv(run / "unlearning.csv").set_index("method")
    retrained = table.loc["fedretrain"]
    row = {
        "partitioning": partitioning,
        "fraction_train": fraction,
        "calibration_clients": calibration,
        "seed": seed,
        "fedretrain_accuracy": retrained["test_accuracy"],
        "federaser_accuracy": table.loc["federaser", "test_accuracy"],
    }
    for method in _compared(table.index):
        row[f"{method}_gap"] = 100 * (
            table.loc[method, "test_accuracy"] - retrained["test_accuracy"]
        )
    row["federaser_client_epochs_share"] = (
        table.loc["federaser", "client_epochs"] / retrained["client_epochs"]
    )
    for method in _compared(table.index):
        value = table.loc[method, "flag"]
        row[f"{method}_flag"] = value if isinstance(value, str) else ""
    return row


def _compared(methods) -> list[str]:
    """The unlearning methods of a table, less the original model and the reference."""
    return [m for m in methods if m not in ("fedavg", "fedretrain")]


def _gap_columns(rows: pd.DataFrame) -> list[str]:
    return [c for c in rows.columns if c.endswith("_gap")]


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method, partition, fraction and calibration-clients: the mean and worst gap, seeds
    within 1 point, and FedEraser's client-epochs as a share of FedRetrain's."""
    parts = []
    keys = ["partitioning", "fraction_train", "calibration_clients"]
    for column in _gap_columns(rows):
        grouped = rows.groupby(keys, sort=False)[column]
        part = grouped.agg(
            seeds="count",
            mean_gap="mean",
            worst_gap=lambda gaps: gaps.loc[gaps.abs().idxmax()],
            within_1_point=lambda gaps: f"{int((gaps.abs() <= 1).sum())} of {len(gaps)}",
        ).reset_index()
        share = rows.groupby(keys, sort=False)["federaser_client_epochs_share"].mean()
        part["federaser_client_epochs_share"] = share.to_numpy()
        parts.append(part.assign(method=column.removesuffix("_gap")))
    table = pd.concat(parts, ignore_index=True)
    return table[["method", *[c for c in table.columns if c != "method"]]]


def figure(rows: pd.DataFrame, path: Path) -> None:
    """Per partition, each method's gap to FedRetrain at each fraction, each seed a dot."""
    partitions = list(dict.fromkeys(rows["partitioning"]))
    series = _series(rows)
    fig, axes = plt.subplots(
        1, len(partitions), figsize=(4.5 * len(partitions), 4.5), squeeze=False
    )
    fractions = sorted(set(rows["fraction_train"]), reverse=True)
    for axis, partitioning in zip(axes[0], partitions):
        part = rows[rows["partitioning"] == partitioning]
        axis.axhspan(-1, 1, color="tab:green", alpha=0.15, label="within 1 point")
        for index, (label, column, chosen) in enumerate(series):
            offset = (index - (len(series) - 1) / 2) * 0.12
            shown = part[chosen(part)]
            x = [fractions.index(f) + offset for f in shown["fraction_train"]]
            axis.scatter(x, shown[column], color=f"C{index}", label=f"{label}, a seed", s=18)
        axis.set_xticks(range(len(fractions)), [f"{f:g}" for f in fractions])
        axis.set_xlim(-0.5, len(fractions) - 0.5)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_title(f"{partitioning}")
        axis.set_xlabel("fraction-train (clients a round)")
        axis.set_ylabel("test accuracy gap to FedRetrain (points)")
    # below the panels, where it hides no dot (tight bounding box: save_figure keeps it)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3)
    fig.suptitle("Each method vs FedRetrain, both with the clients sampled per round (digits)")
    save_figure(fig, path)


def _series(rows: pd.DataFrame) -> list:
    """(label, gap column, row selector) per dot series: each method; with several
    calibration-clients values, FedEraser alone, once per value (the comparison's subject)."""
    values = sorted(set(rows["calibration_clients"]))
    series = []
    for column in _gap_columns(rows):
        method = column.removesuffix("_gap")
        if len(values) == 1:
            series.append((method, column, lambda part: part.index == part.index))
            continue
        if method != "federaser":
            continue
        for value in values:
            label = f"{method}, calibration-clients {value}" + (" (paper)" if value == 0 else "")
            series.append((label, column, lambda part, v=value: part["calibration_clients"] == v))
    return series


def _markdown(table: pd.DataFrame) -> str:
    """The table in markdown: accuracies to 4 decimals, gaps (points) and shares to 2."""
    formats = [".4f" if c.endswith("_accuracy") else ".2f" for c in table.columns]
    return table.to_markdown(index=False, floatfmt=formats)


def run_name(partitioning: str, fraction: float, seed: int, calibration: int) -> str:
    """A point's run directory: the plain name for calibration-clients 0."""
    name = f"{partitioning}-fraction{fraction:g}-seed{seed}"
    return name + (f"-calibration{calibration}" if calibration else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--partitionings", nargs="+", default=list(PARTITIONS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--methods", default="", help="unlearn-methods for every run (default: the config's)"
    )
    parser.add_argument(
        "--calibration-clients",
        type=int,
        nargs="+",
        default=[0],
        help="FedEraser's calibration-clients, each a point of its own (0: the paper's rule)",
    )
    add_run_options(parser, "results/sampling")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    rows = []
    points = [
        (partitioning, fraction, calibration, seed)
        for partitioning in args.partitionings
        for fraction in args.fractions
        for calibration in args.calibration_clients
        for seed in range(args.seeds)
    ]
    for partitioning, fraction, calibration, seed in points:
        name = run_name(partitioning, fraction, seed, calibration)
        sets = [*PARTITIONS[partitioning], f"fraction-train={fraction}", f"seed={seed}"]
        sets += [f"unlearn-methods='{args.methods}'"] if args.methods else []
        sets += [f"calibration-clients={calibration}"] if calibration else []
        if not args.summarize_only:
            run_point(
                CONFIG,
                output,
                name,
                [*sets, *args.set],
                **run_options(args, data_root=None),
            )
        if (output / name / "unlearning.csv").is_file():
            rows.append(point(output / name, partitioning, fraction, seed, calibration))
    table = pd.DataFrame(rows)
    table.to_csv(output / "sampling.csv", index=False)
    text = (
        "## The methods with the clients sampled per round\n\n"
        + _markdown(table)
        + "\n\n"
        + _markdown(summary(table))
    )
    (output / "sampling.md").write_text(text + "\n")
    figure(table, output / "sampling.png")
    print(text)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
