"""Under which training does each method hold? One knob at a time around the papers' regime, on
digits, IID and label skew (Dirichlet(0.1)), 3 seeds, with the suite's forgetting signal.

The base is the suite's ``papers`` regime (:mod:`simulations.benchmarks.suite`: 20 rounds of
E_loc = 10, Δt = 2, r = 0.5, 2 post-training rounds; seed S forgets client S, which planted a
backdoor). Each knob of :data:`KNOBS` moves alone through its values, with the methods whose quality
depends on it (every method for the local epochs and the rounds; FedEraser and FedAccum for Δt;
FedEraser for r; PGA, FedQUIT and FedOSD for the post-training rounds), always beside FedRetrain
and keep-training (the no-unlearning baseline, at FedRetrain's budget). A point at the base value
is the base run, shared by every knob.

Each point is one ``fedunlearn-run`` (skipped when its run directory already holds a result).
Writes, in ``--output-dir``:

* ``sensitivity.csv``: every row (knob, value, partition, seed, method, gap to FedRetrain in points,
  backdoor success and its distance above FedRetrain's, forgetting verdict, client-epochs share,
  flag);
* ``sensitivity.md``: per method, knob and value, mean gap (worst seed), how many seeds forgot as
  FedRetrain, how many were unflagged, cost share; then per method and partition the values at
  which it held (unflagged at every seed);
* ``sensitivity.png``: gap to FedRetrain (top) and backdoor left above FedRetrain's (bottom)
  against each knob's value, one line per method (IID solid, Dirichlet(0.1) dashed);
* ``sensitivity_cost.png``: the same points against their cost (client-epochs, share of
  FedRetrain's).

Usage::

    python -m simulations.benchmarks.sensitivity [--output-dir results/sensitivity]
        [--knobs local-epochs rounds] [--partitions iid dirichlet-0.1] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.errors import FedUnlearnError  # noqa: E402
from fedunlearn.plots import display_name, legend_outside, method_colour, save_figure  # noqa: E402
from simulations.benchmarks.repeat import add_run_options, run_options, run_point, with_gaps  # noqa: E402
from simulations.benchmarks.suite import SUITE_CONFIG, Point, points, signal_sets  # noqa: E402
from simulations.benchmarks.suite_tables import (  # noqa: E402
    record_refused,
    symlog_gaps,
    with_signal_columns,
)

EVERY_METHOD = (
    "federaser,fedaccum,fedrecover,crab,sifu,rapid-retraining,pga,fedquit,fedosd,fedau"
).split(",")
#: knob -> (its values, the methods its value matters to); the base values are the papers'.
KNOBS = {
    "local-epochs": ((1, 2, 5, 10), EVERY_METHOD),
    "rounds": ((5, 10, 20), EVERY_METHOD),
    "retain-interval": ((1, 2, 4), ["federaser", "fedaccum"]),
    "calibration-ratio": ((0.2, 0.5, 1.0), ["federaser"]),
    "post-training-rounds": ((0, 2, 5, 10), ["pga", "fedquit", "fedosd"]),
}
BASE = {
    "local-epochs": 10,
    "rounds": 20,
    "retain-interval": 2,
    "calibration-ratio": 0.5,
    "post-training-rounds": 2,
}
REFERENCES = ["fedretrain", "keep-training"]
PARTITIONS = ("iid", "dirichlet-0.1")
SEEDS = (0, 1, 2)
KEYS = ("knob", "value", "partition", "seed")


def sweep(knobs: Sequence[str], partitions: Sequence[str], seeds: Sequence[int]) -> Iterator[tuple]:
    """``(knob, value, point)`` of every point; a base-valued point is the shared base run
    (knob ``"base"``), listed once per knob that reaches it, run once."""
    for knob in knobs:
        values, methods = KNOBS[knob]
        for value in values:
            base = value == BASE[knob]
            chosen = EVERY_METHOD if base else methods
            methods_set = f"unlearn-methods='{','.join([*chosen, *REFERENCES])}'"
            for point in points(["digits"], partitions, seeds, ["papers"]):
                sets = (*point.sets, f"{knob}={value}", methods_set)
                name = "base" if base else f"{knob}={value}"
                yield knob, value, Point(name, point.dataset, point.partition, point.seed, sets)


def run_sweep(chosen, args) -> dict[str, str]:
    """Run every distinct point not run yet; the refused ones' reasons, by label."""
    output, refused, started, done = args.output_dir.resolve(), {}, time.perf_counter(), set()
    distinct = [p for _, _, p in chosen if not (p.label in done or done.add(p.label))]
    for index, point in enumerate(distinct, 1):
        print(f"=== point {index}/{len(distinct)} {point.label}, "
              f"{time.perf_counter() - started:.0f}s", flush=True)  # fmt: skip
        try:
            signal, why = signal_sets(point, None)
        except FedUnlearnError as error:
            signal, why = [], f"refused: {error}"
        if why:
            refused[point.label] = why
            continue
        try:
            run_point(SUITE_CONFIG, output / point.regime, point.name,
                      [*point.sets, *signal, *args.set], **run_options(args, data_root=None))  # fmt: skip
        except SystemExit as failed:
            print(f"=== {failed}; the sweep goes on", flush=True)
    return refused


