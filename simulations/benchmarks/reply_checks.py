"""What the reply checks cost: the share of each training round spent screening client replies.

Every training reply is checked before it is aggregated or retained (keys, shapes, dtypes, finite
values, num-examples, partition id; ``server/federation/reply_screening.py``). The ServerApp records the time
each round's checks took (``check_seconds``) next to the round's wall time (``round_seconds``) in
``metrics.csv``. This script runs ``fedunlearn-run`` on the main job (digits, 10 clients, 20
rounds) and on MNIST (20 clients of 3,000 samples, the paper's CNN), then writes
``reply_checks.csv``/``.md`` (per run: rounds, mean round time, mean check time, their ratio) and
``reply_checks.png`` (check time against round time, per round).

Usage (about 6 minutes on 2 cores; MNIST needs a data root holding ``MNIST/raw``, by default
``$FEDUNLEARN_DATA_ROOT``, else ``~/data``)::

    python -m simulations.benchmarks.reply_checks --output-dir results/reply-checks
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from simulations import run as runner  # noqa: E402
from simulations.benchmarks._args import common_args  # noqa: E402

RUNS = {
    "digits (main job)": ["--set", "unlearn-clients=''"],
    "mnist": [
        "--set", "dataset='mnist'", "--set", "num-clients=20", "--set", "rounds=5",
        "--set", "local-epochs=1", "--set", "batch-size=64", "--set", "unlearn-clients=''",
    ],
}  # fmt: skip


def measure(name: str, arguments: list[str], output_dir: Path, data_root: str | None) -> Path:
    run_name = name.split()[0]
    argv = [*arguments, "--output-dir", str(output_dir), "--set", f"run-name='{run_name}'"]
    if run_name != "digits":
        if not data_root:
            raise SystemExit(
                "reply_checks: MNIST needs --data-root, FEDUNLEARN_DATA_ROOT or ~/data"
            )
        argv += ["--data-root", data_root]
    code = runner.main(argv)
    if code != 0:
        raise SystemExit(f"reply_checks: the {name} run failed (exit {code})")
    return output_dir / run_name


def summarize(runs: dict[str, Path]) -> pd.DataFrame:
    rows = []
    for name, path in runs.items():
        metrics = pd.read_csv(path / "metrics.csv")
        rounds = metrics[metrics["round"] > 0]
        rows.append(
            {
                "run": name,
                "rounds": len(rounds),
                "clients": int(rounds["clients_replied"].max()),
                "round_seconds": rounds["round_seconds"].mean(),
                "check_seconds": rounds["check_seconds"].mean(),
                "check_share_percent": 100
                * rounds["check_seconds"].sum()
                / rounds["round_seconds"].sum(),
                "max_round_share_percent": 100
                * (rounds["check_seconds"] / rounds["round_seconds"]).max(),
            }
        )
    return pd.DataFrame(rows)


def plot(runs: dict[str, Path], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, run in runs.items():
        metrics = pd.read_csv(run / "metrics.csv")
        rounds = metrics[metrics["round"] > 0]
        ax.scatter(rounds["round_seconds"], rounds["check_seconds"] * 1000, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("round wall time (s)")
    ax.set_ylabel("reply checks (ms)")
    ax.set_title("Time the reply checks take, per training round")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_args(parser, None, data_root_help=None)
    parser.add_argument("--only", choices=[name.split()[0] for name in RUNS])
    args = parser.parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    runs = {
        name: measure(name, arguments, args.output_dir.resolve(), args.data_root)
        for name, arguments in RUNS.items()
        if args.only in (None, name.split()[0])
    }
    table = summarize(runs)
    table.to_csv(args.output_dir / "reply_checks.csv", index=False)
    (args.output_dir / "reply_checks.md").write_text(
        table.to_markdown(index=False, floatfmt=".4g") + "\n"
    )
    plot(runs, args.output_dir / "reply_checks.png")
    print(table.to_markdown(index=False, floatfmt=".4g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
