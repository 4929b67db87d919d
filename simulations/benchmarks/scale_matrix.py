"""Server memory flat in the number of clients: the scale benchmark over K and the
fraction of clients a round trains.

Runs :mod:`simulations.benchmarks.scale` once per setting ``K:fraction:rounds`` on MNIST
(``simulations/scale_mnist_1000.toml``: 1 local epoch, norms-only retention at every round, then
FedEraser forgets client 0), each in its own output folder, then writes ``scale_matrix.csv``/``.md``
(one row per setting: the ServerApp's RSS between rounds, its peak within a round and their ratio,
FedEraser's peak per step, the process tree's sampled peak, wall time per round and per client
update) and ``scale_matrix.png`` (each setting's between-round RSS and in-round peak, round by
round). The claim it measures: the peak within a round does not grow with K.

Usage (the settings of RESULTS.md; about 90 minutes on 2 cores)::

    python -m simulations.benchmarks.scale_matrix --data-root PATH \\
        --output-dir simulations/benchmarks/results/scale-matrix \\
        --settings 1000:1.0:3 1000:0.1:5 10000:0.1:20 10000:1.0:2

Run it alone, or in a network namespace of its own beside anything else that starts a SuperLink.
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

from simulations.benchmarks import scale  # noqa: E402
from simulations.run_parser import PROJECT_ROOT  # noqa: E402

CONFIG = PROJECT_ROOT / "simulations" / "scale_mnist_1000.toml"


def setting(text: str) -> tuple[int, float, int]:
    """``K:fraction:rounds`` -> (K, fraction, rounds), each checked."""
    try:
        clients, fraction, rounds = text.split(":")
        parsed = int(clients), float(fraction), int(rounds)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--settings: {text!r} is not K:fraction:rounds (e.g. 10000:0.1:20)"
        ) from None
    if parsed[0] < 2 or not 0 < parsed[1] <= 1 or parsed[2] < 1:
        raise argparse.ArgumentTypeError(
            f"--settings: {text!r} needs K >= 2, a fraction in (0, 1] and rounds >= 1"
        )
    return parsed


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", required=True, help="dataset root holding MNIST")
    parser.add_argument("--output-dir", type=Path, required=True, help="where the tables go")
    parser.add_argument(
        "--settings", nargs="+", type=setting, required=True, help="K:fraction:rounds ..."
    )
    parser.add_argument(
        "--summarize-only", action="store_true", help="rebuild the tables from earlier runs"
    )
    parser.add_argument(
        "--reference-peak-mb",
        type=float,
        help="a peak to draw for comparison (e.g. the in-round peak before streaming aggregation)",
    )
    parser.add_argument(
        "--reference-label", default="reference peak", help="what --reference-peak-mb is"
    )
    return parser.parse_args(argv)


def folder(output: Path, clients: int, fraction: float, rounds: int) -> Path:
    return output / f"k{clients}-f{fraction:g}-r{rounds}"


def run_setting(args, clients: int, fraction: float, rounds: int) -> int:
    """One scale run; its outputs in :func:`folder`."""
    return scale.main(
        [
            str(CONFIG),
            "--clients", str(clients),
            "--rounds", str(rounds),
            "--warmup-rounds", "0",
            "--data-root", args.data_root,
            "--output-dir", str(folder(args.output_dir, clients, fraction, rounds)),
            "--set", f"fraction-train={fraction}",
            "--set", "min-train-clients=2",
            "--set", "node-wait-seconds=1800",
        ]
    )  # fmt: skip


def row(output: Path, clients: int, fraction: float, rounds: int) -> dict | None:
    """The setting's line of the table (None when it has not run)."""
    path = folder(output, clients, fraction, rounds) / "scale_summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    run = Path(summary.get("run_directory", ""))
    if run.is_dir():  # the calibration count of a sampled run, read again from its history
        summary.update(scale.unlearning_costs(run, clients, 1))
    between = summary["server_rss_mb_between_rounds_max"]
    peak = summary["server_round_peak_rss_mb_max"]
    return {
        "clients": clients,
        "fraction_train": fraction,
        "rounds": rounds,
        "updates_per_round": max(int(clients * fraction), 2),
        "rss_between_rounds_max_mb": between,
        "round_peak_rss_max_mb": peak,
        "peak_over_between": round(peak / between, 3),
        "federaser_step_peak_max_mb": summary.get("federaser_peak_rss_mb", float("nan")),
        "federaser_peak_over_between": round(
            summary.get("federaser_peak_rss_mb", float("nan")) / between, 3
        ),
        "process_tree_peak_mb": round(summary["process_tree_peak_rss_mb_sampled"], 1),
        "mean_round_wall_s": round(summary["mean_round_wall_seconds_after_round_1"], 2),
        "s_per_client_update": round(summary["mean_seconds_per_update_after_round_1"], 4),
        "federaser_s": summary.get("federaser_seconds", float("nan")),
        "s_per_calibration_update": summary.get("seconds_per_calibration_update", float("nan")),
        "run_seconds": summary["seconds"],
    }


def plot(output: Path, settings, reference: float | None = None, label: str = "") -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if reference is not None:
        ax.axhline(reference, color="grey", ls="--", label=f"{label}: {reference:,.0f} MiB")
    for clients, fraction, rounds in settings:
        table = folder(output, clients, fraction, rounds) / "scale.csv"
        if not table.is_file():
            continue
        rounds_table = pd.read_csv(table)
        label = f"K = {clients:,}, fraction {fraction:g}"
        line = ax.plot(rounds_table["round"], rounds_table["server_round_peak_rss_mb"], "^-")
        ax.plot(
            rounds_table["round"],
            rounds_table["server_rss_mb"],
            "o:",
            color=line[0].get_color(),
            label=f"{label}: peak within the round (▲), after it (●)",
        )
    ax.set_xlabel("training round")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("ServerApp RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title("ServerApp memory within and between rounds (MNIST, norms retention)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output / "scale_matrix.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for clients, fraction, rounds in args.settings:
        if args.summarize_only or row(args.output_dir, clients, fraction, rounds) is not None:
            continue
        print(f"=== K = {clients}, fraction-train = {fraction}, {rounds} rounds", flush=True)
        code = run_setting(args, clients, fraction, rounds)
        if code != 0:
            print(f"the setting {clients}:{fraction}:{rounds} failed ({code})", file=sys.stderr)
    rows = [r for s in args.settings if (r := row(args.output_dir, *s)) is not None]
    if not rows:
        print("no setting has run yet", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows)
    table.to_csv(args.output_dir / "scale_matrix.csv", index=False)
    (args.output_dir / "scale_matrix.md").write_text(table.to_markdown(index=False) + "\n")
    plot(args.output_dir, args.settings, args.reference_peak_mb, args.reference_label)
    print(table.to_markdown(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