def collect(output: Path, chosen) -> pd.DataFrame:
    """Every finished point's rows, under each knob that reaches it."""
    tables = []
    for knob, value, point in chosen:
        path = output / point.regime / point.name / "unlearning.csv"
        if path.is_file():
            keys = dict(zip(KEYS, (knob, value, point.partition, point.seed)))
            tables.append(pd.read_csv(path).assign(**keys))
    if not tables:
        raise SystemExit(f"no finished point under {output}")
    return with_signal_columns(with_gaps(pd.concat(tables, ignore_index=True), KEYS), KEYS)


def per_value(long: pd.DataFrame) -> pd.DataFrame:
    """Per method, knob, partition and value (the knob's own methods and keep-training): mean gap
    (worst seed), backdoor left above FedRetrain's, seeds that forgot as FedRetrain and seeds
    unflagged, and the cost share."""
    rows = []
    keep = long[~long["method"].isin(["fedavg", "fedretrain"])]
    for (method, knob, partition, value), part in keep.groupby(
        ["method", "knob", "partition", "value"], sort=True
    ):
        if method not in [*KNOBS[knob][1], "keep-training"]:
            continue
        rows.append(
            {
                "method": method,
                "knob": knob,
                "partition": partition,
                "value": value,
                "gap": f"{part['gap_points'].mean():+.2f} (worst {part['gap_points'].min():+.1f})",
                "backdoor above fedretrain": f"{part['backdoor_above_points'].mean():+.1f}",
                "forgot as fedretrain": f"{int((part['forgetting'] == 'as fedretrain').sum())} of {len(part)}",
                "unflagged": f"{int((part['flag'] == '').sum())} of {len(part)}",
                "cost share": f"{part['client_epochs_share'].mean():.2f}",
            }
        )
    return pd.DataFrame(rows)


def holds(long: pd.DataFrame) -> pd.DataFrame:
    """Per method and partition, for each knob swept (a partial sweep, ``--knobs``, has only
    its own columns) and the methods it is swept for, the values at which it held: unflagged
    (within ``flag-gap`` of FedRetrain's accuracy and forgetting as FedRetrain) at every seed."""
    swept = [knob for knob in KNOBS if knob in set(long["knob"])]
    rows = []
    for (method, partition), part in long[~long["method"].isin(["fedavg", "fedretrain"])].groupby(
        ["method", "partition"], sort=False
    ):
        row = {"method": method, "partition": partition}
        for knob in swept:
            if method not in KNOBS[knob][1]:
                continue
            values = part[part["knob"] == knob].groupby("value")["flag"]
            held = [v for v, flags in values if (flags == "").all()]
            row[knob] = ", ".join(f"{v:g}" for v in held) if held else "none"
        if len(row) > 2:
            rows.append(row)
    return pd.DataFrame(rows, columns=["method", "partition", *swept])


