"""Acceptance benchmark of the foundation: accuracy of a real federated run, and what retention costs.

Runs the same configuration three times through ``fedunlearn-run`` (``flwr run`` on the local
simulation), one after the other:

1. retention on, Δt = 1, float32 (every round, every client: the most expensive setting);
2. retention off;
3. retention on, Δt = 1, float16, two rounds only (for the store's bytes per round).

and writes ``retention_overhead.csv``/``.md`` (final test accuracy, training wall time = the sum of the
rounds' times, their ratio, bytes per retained round) and ``retention_overhead.png``.

Usage::

    python -m simulations.benchmarks.retention_overhead simulations/mnist.toml \\
        --data-root ~/data --output-dir results/retention
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedunlearn.store.update_store import UpdateStore  # noqa: E402
from simulations import run as runner  # noqa: E402
from simulations.benchmarks._args import common_args  # noqa: E402

# Training only (no unlearning phase): the benchmark measures what retention costs during training.
VARIANTS = {
    "retain-off": ["retain=false", "unlearn-clients=''"],
    "retain-on-float32": [
        "retain=true",
        "retain-interval=1",
        "store-dtype='float32'",
        "unlearn-clients=''",
    ],
    "retain-on-float16": [
        "retain=true",
        "retain-interval=1",
        "store-dtype='float16'",
        "rounds=2",
        "unlearn-clients=''",
    ],
}


def _launch(
    config: Path, name: str, sets: list[str], args: argparse.Namespace, output: Path
) -> Path:
    argv = [str(config), "--output-dir", str(output), "--set", f"run-name='{name}'"]
    argv += [x for s in args.set + sets for x in ("--set", s)]
    if args.data_root:
        argv += ["--data-root", args.data_root]
    print(f"=== {name}: fedunlearn-run {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    code = runner.main(argv)
    if code != 0:
        raise SystemExit(f"run {name} failed with exit code {code}")
    print(f"=== {name}: {time.perf_counter() - started:.1f}s wall", flush=True)
    return output / name


def summarize(run_dir: Path) -> dict:
    metrics = pd.read_csv(run_dir / "metrics.csv")
    rounds = metrics[metrics["round"] >= 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    row = {
        "run": run_dir.name,
        "rounds": int(rounds["round"].max()),
        "final_test_accuracy": float(rounds["test_accuracy"].iloc[-1]),
        "training_seconds": float(rounds["round_seconds"].sum()),
        "run_seconds": float(summary["seconds"]),
        "retained_rounds": len(summary["retained_rounds"]),
        "store_bytes": int(summary["store_bytes"]),
    }
    store_dir = run_dir / "store"
    if row["retained_rounds"]:
        per_round = UpdateStore(store_dir).bytes_per_round()
        row["bytes_per_retained_round"] = int(sum(per_round.values()) / len(per_round))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    common_args(
        parser,
        "results/retention",
        extra_set="for every run",
        summarize_only="only rebuild the table",
    )
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    if not args.summarize_only:
        if output.exists() and any(output.iterdir()):
            raise SystemExit(f"{output} is not empty: choose another --output-dir")
        for name, sets in VARIANTS.items():
            _launch(args.config, name, sets, args, output)

    rows = {name: summarize(output / name) for name in VARIANTS}
    table = pd.DataFrame(rows.values())
    on, off = rows["retain-on-float32"], rows["retain-off"]
    ratio = on["training_seconds"] / off["training_seconds"]
    table["time_ratio_vs_off"] = table["training_seconds"] / off["training_seconds"]
    table.loc[table["run"] == "retain-on-float16", "time_ratio_vs_off"] = float("nan")
    table.to_csv(output / "retention_overhead.csv", index=False)
    (output / "retention_overhead.md").write_text(
        table.to_markdown(index=False, floatfmt=".4f") + "\n"
    )

    fig, (ax_acc, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in ("retain-off", "retain-on-float32"):
        metrics = pd.read_csv(output / name / "metrics.csv")
        ax_acc.semilogy(metrics["round"], 1 - metrics["test_accuracy"], marker="o", label=name)
        rounds = metrics[metrics["round"] >= 1]
        ax_time.plot(rounds["round"], rounds["round_seconds"], marker="o", label=name)
    ax_acc.set(xlabel="round", ylabel="test error (log scale)", title="test error")
    ax_time.set(xlabel="round", ylabel="seconds", title=f"round time (on/off = {ratio:.3f})")
    for ax in (ax_acc, ax_time):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(output / "retention_overhead.png", dpi=120)

    print(table.to_markdown(index=False, floatfmt=".4f"))
    print(
        f"\nfinal test accuracy (retention on): {on['final_test_accuracy']:.4f}\n"
        f"training time on/off: {on['training_seconds']:.1f}s / {off['training_seconds']:.1f}s = {ratio:.3f}\n"
        f"bytes per retained round: float32 {on['bytes_per_retained_round']:,}, "
        f"float16 {rows['retain-on-float16']['bytes_per_retained_round']:,}\n"
        f"results in {output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
