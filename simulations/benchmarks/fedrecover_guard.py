"""FedRecover on label skew with and without the divergence guard (ours), for two readings of the
abnormality threshold τ: the paper's (τ_t lets at most α = 10⁻³ of round t's update coordinates
above it, τ = max_t τ_t) and α = 0 (τ = the largest coordinate of any retained update, the reading
under which FedRecover once diverged unseen on label skew). One ``fedunlearn-run
simulations/fedrecover_skew_mnist.toml`` per variant and seed (forgetting client S at seed S);
skipped when already done.

Writes ``fedrecover_guard.csv``/``.md`` in ``--output-dir``: per variant and seed, FedRecover's and
FedRetrain's test accuracy, the gap, the flag, FedRecover's rounds estimated / exact / redone by the
guard, and its client-epochs as a share of FedRetrain's; then mean ± sd per variant.

Usage::

    python -m simulations.benchmarks.fedrecover_guard [--seeds 0 1 2] \\
        [--output-dir results/fedrecover-guard] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from simulations.benchmarks.repeat import (
    add_run_options,
    comparison_summary,
    run_options,
    run_point,
    with_gaps,
)

CONFIG = Path(__file__).resolve().parents[1] / "fedrecover_skew_mnist.toml"
VARIANTS = {
    "paper-tau-guard": ["fedrecover-tolerance=0.001", "fedrecover-guard=true"],
    "paper-tau-no-guard": ["fedrecover-tolerance=0.001", "fedrecover-guard=false"],
    "largest-coordinate-guard": ["fedrecover-tolerance=0.0", "fedrecover-guard=true"],
    "largest-coordinate-no-guard": ["fedrecover-tolerance=0.0", "fedrecover-guard=false"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--variants", nargs="*", choices=list(VARIANTS), default=list(VARIANTS))
    add_run_options(parser, "results/fedrecover-guard")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    tables = []
    for variant in args.variants:
        for seed in args.seeds:
            sets = [*VARIANTS[variant], f"seed={seed}", f"unlearn-clients='{seed}'"]
            name = f"{variant}-s{seed}"
            if not args.summarize_only:
                run_point(
                    CONFIG,
                    output,
                    name,
                    [*sets, *args.set],
                    **run_options(args),
                )
            directory = output / name
            if not (directory / "unlearning.csv").is_file():
                continue
            table = pd.read_csv(directory / "unlearning.csv")
            tables.append(table.assign(variant=variant, seed=seed))
    long = with_gaps(pd.concat(tables, ignore_index=True), ["variant", "seed"])
    rows = long[long["method"] == "fedrecover"]
    columns = [
        "variant",
        "seed",
        "test_accuracy",
        "gap_points",
        "client_epochs_share",
        "did",
        "flag",
    ]
    rows[columns].to_csv(output / "fedrecover_guard.csv", index=False)
    markdown = rows[columns].to_markdown(index=False, floatfmt=".4f") + "\n\n"
    markdown += comparison_summary(rows, ["variant"]).to_markdown(index=False) + "\n"
    (output / "fedrecover_guard.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
