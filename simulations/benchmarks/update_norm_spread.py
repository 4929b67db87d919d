"""How far apart honest updates of one round are, against the reply screen's norm bound
``max-update-ratio``.

Trains digits (K = 10, the main job's model, 8 rounds, training only) on Dirichlet(0.1) and label
shards (2 per client), seeds 0-2, then reads every retained round's updates and reports the largest
ratio of one update's norm to the median of the others' norms in the same round: the number the
reply screen compares with ``max-update-ratio`` (default 100). Also counts the replies the screen
refused (none expected from honest clients).

Usage::

    python -m simulations.benchmarks.update_norm_spread [--output-dir results/update-norms]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from fedunlearn.store.update_store import UpdateStore
from simulations import run as runner
from simulations.benchmarks._args import common_args

DIGITS = Path(__file__).resolve().parents[1] / "digits.toml"
SKEWS = {
    "dirichlet-0.1": ["partitioning='dirichlet'", "alpha=0.1"],
    "shards-2": ["partitioning='shards'", "shards-per-client=2"],
}


def largest_ratio(store: UpdateStore) -> float:
    """max over rounds and clients of ||U_k|| / median_{j != k} ||U_j||."""
    worst = 0.0
    for t in store.rounds():
        updates = store.read_round(t).updates
        norms = {
            k: float(np.sqrt(sum(float((v.double() ** 2).sum()) for v in u.values())))
            for k, u in updates.items()
        }
        for k, norm in norms.items():
            others = [n for j, n in norms.items() if j != k]
            if others and np.median(others) > 0:
                worst = max(worst, norm / float(np.median(others)))
    return worst


def _train(output: Path, name: str, seed: int, sets: list[str]) -> tuple[Path, int]:
    argv = [str(DIGITS), "--output-dir", str(output), "--set", f"run-name='{name}'"]
    argv += ["--set", f"seed={seed}", "--set", "rounds=8", "--set", "unlearn-clients=''"]
    argv += [x for s in sets for x in ("--set", s)]
    print(f"=== fedunlearn-run {' '.join(argv)}", flush=True)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = runner.main(argv)
    if code != 0:
        print(captured.getvalue(), file=sys.stderr)
        raise SystemExit(f"{name}: fedunlearn-run exited {code}")
    return output / name, captured.getvalue().count("refused the train reply")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser, "results/update-norms", data_root=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    rows = []
    for skew, sets in SKEWS.items():
        for seed in args.seeds:
            run, refused = _train(args.output_dir, f"{skew}-seed{seed}", seed, sets)
            with UpdateStore(run / "store", readonly=True) as store:
                ratio = largest_ratio(store)
            bound = json.loads((run / "config.json").read_text())["max-update-ratio"]
            rows.append({"partitioning": skew, "seed": seed, "largest_ratio": ratio,
                         "refused": refused, "max_update_ratio": bound})  # fmt: skip
            print(f"{skew} seed {seed}: largest norm / median of the others {ratio:.2f}")
    table = pd.DataFrame(rows)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.output_dir / "update_norms.csv", index=False)
    (args.output_dir / "update_norms.md").write_text(table.to_markdown(index=False) + "\n")
    print(table.to_markdown(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
