"""PGA's headline (Halimi et al. 2022: the leaving client's projected gradient ascent removes the
backdoor it planted, at a small fraction of retraining's client-epochs) against its stop rule, over
partitions and seeds: ``simulations/pga_backdoor_mnist.toml`` (one backdoored client of 10, erased
by PGA beside FedRetrain) run for every ``--variants`` of its stop rule (``+`` joins several
``--set`` values of one variant), every ``--partitionings`` and seed:

* ``pga-stop=validation+pga-stop-margin=M``: the paper's stop, at the first step whose accuracy on
  the server's validation samples is below w_ref's minus M points (its default M is the margin this
  benchmark measured: RESULTS.md);
* ``pga-stop=distance``: the authors' code, the squared distance to the client's own model at which
  the ascent stops, 2.2 for their FLNet, where the reference starts 0.45 from that model in the run
  their notebook stores;
* ``pga-stop=ratio``: ours, each target stops at 4.9 times its own start, the ratio of that run.

Each point is one ``fedunlearn-run`` (skipped when its directory already holds a result). Writes
into ``--output-dir``:

* ``pga_stop.csv`` / ``.md``: per point the backdoor's success before post-training (the ascent's
  own effect) and after it, FedRetrain's, the test accuracy gap to FedRetrain, PGA's client-epochs
  as a share of FedRetrain's, how far the ascent moved and where it started (squared distance to the
  client's model), with the paper's stop its tau and the validation accuracy it ended at, and the
  row's flag;
* ``pga_stop.png``: per partition, the backdoor's success (the original model, PGA before and
  after post-training, FedRetrain) and PGA's accuracy gap to FedRetrain by stop rule, each seed a
  dot.

Usage::

    python -m simulations.benchmarks.pga_stop [--variants pga-stop=validation+pga-stop-margin=10
        pga-stop=distance pga-stop=ratio] [--partitionings iid shards]
        [--seeds 3] [--output-dir results/pga_stop] [--data-root DIR] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.plots import legend_outside, save_figure  # noqa: E402
from simulations.benchmarks.repeat import add_run_options, run_options, run_point  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "pga_backdoor_mnist.toml"


def point(run: Path, variant: str, partitioning: str, seed: int) -> dict:
    """One run's row: PGA against FedRetrain, and what its ascent did."""
    table = pd.read_csv(run / "unlearning.csv").set_index("method")
    request = json.loads((run / "unlearning_log.jsonl").read_text().splitlines()[-1])
    pga, retrained = table.loc["pga"], table.loc["fedretrain"]
    details = request["details"]["pga"]
    ascent = next(iter(details.get("ascent", {}).values()), {})
    return {
        "variant": variant,
        "partitioning": partitioning,
        "seed": seed,
        "backdoor_original": table.loc["fedavg", "attack_success"],
        "backdoor_before_post": details.get("attack_success_after_unlearning", float("nan")),
        "backdoor_after_post": pga["attack_success"],
        "backdoor_fedretrain": retrained["attack_success"],
        "gap_points": 100 * (pga["test_accuracy"] - retrained["test_accuracy"]),
        "client_epochs_share": pga["client_epochs"] / retrained["client_epochs"],
        "moved": ascent.get("moved", float("nan")),
        "start_distance2": ascent.get("start_distance2", float("nan")),
        "stop_distance2": ascent.get("stop_distance2", float("nan")),
        "tau": ascent.get("tau", float("nan")),
        "validation_after_ascent": ascent.get("validation_accuracy", float("nan")),
        "flag": pga["flag"] if isinstance(pga["flag"], str) else "",
    }


def variant_label(variant: str) -> str:
    """A short label of a stop-rule variant for an axis: "paper, m=10", "code (2.2)", "ours
    (ratio)"; other ``--set`` values joined by ", "."""
    sets = dict(s.split("=", 1) for s in variant.split("+"))
    rule = sets.pop("pga-stop", "")
    label = {"validation": "paper", "distance": "code (2.2)", "ratio": "ours (ratio)"}.get(
        rule, rule
    )
    if "pga-stop-margin" in sets:
        label += f", m={sets.pop('pga-stop-margin')}"
    return ", ".join([label, *(f"{k}={v}" for k, v in sets.items())]).strip(", ")


