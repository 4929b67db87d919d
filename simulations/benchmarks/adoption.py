"""Adoption on a skewed federation, then a second request (the case where FedEraser's
flagged model was once adopted and built on).

Digits, K = 10 clients holding label shards (2 per client), the main job's training; request 1
forgets clients 2 and 5 with ``unlearn-adopt = auto``. Then request 2 forgets client 3 from the
adopted history: first ``--dry-run`` with every client-removal method (refused, naming what the
history lacks, when request 1 did not run them), then for real with the methods the history
serves (the dry-run forgets client 4, whom no request forgets, so it answers for the history alone). A second run trains with every method, so that its history keeps what all of them need,
and its request 2 runs every method.

Prints, per run, the adoption line of request 1 and what request 2 did; writes ``adoption.md``.

Usage::

    python -m simulations.benchmarks.adoption [--output-dir results/adoption] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

import pandas as pd

from simulations import run as runner
from simulations.benchmarks._args import common_args

DIGITS = Path(__file__).resolve().parents[1] / "digits.toml"
EVERY = "federaser,fedaccum,fedrecover,crab,sifu,fedretrain"
DEFAULT = "federaser,fedaccum,fedretrain"
SHARDS = ["partitioning='shards'", "shards-per-client=2"]
RECOVERY = ["fedrecover-warmup=3", "fedrecover-correction-period=4", "fedrecover-final-tuning=1"]


def _run(name: str, output: Path, sets: list[str], *, dry_run: bool = False) -> tuple[int, str]:
    argv = [str(DIGITS), "--output-dir", str(output), "--set", f"run-name='{name}'"]
    argv += [x for s in sets for x in ("--set", s)] + (["--dry-run"] if dry_run else [])
    print(f"=== fedunlearn-run {' '.join(argv)}", flush=True)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = runner.main(argv)
    sys.stderr.write(err.getvalue())
    return code, err.getvalue()


def _adoption(directory: Path, request: int) -> str:
    entries = [json.loads(line) for line in (directory / "unlearning_log.jsonl").open()]
    entry = entries[request - 1]
    return f"{entry['adopted']} ({entry['adoption']})"


def scenario(name: str, output: Path, methods: str, seed: int) -> dict:
    """Train, request 1 (forget 2 and 5), request 2 (forget 3): dry-run with every method, then
    the request with ``methods``."""
    common = [*SHARDS, *RECOVERY, f"seed={seed}"]
    directory = output / name
    if not (directory / "unlearning.csv").is_file():
        code, _ = _run(
            name, output, [*common, "unlearn-clients='2,5'", f"unlearn-methods='{methods}'"]
        )
        if code:
            raise SystemExit(f"{name}: request 1 failed")
    table = pd.read_csv(directory / "unlearning.csv").set_index("method")
    second = [*common, "unlearn-only=true", "unlearn-clients='3'"]
    # client 4: never forgotten, so the dry-run's answer is the history's, before or after request 2
    probe = [*common, "unlearn-only=true", "unlearn-clients='4'", f"unlearn-methods='{EVERY}'"]
    code, refusal = _run(name, output, probe, dry_run=True)
    dry = "passed" if code == 0 else refusal.strip().splitlines()[-1]
    if not (directory / "unlearning-2.csv").is_file():
        code, _ = _run(name, output, [*second, f"unlearn-methods='{methods}'"])
        if code:
            raise SystemExit(f"{name}: request 2 failed")
    table2 = pd.read_csv(directory / "unlearning-2.csv").set_index("method")
    return {
        "run": name,
        "request 1 methods": methods,
        "federaser": f"{table.loc['federaser', 'test_accuracy']:.4f}",
        "fedretrain": f"{table.loc['fedretrain', 'test_accuracy']:.4f}",
        "request 1 adopted": _adoption(directory, 1),
        "request 2 dry-run, every method": dry,
        "request 2 ran": ", ".join(m for m in table2.index if m != "fedavg"),
        "request 2 adopted": _adoption(directory, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_args(parser, "results/adoption", data_root=False)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    output = args.output_dir.resolve()
    rows = [
        scenario(f"shards-default-s{args.seed}", output, DEFAULT, args.seed),
        scenario(f"shards-every-s{args.seed}", output, EVERY, args.seed),
    ]
    markdown = pd.DataFrame(rows).set_index("run").T.to_markdown() + "\n"
    (output / "adoption.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
