"""The comparison suite: every client-removal method on every dataset and label skew, over seeds.

Every method of ``simulations/suite.toml`` (FedEraser, FedAccum, FedRecover, Crab, SIFU, FedRetrain)
× {IID, Dirichlet(0.5), Dirichlet(0.1), label shards} × {digits, MNIST, Fashion-MNIST, Adult}
× 3 training seeds. Seed S forgets client S, so targets vary with the seed. Each point is one
``fedunlearn-run`` (train → every method → table), skipped when its run directory already holds
``unlearning.csv``: rerun the command to resume. A point that fails is reported and the suite goes
on; ``suite.md`` names every point without a result.

Writes, in ``--output-dir``:

* ``suite.csv``: every row of every run (dataset, partition, seed, method, test accuracy, gap to
  FedRetrain in points, client-epochs and their share of FedRetrain's, what the method did, its
  flag);
* ``suite.md``: per method, how many runs flagged it and its gap per partition (mean and worst);
  then per dataset, partition and method, mean ± sd over seeds, how many seeds flagged it, and
  what it did at the first seed;
* ``suite.png``: gap to FedRetrain against client-epochs share, one point per method and
  setting (mean over seeds), flagged points marked.

Usage::

    python -m simulations.benchmarks.suite [--quick] [--output-dir results/suite] [--data-root DIR]
    python -m simulations.benchmarks.suite --datasets digits adult --partitions iid shards

``--quick`` (about 5 minutes on 2 cores: 64-96 s a point): digits with every partition, one
seed. The full suite runs 48 points in about 1.7 hours (3 minutes an MNIST or Fashion-MNIST point,
25 s an Adult one); MNIST, Fashion-MNIST and Adult use a seeded 6,000-sample training subset.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.plots import (  # noqa: E402
    display_name,
    legend_outside,
    method_colour,
    save_figure,
)
from simulations.benchmarks.repeat import (  # noqa: E402
    add_run_options,
    comparison_summary,
    run_point,
    with_gaps,
)

SUITE_CONFIG = Path(__file__).resolve().parents[1] / "suite.toml"
#: Each dataset's own keys (the rest is suite.toml's).
DATASETS = {
    "digits": ["dataset='digits'", "lr=0.05", "batch-size=32"],
    # MNIST at simulations/mnist.toml's lr = 0.05 diverged on Dirichlet(0.1), seed 2 (round 3
    # train loss 92, every model at 0.098): the suite uses Fashion-MNIST's 0.02.
    "mnist": ["dataset='mnist'", "train-samples=6000", "lr=0.02", "momentum=0.9"],
    "fashion-mnist": ["dataset='fashion-mnist'", "train-samples=6000", "lr=0.02", "momentum=0.9"],
    "adult": ["dataset='adult'", "train-samples=6000", "lr=0.01", "momentum=0.9"],
}
PARTITIONS = {
    "iid": ["partitioning='iid'"],
    "dirichlet-0.5": ["partitioning='dirichlet'", "alpha=0.5"],
    "dirichlet-0.1": ["partitioning='dirichlet'", "alpha=0.1"],
    "shards": ["partitioning='shards'", "shards-per-client=2"],
}
SEEDS = (0, 1, 2)
KEYS = ("dataset", "partition", "seed")


def points(datasets, partitions, seeds):
    """(dataset, partition, seed, run name, --set values) of every point, digits first."""
    for dataset in datasets:
        for partition in partitions:
            for seed in seeds:
                sets = [*DATASETS[dataset], *PARTITIONS[partition]]
                sets += [f"seed={seed}", f"unlearn-clients='{seed}'"]
                yield dataset, partition, seed, f"{dataset}-{partition}-s{seed}", sets


def collect(output: Path, chosen) -> pd.DataFrame:
    """Every finished point's rows, with its keys, the gap to FedRetrain and the epochs share."""
    tables = []
    for dataset, partition, seed, name, _ in chosen:
        path = output / name / "unlearning.csv"
        if path.is_file():
            table = pd.read_csv(path)
            tables.append(table.assign(dataset=dataset, partition=partition, seed=seed))
    if not tables:
        raise SystemExit(f"no finished point under {output}")
    long = with_gaps(pd.concat(tables, ignore_index=True), KEYS)
    front = [*KEYS, "method", "test_accuracy", "gap_points", "client_epochs",
             "client_epochs_share", "did", "flag"]  # fmt: skip
    return long[front + [c for c in long.columns if c not in front]]


def summary(long: pd.DataFrame) -> pd.DataFrame:
    """:func:`comparison_summary` per dataset and partition, the original's row left out, with
    what each method did at the first seed."""
    rows = long[long["method"] != "fedavg"]
    table = comparison_summary(rows, ["dataset", "partition"])
    first = rows[rows["seed"] == rows["seed"].min()].set_index(["dataset", "partition", "method"])
    table["did (first seed)"] = [
        first["did"].get((d, p, m), "") for d, p, m in
        zip(table["dataset"], table["partition"], table["method"])
    ]  # fmt: skip
    return table


def by_method(long: pd.DataFrame) -> pd.DataFrame:
    """One row per method (neither the original nor FedRetrain): how many runs flagged it, its
    gap to FedRetrain per partition (mean over datasets and seeds, and the worst run), and its
    client-epochs as a share of FedRetrain's (mean)."""
    rows = long[~long["method"].isin(["fedavg", "fedretrain"])]
    table = []
    for method, part in rows.groupby("method", sort=False):
        flags = part["flag"].fillna("").astype(str) != ""
        row = {"method": method, "flagged": f"{int(flags.sum())} of {len(part)} runs"}
        for partition, gaps in part.groupby("partition", sort=False)["gap_points"]:
            row[f"gap {partition}"] = f"{gaps.mean():+.2f} (worst {gaps.min():+.1f})"
        row["client-epochs share"] = f"{part['client_epochs_share'].mean():.2f}"
        table.append(row)
    return pd.DataFrame(table)