def figure(rows: pd.DataFrame, path: Path) -> None:
    """Per partition: the backdoor's success (original, PGA before and after post-training,
    FedRetrain) and PGA's test accuracy gap to FedRetrain, by stop rule, each seed a dot
    (side by side within a rule)."""
    partitions = list(dict.fromkeys(rows["partitioning"]))
    variants = list(dict.fromkeys(rows["variant"]))
    fig, axes = plt.subplots(
        2, len(partitions), figsize=(4.8 * len(partitions) + 2, 7), squeeze=False, sharex=True
    )
    measures = (
        ("backdoor_original", "original (poisoned)", "x", "tab:grey"),
        ("backdoor_before_post", "PGA, before post-training", "v", "tab:orange"),
        ("backdoor_after_post", "PGA, after post-training", "o", "#e7298a"),
        ("backdoor_fedretrain", "FedRetrain", "s", "black"),
    )
    for column, partitioning in enumerate(partitions):
        part = rows[rows["partitioning"] == partitioning]
        top, bottom = axes[0][column], axes[1][column]
        x = [variants.index(v) + 0.08 * (s - 1) for v, s in zip(part["variant"], part["seed"])]
        for key, label, marker, colour in measures:
            top.scatter(x, 100 * part[key], label=label, marker=marker, color=colour, s=28)
        top.set_title(f"{partitioning}: backdoor success")
        top.set_ylabel("backdoor success (%)")
        top.set_ylim(-5, 105)
        bottom.scatter(x, part["gap_points"], marker="o", color="#e7298a", s=28)
        bottom.axhline(0, color="black", linewidth=0.8)
        bottom.set_yscale("symlog", linthresh=2)
        low = min(float(part["gap_points"].min()), -5.0)
        ticks = [
            v for v in (-100, -50, -20, -10, -5, -2, 0, 2, 5, 10) if v >= low * 1.05 or v == -5
        ]
        bottom.set_yticks(ticks, [f"{v:+d}" if v else "0" for v in ticks])
        bottom.set_ylim(low * 1.3, max(float(part["gap_points"].max()) * 1.3, 8.0))
        bottom.set_title(f"{partitioning}: PGA's test accuracy gap to FedRetrain")
        bottom.set_ylabel("points (symlog)")
        bottom.set_xticks(range(len(variants)), [variant_label(v) for v in variants],
                          rotation=20, ha="right")  # fmt: skip
        bottom.set_xlabel("stop rule (each seed a dot)")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    legend_outside(axes[0][-1])
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[
            *(f"pga-stop=validation+pga-stop-margin={m}" for m in (5, 10, 20)),
            "pga-stop=distance",
            "pga-stop=ratio",
        ],
    )
    parser.add_argument("--partitionings", nargs="+", default=["iid", "shards"])
    parser.add_argument("--seeds", type=int, default=3)
    add_run_options(parser, "results/pga_stop")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    rows = []
    for partitioning in args.partitionings:
        for variant in args.variants:
            for seed in range(args.seeds):
                name = f"{partitioning}-{variant.replace('=', '').replace('+', '-')}-seed{seed}"
                sets = [f"partitioning='{partitioning}'", *variant.split("+"), f"seed={seed}"]
                sets += args.set
                if not args.summarize_only:
                    run_point(
                        CONFIG,
                        output,
                        name,
                        sets,
                        **run_options(args),
                    )
                if (output / name / "unlearning.csv").is_file():
                    rows.append(point(output / name, variant, partitioning, seed))
    table = pd.DataFrame(rows)
    table.to_csv(output / "pga_stop.csv", index=False)
    text = "## PGA's backdoor removal by its stop rule\n\n" + table.to_markdown(
        index=False, floatfmt=".4f"
    )
    (output / "pga_stop.md").write_text(text + "\n")
    figure(table, output / "pga_stop.png")
    print(text)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
