"""Where SIFU rolls back to an intermediate round, and with which epsilon and sigma.

Each setting is trained once per seed with ``fedunlearn-run`` (client 0 forgotten,
``unlearn-methods = sifu,fedretrain``, ``keep-original = true``). SIFU's rollback round depends
only on the training (the bounds Psi(n, {0}) its accumulator kept) and on the budget Psi*, so the
script then reads the kept accumulator (``original-1/store``) and computes the rollback round for
every (epsilon, sigma) of a grid under both ``sifu-expansion`` choices: ``smoothness`` (the bound
under ``sifu-smoothness`` L, the default) and ``non-expansive`` (the authors' code's assumption).
The run itself certifies one pair (``--set`` overrides it) and its rollback is checked against
the recomputation. The truth comes from the same run: FedRetrain is FedAvg without client 0 from
the same initial model with the same batch orders, so its kept history gives
||theta^n - theta^n_{-0}|| at every round. The summary gives each expansion's largest true
distance / Psi (> 1: the bound failed), a ✗ where a rollback's true distance exceeds Psi*, and the
oracle (the latest round whose true distance is within Psi*).

Settings: 10 clients, 10 rounds, on digits (all 1,347 training samples) and MNIST (a seeded
5,000-sample subset), IID, Dirichlet 0.1 and 0.5, and two label shards per client; two training
regimes: ``plain`` (SGD, lr 0.05, no momentum, 1 local epoch of batches of 32) and ``momentum``
(the skew configs': lr 0.05, momentum 0.9, 2 local epochs). delta and the mechanism are the run's
(default 1e-4, analytic).

Usage::

    python -m simulations.benchmarks.sifu_rollback --data-root DIR --output-dir results/sifu-rollback \\
        [--only digits-iid-plain ...] [--seeds 0 1 2] [--prefix CMD] [--summarize-only]

``--prefix`` runs each ``fedunlearn-run`` under a command (e.g. a network-namespace wrapper).
The runs go to ``--output-dir``; ``sifu_rollback.csv`` (one row per run, expansion and (epsilon,
sigma)) and ``sifu_rollback.md`` to ``--table-dir`` (default ``simulations/benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from safetensors.torch import load_file

from fedunlearn.store.history import load_policy
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.unlearning.gaussian_mechanism import noise_sigma, unlearning_budget
from fedunlearn.unlearning.sensitivity import EXPANSIONS, SensitivityAccumulator
from fedunlearn.unlearning.sifu import SensitivityRetention, rollback_round
from simulations.benchmarks._args import common_args

SIMULATIONS = Path(__file__).resolve().parents[1]
PARTITIONS = {
    "iid": ["partitioning='iid'"],
    "dirichlet-0.1": ["partitioning='dirichlet'", "alpha=0.1"],
    "dirichlet-0.5": ["partitioning='dirichlet'", "alpha=0.5"],
    "shards": ["partitioning='shards'", "shards-per-client=2"],
}
DATASETS = {"digits": ["dataset='digits'"], "mnist": ["dataset='mnist'", "train-samples=5000"]}
REGIMES = {
    "plain": ["lr=0.05", "momentum=0.0", "local-epochs=1"],
    "momentum": ["lr=0.05", "momentum=0.9", "local-epochs=2"],
}
COMMON = [
    "num-clients=10", "rounds=10", "batch-size=32", "unlearn-clients='0'",
    "unlearn-methods='sifu,fedretrain'", "keep-original=true", "sifu-epsilon=1.0",
    "sifu-sigma=0.05",
]  # fmt: skip
SETTINGS = {
    f"{data}-{partition}-{regime}": DATASETS[data] + PARTITIONS[partition] + REGIMES[regime]
    for data in DATASETS
    for partition in PARTITIONS
    for regime in REGIMES
}
GRID = [(e, s) for e in (1.0, 10.0) for s in (0.01, 0.05, 0.1, 0.5)]


def train(name: str, seed: int, args) -> int:
    run = f"{name}-s{seed}"
    sets = COMMON + SETTINGS[name] + [f"seed={seed}", f"run-name='{run}'"] + args.set
    command = shlex.split(args.prefix) + [str(Path(sys.executable).parent / "fedunlearn-run")]
    command += [str(SIMULATIONS / "digits.toml"), "--output-dir", str(args.output_dir)]
    command += ["--data-root", args.data_root] if args.data_root else []
    command += [x for s in sets for x in ("--set", s)]
    print(f"=== {run}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    with open(args.output_dir / f"{run}.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    print(f"=== {run}: exit {code}, {time.perf_counter() - started:.0f}s", flush=True)
    return code


def kept_accumulator(run: Path) -> SensitivityAccumulator:
    """The SIFU accumulator the training kept (its state after the last round)."""
    with UpdateStore(run / "original-1" / "store", readonly=True) as store:
        return load_policy(store, SensitivityRetention, method="sifu").accumulator


def _distance(a, b) -> float:
    return sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a) ** 0.5


def true_distances(run: Path) -> list[float] | None:
    """||theta^n - theta^n_{-0}|| for n = 1 .. R + 1: FedRetrain is FedAvg without client 0 from
    the same initial model with the same batch orders, i.e. the reference the bound is about, and
    its history (the adopted one) keeps every round's global model, as the original's does."""
    original, retrained = UpdateStore(run / "original-1" / "store"), UpdateStore(run / "store")
    try:
        rounds = original.rounds()
        if rounds != retrained.rounds() or rounds != list(range(1, len(rounds) + 1)):
            return None
        distances = [_distance(original.read_global(n), retrained.read_global(n)) for n in rounds]
    finally:
        original.close()
        retrained.close()
    final = load_file(run / "original-1" / "model_final.safetensors")
    return distances + [_distance(final, load_file(run / "model_fedretrain.safetensors"))]


def analyse(name: str, seed: int, run: Path) -> list[dict]:
    config = json.loads((run / "config.json").read_text())
    certificate = json.loads((run / "certified_removal.jsonl").read_text().splitlines()[0])
    table = pd.read_csv(run / "unlearning.csv").set_index("method")
    kept = kept_accumulator(run)
    # Psi(2, {0}) = client 0's contribution in round 1 (the same under both expansions): no
    # budget below it lets SIFU keep anything of the training.
    first = kept.bound([0], 2)
    delta, mechanism = config["sifu-delta"], config["sifu-mechanism"]
    truth = true_distances(run)
    rows = []
    for expansion in EXPANSIONS:
        saved = kept.to_json()
        saved["parameters"]["expansion"] = expansion
        accumulator = SensitivityAccumulator.from_json(saved)
        latest = accumulator.last_round + 1
        bounds = [accumulator.bound([0], n) for n in range(1, latest + 1)]
        worst = max((t / b for t, b in zip(truth, bounds) if b > 0), default=0.0) if truth else None
        for epsilon, sigma in GRID:
            budget = unlearning_budget(
                epsilon, config["sifu-delta"], sigma, mechanism=config["sifu-mechanism"]
            )
            rollback = rollback_round(accumulator, [0], budget)
            rows.append({
                "setting": name, "seed": seed, "expansion": expansion, "epsilon": epsilon,
                "delta": config["sifu-delta"], "sigma": sigma, "budget": budget,
                "rollback_round": rollback, "final_round": latest,
                "intermediate": 1 < rollback < latest, "first_contribution": first,
                "sigma_past_round_1": noise_sigma(epsilon, delta, first, mechanism=mechanism),
                "max_truth_over_bound": worst,
                "true_distance_at_rollback": truth[rollback - 1] if truth else None,
                "oracle_round": max(n for n, d in enumerate(truth, 1) if d <= budget)
                if truth else None,
            })  # fmt: skip
    run_row = next(
        r for r in rows
        if r["expansion"] == config["sifu-expansion"] and r["epsilon"] == config["sifu-epsilon"]
        and r["sigma"] == config["sifu-sigma"]
    )  # fmt: skip
    if run_row["rollback_round"] != certificate["rollback_round"]:
        raise SystemExit(f"{run}: the run rolled back to {certificate['rollback_round']}, the "
                         f"recomputation says {run_row['rollback_round']}")  # fmt: skip
    for row in rows:
        row["fedavg_accuracy"] = table.loc["fedavg", "test_accuracy"]
        row["fedretrain_accuracy"] = table.loc["fedretrain", "test_accuracy"]
    run_row["sifu_accuracy_of_the_run"] = table.loc["sifu", "test_accuracy"]
    return rows


def _rounds(cell: pd.DataFrame, column: str) -> str:
    """The seeds' rounds, ✗ where the true distance at the round exceeds the budget."""
    marks = []
    for _, row in cell.sort_values("seed").iterrows():
        wrong = row[column] != row["oracle_round"] and not (
            pd.isna(row["true_distance_at_rollback"])
            or row["true_distance_at_rollback"] <= row["budget"]
        )
        marks.append(f"{int(row[column])}{'✗' if wrong and column == 'rollback_round' else ''}")
    return "/".join(marks)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting and expansion, the rollback round over the seeds for each (epsilon, sigma); the
    noise from which SIFU keeps more than the initial model (sigma with Psi* = Psi(2, {0})); the
    largest true distance / Psi over the rounds (> 1: the bound failed); and the oracle's rounds
    (the latest round whose true distance is within the budget)."""
    lines = []
    for (setting, expansion), group in table.groupby(["setting", "expansion"], sort=False):
        past = group[group["epsilon"] == 1.0]["sigma_past_round_1"]
        run = group["sifu_accuracy_of_the_run"].dropna()
        worst = group.groupby("seed")["max_truth_over_bound"].first()
        line = {"setting": setting, "expansion": expansion,
                "fedavg acc": f"{group['fedavg_accuracy'].mean():.3f}",
                "the run's sifu / fedretrain acc": f"{run.mean():.3f} / "
                f"{group['fedretrain_accuracy'].mean():.3f}" if len(run) else "",
                "σ past round 1 (ε=1)": f"{past.min():.2g}–{past.max():.2g}",
                "max truth/Ψ": f"{worst.max():.3g}" if worst.notna().all() else "–"}  # fmt: skip
        for (epsilon, sigma), cell in group.groupby(["epsilon", "sigma"]):
            line[f"ε={epsilon:g} σ={sigma:g}"] = _rounds(cell, "rollback_round")
        lines.append(line)
        if expansion == EXPANSIONS[-1] and group["oracle_round"].notna().all():
            oracle = {key: "" for key in line} | {"setting": setting, "expansion": "oracle"}
            for (epsilon, sigma), cell in group.groupby(["epsilon", "sigma"]):
                oracle[f"ε={epsilon:g} σ={sigma:g}"] = _rounds(cell, "oracle_round")
            lines.append(oracle)
    return pd.DataFrame(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_args(
        parser,
        "results/sifu-rollback",
        output_help="where the runs go",
        data_root_help=None,
        extra_set="for every run",
        summarize_only="",
    )
    parser.add_argument(
        "--table-dir",
        type=Path,
        default=SIMULATIONS / "benchmarks" / "results",
        help="where sifu_rollback.csv and .md go",
    )
    parser.add_argument("--only", nargs="*", choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prefix", default="", help="command to run fedunlearn-run under")
    args = parser.parse_args(argv)
    args.output_dir = args.output_dir.resolve()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    names = args.only or list(SETTINGS)
    rows = []
    for name in names:
        for seed in args.seeds:
            run = args.output_dir / f"{name}-s{seed}"
            if not args.summarize_only and not (run / "unlearning.csv").exists():
                if train(name, seed, args) != 0:
                    return 1
            if (run / "unlearning.csv").exists():
                rows += analyse(name, seed, run)
    if not rows:
        print("no results yet", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows)
    args.table_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.table_dir / "sifu_rollback.csv", index=False)
    markdown = summary(table).to_markdown(index=False, disable_numparse=True)
    (args.table_dir / "sifu_rollback.md").write_text(markdown + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