def points_note(long: pd.DataFrame, chosen) -> str:
    """Markdown lines naming every chosen point without a result (failed or not run yet) and
    every point whose original training is flagged (its comparison means little)."""
    done = set(zip(long["dataset"], long["partition"], long["seed"]))
    missing = [name for dataset, partition, seed, name, _ in chosen
               if (dataset, partition, seed) not in done]  # fmt: skip
    lines = [f"No result ({len(missing)} of {len(chosen)} points): {', '.join(missing)}."] * bool(
        missing
    )
    originals = long[(long["method"] == "fedavg") & (long["flag"].fillna("").astype(str) != "")]
    lines += [
        f"{d}-{p}-s{s}: the original is flagged ({f}); its rows mean little."
        for d, p, s, f in originals[[*KEYS, "flag"]].itertuples(index=False)
    ]
    return "".join(f"\n{line}\n" for line in lines)


MARKERS = {"iid": "o", "dirichlet-0.5": "s", "dirichlet-0.1": "^", "shards": "D"}


def suite_figure(long: pd.DataFrame, title: str = ""):
    """Gap to FedRetrain (points) against client-epochs share of FedRetrain's: one point per
    method and setting (dataset, partition; mean over seeds), colour per method, marker per
    partition; a point flagged at any seed is ringed in red with its count."""
    rows = long[~long["method"].isin(["fedavg", "fedretrain"])]
    means = rows.groupby(["dataset", "partition", "method"], sort=False).agg(
        gap=("gap_points", "mean"),
        share=("client_epochs_share", "mean"),
        flagged=("flag", lambda f: int((f.fillna("").astype(str) != "").sum())),
        seeds=("seed", "nunique"),
    )
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = {m: method_colour(m) for m in rows["method"].unique()}
    for (_, partition, method), point in means.iterrows():
        ax.scatter(point["share"], point["gap"], color=colours[method],
                   marker=MARKERS.get(partition, "o"), s=45, zorder=3, alpha=0.85)  # fmt: skip
        if point["flagged"]:
            ax.scatter(point["share"], point["gap"], s=180, facecolors="none",
                       edgecolors="tab:red", linewidths=1.5, zorder=4)  # fmt: skip
            ax.annotate(f"{int(point['flagged'])}/{int(point['seeds'])}",
                        (point["share"], point["gap"]),
                        textcoords="offset points", xytext=(6, -10), fontsize=7,
                        color="tab:red")  # fmt: skip
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="", label=display_name(m))
               for m, c in colours.items()]  # fmt: skip
    handles += [plt.Line2D([], [], color="grey", marker=k, linestyle="", label=p)
                for p, k in MARKERS.items() if p in set(rows["partition"])]  # fmt: skip
    handles.append(plt.Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="tab:red",
                              linestyle="", markersize=11, label="flagged (seeds)"))  # fmt: skip
    legend_outside(ax, handles=handles)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.axvline(1, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yscale("symlog", linthresh=5)
    ticks = [
        t for t in (-100, -50, -20, -10, -5, -2, 0, 2, 5, 10) if t >= min(means["gap"].min(), -5)
    ]
    ax.set_yticks(ticks, [f"{t:+d}" if t else "0" for t in ticks])
    ax.set_ylim(min(means["gap"].min() * 1.3, -5), max(means["gap"].max() * 1.3, 5))
    ax.set_xlabel("client-epochs, share of FedRetrain's (1 = as costly as retraining)")
    ax.set_ylabel("test accuracy gap to FedRetrain (points, symlog)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title or "every client-removal method: gap to retraining vs cost")
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits, every partition, one seed")
    parser.add_argument("--datasets", nargs="*", choices=list(DATASETS))
    parser.add_argument("--partitions", nargs="*", choices=list(PARTITIONS))
    parser.add_argument("--seeds", nargs="*", type=int)
    add_run_options(parser, "results/suite")
    args = parser.parse_args(argv)
    datasets = args.datasets or (["digits"] if args.quick else list(DATASETS))
    seeds = args.seeds if args.seeds is not None else (SEEDS[:1] if args.quick else SEEDS)
    chosen = list(points(datasets, args.partitions or list(PARTITIONS), seeds))
    output = args.output_dir.resolve()
    started = time.perf_counter()
    for index, (_, _, _, name, sets) in enumerate([] if args.summarize_only else chosen, 1):
        print(f"=== point {index}/{len(chosen)}, {time.perf_counter() - started:.0f}s", flush=True)
        root = args.data_root if not name.startswith("digits") else None
        try:
            run_point(SUITE_CONFIG, output, name, [*sets, *args.set], data_root=root, app=args.app)
        except SystemExit as failed:  # one failed point must not end a run of hours
            print(f"=== {failed}; the suite goes on", flush=True)
    long = collect(output, chosen)
    long.to_csv(output / "suite.csv", index=False)
    table = summary(long)
    markdown = (
        "Per method, over every dataset and seed:\n\n"
        + by_method(long).to_markdown(index=False)
        + "\n\nPer dataset and partition, over seeds:\n\n"
        + table.to_markdown(index=False)
        + "\n"
        + points_note(long, chosen)
    )
    (output / "suite.md").write_text(markdown, encoding="utf-8")
    save_figure(suite_figure(long), output / "suite.png")
    print(markdown)
    print(f"results in {output} ({time.perf_counter() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