def figure(long: pd.DataFrame):
    """Gap (top) and backdoor left above FedRetrain's (bottom) against each knob's value."""
    knobs = list(dict.fromkeys(long["knob"]))
    fig, axes = plt.subplots(2, len(knobs), figsize=(3.6 * len(knobs), 7), squeeze=False)
    styles = {"iid": "-", "dirichlet-0.1": "--"}
    drawn = {}
    for column, knob in enumerate(knobs):
        part = long[(long["knob"] == knob) & ~long["method"].isin(["fedavg", "fedretrain"])]
        gaps = []
        for (method, partition), rows in part.groupby(["method", "partition"], sort=False):
            if method not in [*KNOBS[knob][1], "keep-training"]:
                continue
            drawn[method] = True
            means = rows.groupby("value")[["gap_points", "backdoor_above_points"]].mean()
            gaps += list(means["gap_points"].dropna())
            for row, measure in enumerate(("gap_points", "backdoor_above_points")):
                axes[row, column].plot(means.index, means[measure], marker="o", markersize=3,
                                       color=method_colour(method),
                                       linestyle=styles.get(partition, ":"))  # fmt: skip
        axes[0, column].set_title(knob)
        axes[1, column].set_xlabel(f"{knob} (base {BASE[knob]:g})")
        symlog_gaps(axes[0, column], gaps)
        for row in (0, 1):
            axes[row, column].axhline(0, color="black", linewidth=0.8)
            axes[row, column].grid(alpha=0.3)
    axes[0, 0].set_ylabel("test accuracy gap to FedRetrain (points)")
    axes[1, 0].set_ylabel("backdoor success above FedRetrain's (points)")
    handles = [plt.Line2D([], [], color=method_colour(m), label=display_name(m)) for m in drawn]
    handles += [plt.Line2D([], [], color="grey", linestyle=s, label=p) for p, s in styles.items()]
    legend_outside(axes[0, -1], handles=handles)
    fig.suptitle("digits, papers' regime, one knob at a time: mean over 3 seeds")
    return fig


def cost_figure(long: pd.DataFrame):
    """The sweep's points against their cost: gap (left) and backdoor left (right) against the
    client-epochs share of FedRetrain's, a method's points joined along each knob."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    part = long[~long["method"].isin(["fedavg", "fedretrain"])]
    means = part.groupby(["method", "knob", "partition", "value"], sort=True)[
        ["client_epochs_share", "gap_points", "backdoor_above_points"]
    ].mean()
    drawn = {}
    for (method, knob, partition), rows in means.groupby(level=[0, 1, 2]):
        if method not in [*KNOBS[knob][1], "keep-training"]:
            continue
        drawn[method] = True
        for ax, measure in zip(axes, ("gap_points", "backdoor_above_points")):
            ax.plot(rows["client_epochs_share"], rows[measure], marker="o", markersize=3,
                    color=method_colour(method), alpha=0.7,
                    linestyle="-" if partition == "iid" else "--")  # fmt: skip
    for ax, label in zip(axes, ("test accuracy gap to FedRetrain (points, symlog)",
                                "backdoor success above FedRetrain's (points)")):  # fmt: skip
        ax.set_xlabel("client-epochs, share of FedRetrain's")
        ax.set_ylabel(label)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.grid(alpha=0.3)
    symlog_gaps(axes[0], [v for v in means["gap_points"] if math.isfinite(v)])
    legend_outside(axes[1], handles=[plt.Line2D([], [], color=method_colour(m),
                                                label=display_name(m)) for m in drawn])  # fmt: skip
    fig.suptitle("quality against cost over the sweep (IID solid, Dirichlet(0.1) dashed)")
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--knobs", nargs="*", choices=list(KNOBS), default=list(KNOBS))
    parser.add_argument("--partitions", nargs="*", default=list(PARTITIONS))
    parser.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    add_run_options(parser, "results/sensitivity")
    args = parser.parse_args(argv)
    chosen = list(sweep(args.knobs, args.partitions, args.seeds))
    output = args.output_dir.resolve()
    refused = record_refused(output, {} if args.summarize_only else run_sweep(chosen, args))
    long = collect(output, chosen)
    long.to_csv(output / "sensitivity.csv", index=False)
    text = (
        "Per method, knob and value (mean over seeds):\n\n"
        + per_value(long).to_markdown(index=False)
        + "\n\nWhere each method held (unflagged at every seed), per knob:\n\n"
        + holds(long).to_markdown(index=False)
        + "\n"
        + "".join(f"\nRefused: {k}: {v}\n" for k, v in sorted(refused.items()))
    )
    (output / "sensitivity.md").write_text(text, encoding="utf-8")
    save_figure(figure(long), output / "sensitivity.png")
    save_figure(cost_figure(long), output / "sensitivity_cost.png")
    print(text)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
