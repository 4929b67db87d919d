"""Recovery from poisoning under robust aggregation: ``simulations/recovery_mnist.toml`` (MNIST,
K = 10, clients 3 and 7 plant a backdoor, then are removed) trained with FedTrimmedAvg and with
FedMedian (``strategy``), every unlearning method that supports the aggregation run, the others
refused by name before training (``MethodSpec.aggregations``).

Writes, in ``--output-dir``: ``robust_recovery.csv`` (every row of every run: strategy, method,
test accuracy, gap to FedRetrain, backdoor success, client-epochs, flag) and ``robust_recovery.md``
(the same, then each refused method with the config's refusal).

Usage::

    python -m simulations.benchmarks.robust_recovery [--strategies fedtrimmedavg fedmedian]
        [--methods pga fedquit ...] [--output-dir results/robust_recovery] [--data-root DIR]
        [--set key=value ...]

About 6 minutes a strategy on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING
from simulations.benchmarks.repeat import add_run_options, run_options, run_point, with_gaps

CONFIG = Path(__file__).resolve().parents[1] / "recovery_mnist.toml"
COLUMNS = [
    "strategy",
    "method",
    "test_accuracy",
    "gap_points",
    "attack_success",
    "client_epochs",
    "flag",
]


def supported(strategy: str) -> tuple[list[str], dict[str, str]]:
    """The methods that run under ``strategy``, and each other one's refusal by the config."""
    runs, refused = [], {}
    for spec in UNLEARNING:
        if spec.aggregation_problem(strategy) is None:
            runs.append(spec.name)
            continue
        try:
            ExperimentConfig.from_run_config(
                {"strategy": strategy, "unlearn-methods": f"{spec.name},fedretrain"}
            )
            raise SystemExit(f"{spec.name} was not refused under {strategy}")
        except ConfigError as error:
            refused[spec.name] = str(error)
    return runs, refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", default=["fedtrimmedavg", "fedmedian"])
    parser.add_argument(
        "--methods", nargs="+", help="only these of the supported methods (fedretrain always)"
    )
    add_run_options(parser, "results/robust_recovery")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    rows, refusals = [], []
    for strategy in args.strategies:
        methods, refused = supported(strategy)
        if args.methods:
            methods = [m for m in methods if m in {*args.methods, "fedretrain"}]
        sets = [
            f"strategy='{strategy}'",
            f"unlearn-methods='{','.join(methods)}'",
            "allow-target-participation=true",
            *args.set,
        ]
        if not args.summarize_only:
            run_point(
                CONFIG,
                output,
                strategy,
                sets,
                **run_options(args),
            )
        table = pd.read_csv(output / strategy / "unlearning.csv")
        rows.append(table.assign(strategy=strategy))
        refusals += [(strategy, method, why) for method, why in refused.items()]
    long = with_gaps(pd.concat(rows, ignore_index=True), ["strategy"])
    long = long[[c for c in COLUMNS if c in long.columns]]
    long.to_csv(output / "robust_recovery.csv", index=False)
    refused_table = pd.DataFrame(refusals, columns=["strategy", "method", "refusal"])
    text = (
        "## Recovery from poisoning under robust aggregation\n\n"
        + long.to_markdown(index=False, floatfmt=".4f")
        + "\n\n## Refused before training\n\n"
        + refused_table.to_markdown(index=False)
        + "\n"
    )
    (output / "robust_recovery.md").write_text(text)
    print(text)
    print(f"results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
