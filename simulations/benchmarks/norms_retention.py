"""What ``retain-mode = norms`` saves, and what it does not change: FedEraser's model.

Runs the same configuration twice through ``fedunlearn-run`` (``flwr run`` on the local simulation),
one after the other, with retention at every round (Δt = 1) and FedEraser forgetting client 0:

1. ``retain-mode = full``: every retained round keeps M^t and every client's update U_k^t;
2. ``retain-mode = norms``: round t_1 whole, later rounds only ‖U_k^t‖² per tensor and N_k.

It writes ``norms_retention.csv``/``.md`` (one row per retained round: the bytes training added to
the store in each mode, from ``metrics.csv``'s exact ``store_bytes``, and their ratio),
``norms_retention.png`` and ``norms_retention_summary.json``: the mean bytes per retained round after
t_1 in each mode and their ratio, each store's size on disk after the request (every file, the
SQLite index included; the adopted FedEraser history), and whether FedEraser's two models are equal
bit for bit.

Usage (MNIST, K = 20; about 10 minutes on 2 cores)::

    python -m simulations.benchmarks.norms_retention simulations/mnist.toml \\
        --data-root ~/data --output-dir results/norms
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
import safetensors.torch  # noqa: E402
import torch  # noqa: E402

from simulations import run as runner  # noqa: E402
from simulations.benchmarks._args import common_args  # noqa: E402

MODES = ("full", "norms")


def _launch(config: Path, mode: str, args: argparse.Namespace, output: Path) -> Path:
    sets = [
        f"retain-mode='{mode}'",
        "retain=true",
        "retain-interval=1",
        f"rounds={args.rounds}",
        "unlearn-clients='0'",
        "unlearn-methods='federaser'",
        "mia=false",
        *args.set,
    ]
    argv = [str(config), "--output-dir", str(output), "--set", f"run-name='{mode}'"]
    argv += [x for s in sets for x in ("--set", s)]
    if args.data_root:
        argv += ["--data-root", args.data_root]
    print(f"=== {mode}: fedunlearn-run {' '.join(argv)}", flush=True)
    code = runner.main(argv)
    if code != 0:
        raise SystemExit(f"run {mode} failed with exit code {code}")
    return output / mode


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _federaser_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(run_dir / "model_federaser.safetensors")


def _training_bytes(run_dir: Path) -> dict[int, int]:
    """Bytes each training round added to the store, from ``metrics.csv``'s exact sizes: the
    store as training left it (every client), before a request deleted the target's part."""
    metrics = pd.read_csv(run_dir / "metrics.csv")
    sizes = metrics.set_index("round")["store_bytes"].astype("int64")
    return {int(r): int(sizes[r] - sizes[r - 1]) for r in sizes.index if r >= 1}


def summarize(output: Path) -> tuple[pd.DataFrame, dict]:
    sizes = {mode: _training_bytes(output / mode) for mode in MODES}
    table = pd.DataFrame({"round": sorted(sizes["full"])})
    for mode in MODES:
        table[f"{mode}_bytes"] = [sizes[mode].get(r, 0) for r in table["round"]]
    table["full_over_norms"] = table["full_bytes"] / table["norms_bytes"]
    later = table[table["round"] > table["round"].min()]
    full, norms = (_federaser_model(output / mode) for mode in MODES)
    config = json.loads((output / "norms" / "config.json").read_text(encoding="utf-8"))
    summary = {
        "clients": int(config["num-clients"]),
        "retained_rounds": len(table),
        "t1_bytes": {mode: int(table[f"{mode}_bytes"].iloc[0]) for mode in MODES},
        "mean_bytes_per_round_after_t1": {
            mode: float(later[f"{mode}_bytes"].mean()) for mode in MODES
        },
        "ratio_after_t1": float(later["full_bytes"].mean() / later["norms_bytes"].mean()),
        "store_on_disk_bytes_after_the_request": {
            mode: _disk_bytes(output / mode / "store") for mode in MODES
        },
        "federaser_bit_identical": full.keys() == norms.keys()
        and all(torch.equal(full[k], norms[k]) for k in full),
        "federaser_max_abs_difference": max(
            float((full[k].double() - norms[k].double()).abs().max()) for k in full
        ),
    }
    return table, summary


def _plot(table: pd.DataFrame, summary: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for mode in MODES:
        ax.semilogy(table["round"], table[f"{mode}_bytes"], marker="o", label=f"retain-mode {mode}")
    ax.set(
        xlabel="retained round",
        ylabel="bytes kept (log scale)",
        title=f"{summary['clients']} clients: full / norms after t_1 = "
        f"{summary['ratio_after_t1']:,.0f}x",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    common_args(
        parser, "results/norms", extra_set="for both runs", summarize_only="only rebuild the table"
    )
    parser.add_argument("--rounds", type=int, default=4, help="training rounds (all retained)")
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    if not args.summarize_only:
        if output.exists() and any(output.iterdir()):
            raise SystemExit(f"{output} is not empty: choose another --output-dir")
        for mode in MODES:
            _launch(args.config, mode, args, output)
    table, summary = summarize(output)
    table.to_csv(output / "norms_retention.csv", index=False)
    markdown = table.to_markdown(index=False, floatfmt=",.0f")
    (output / "norms_retention.md").write_text(markdown + "\n", encoding="utf-8")
    (output / "norms_retention_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(table, summary, output / "norms_retention.png")
    print(markdown)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
