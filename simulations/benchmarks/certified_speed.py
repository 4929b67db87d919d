"""Certified removal at the hardware's pace: our engine against the authors' code, in one run.

Setting (Guo, Goldstein, Hannun, van der Maaten, ICML 2020, MNIST 3 vs 8): the 11,982 training
images of 3s and 8s, pixels ``x / 255 - 0.5`` scaled to unit norm (d = 784), binary logistic
regression, ``lambda = 1e-3``, ``sigma = 10``, ``(epsilon, delta) = (1, 1e-4)``; single-sample
removal requests, ``--removals`` of them per stream, on the CPU only.

Each of ``--rounds`` rounds times, one after the other (the order alternates between rounds so
that a change of machine load hits both sides):

* **theirs**: facebookresearch/certified-removal's ``test_removal.py`` (commit 7693b26) run
  unchanged except for its one device line (``torch.device("cuda")`` becomes ``"cpu"``, in memory;
  their file is not edited) with their README's MNIST command and ``--num-removes``. Per removal it
  forms the Hessian of the remaining data and inverts it, downdates ``K = X^T X`` and runs 20 power
  iterations for ``||X'||``, in float32 torch. The per-removal seconds are the ``times`` tensor
  their script saves; the first round also trains (L-BFGS), the later ones load that model.
  Their code is not in this repository: point ``--reference-dir`` (default
  ``$FEDUNLEARN_CERTIFIED_REFERENCE_DIR``) at an exported copy;
* **ours, fast** and **ours, exact**: :class:`fedunlearn.certified.removal.CertifiedHead` with the
  run configuration's defaults (per-point bound, exact gamma; fast: cached eigendecomposition,
  Woodbury downdates, stale vector measured in float32 with proven rounding bounds, one read of
  X per request; exact: the Hessian at the current w in float32 with the solve's residual
  measured in float64), trained once per round with one ``b = sigma z`` (z from the operating
  system). A request's time is the wall time of ``head.remove`` (ledger-free), refreshes and
  retrains included;
* **ours, fast, cached bound**: the fast mode with ``bound="cached"``
  (:mod:`fedunlearn.certified.cached_bound`): Guo et al.'s Corollary 1 from statistics cached
  across requests -- ``K' = X'^T X'`` downdated by the removed rows, the last ``||X'||_2``, a
  rank-64 sketch of the rows for ``max_i |x_i^T u|`` -- each with a proven rounding bound, never
  reading X between refreshes. The acceptance targets apply to this stream;
* **naive** (``--naive-removals`` > 0): the benchmark's numpy mirror of the authors' loop
  (:func:`simulations.benchmarks.certified_removal.naive_removals`: general Hessian product,
  explicit inverse, full ``eigvalsh`` of ``K``, float64) -- the stand-in when their code is absent.

Readouts per stream: mean and median seconds per removal (refreshes counted), total seconds, fast
mode's refreshes, retrains, beta and the true gradient residual ``||grad L_b(w; D')||`` after the
stream (beta must be at least it), the test accuracy; and per round, the ratio of the authors'
total to ours. Writes ``streams.csv/.md`` (one row per stream) and ``summary.csv/.md``.

Usage::

    python -m simulations.benchmarks.certified_speed --data-root ~/data \\
        --reference-dir ~/certified-removal --output-dir results/certified-speed [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from fedunlearn.certified.losses import one_vs_rest_targets
from fedunlearn.certified.perturbation import sample_perturbation
from simulations.benchmarks import default_data_root
from simulations.benchmarks._args import common_args
from simulations.benchmarks.certified_removal import (
    CLASSES,
    LAM,
    SIGMA,
    accuracy,
    fmt,
    load_mnist_pair,
    make_head,
    missing_mnist,
    naive_removals,
    say,
    train,
    write_table,
)

#: The acceptance targets of the cached-bound stream: mean seconds per removal (refreshes
#: counted), and theirs / ours totals.
MEAN_TARGET = 0.0025
RATIO_TARGET = 50.0
#: The stream the targets apply to.
TARGET_METHOD = "ours, fast, cached bound"
REFERENCE_ENV = "FEDUNLEARN_CERTIFIED_REFERENCE_DIR"
DEVICE_LINE = 'device = torch.device("cuda")'
# Runs their test_removal.py as __main__ with its one device line pointed at the CPU (the file on
# disk is untouched) and torch limited to --threads threads, like our BLAS.
_LAUNCHER = r"""
import sys, torch
reference, threads, line, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
torch.set_num_threads(threads)
path = reference + "/test_removal.py"
source = open(path).read()
if source.count(line) != 1:
    raise SystemExit(f"{path}: expected the line {line!r} exactly once")
source = source.replace(line, 'device = torch.device("cpu")')
sys.path.insert(0, reference)
sys.argv = [path, *argv]
exec(compile(source, path, "exec"), {"__name__": "__main__", "__file__": path})
"""


def their_arguments(data_root: Path, result_dir: Path, removals: int) -> list[str]:
    """Their README's MNIST 3 vs 8 command (``--verbose`` dropped), ``removals`` removals."""
    return [
        "--data-dir", str(data_root), "--result-dir", str(result_dir), "--extractor", "none",
        "--dataset", "MNIST", "--train-mode", "binary", "--std", str(SIGMA), "--lam", str(LAM),
        "--num-steps", "100", "--num-removes", str(removals),
    ]  # fmt: skip


def run_theirs(reference: Path, data_root: Path, scratch: Path, removals: int, threads: int):
    """One run of their script; the per-removal seconds and bounds it saved, and its log."""
    command = [sys.executable, "-c", _LAUNCHER, str(reference), str(threads), DEVICE_LINE]
    command += their_arguments(data_root, scratch, removals)
    environment = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run(command, cwd=scratch, env=environment, capture_output=True, text=True)
    log = done.stdout + done.stderr
    (scratch / "theirs.log").write_text(log)
    if done.returncode != 0:
        raise SystemExit(f"their test_removal.py exited with {done.returncode}:\n{log[-3000:]}")
    import torch

    saved = sorted(scratch.glob("*_removal.pth"))
    if len(saved) != 1:
        raise SystemExit(f"expected one *_removal.pth in {scratch}, found {saved}")
    result = torch.load(saved[0])
    saved[0].unlink()
    accuracies = [float(a) for a in re.findall(r"Test accuracy = ([\d.]+)", log)]
    return result["times"].numpy().astype(float), result["grad_norm_approx"].numpy(), accuracies


def stream_row(method: str, rnd: int, seconds: np.ndarray, **extra) -> dict:
    return {
        "round": rnd,
        "method": method,
        "removals": len(seconds),
        "mean_ms": 1e3 * float(np.mean(seconds)),
        "median_ms": 1e3 * float(np.median(seconds)),
        "max_ms": 1e3 * float(np.max(seconds)),
        "total_s": float(np.sum(seconds)),
        **extra,
    }


def ours(
    mode: str, rnd: int, X, T, Xt, yt, order, removals: int, z, label: str = "", **overrides
) -> dict:
    """One stream of our engine with the run configuration's defaults for ``mode`` (and the
    engine settings ``overrides``)."""
    head = make_head(X, T, mode=mode, track_bounds=False, **overrides)
    train(head, z)
    seconds, refreshes, retrains = [], 0, 0
    for index in order[:removals]:
        start = time.perf_counter()
        certificate = head.remove([int(index)])
        seconds.append(time.perf_counter() - start)
        refreshes += certificate.refreshed and not certificate.retrained
        retrains += certificate.retrained
    residual = head.residual()
    row = stream_row(
        f"ours, {mode}{label}",
        rnd,
        np.asarray(seconds),
        refreshes=refreshes if mode == "fast" else None,
        retrains=retrains,
        beta=head.beta,
        true_residual=residual,
        bound_holds=bool(residual <= head.beta),
        accuracy=accuracy(head, Xt, yt),
    )
    say(
        f"  [ours {mode}{label}] mean {row['mean_ms']:.2f} ms, median {row['median_ms']:.2f} ms, "
        f"total {row['total_s']:.3f} s, refreshes {refreshes}, beta {head.beta:.4g} >= residual "
        f"{residual:.3g}, accuracy {row['accuracy']:.4f}"
    )
    return row


def theirs(args, rnd: int, scratch: Path) -> dict:
    seconds, bounds, accuracies = run_theirs(
        args.reference_dir, args.data_root, scratch, args.removals, args.threads
    )
    row = stream_row(
        "theirs (certified-removal, CPU)",
        rnd,
        seconds,
        beta=float(np.sum(bounds)),
        accuracy=accuracies[-1] if accuracies else None,
    )
    say(
        f"  [theirs] mean {row['mean_ms']:.1f} ms, median {row['median_ms']:.1f} ms, total "
        f"{row['total_s']:.2f} s, Corollary-1 beta {row['beta']:.4g}"
    )
    return row


def naive(rnd: int, X, T, order, count: int, z) -> dict:
    head = make_head(X, T, track_bounds=False)
    train(head, z)
    result = naive_removals(X, T, head.weights, order, count)
    seconds = np.asarray(result["seconds"])
    row = stream_row("naive (numpy mirror of theirs)", rnd, seconds, beta=result["corollary-1"])
    say(f"  [naive] mean {row['mean_ms']:.1f} ms over {count} removals")
    return row


def _cached(rnd: int, data, removals: int, label: str = ", cached bound") -> tuple:
    """The positional arguments of :func:`ours` for a cached-bound stream."""
    X, T, Xt, yt, order, z = data
    return ("fast", rnd, X, T, Xt, yt, order, removals, z, label)


def one_round(args, rnd: int, data, scratch: Path) -> list[dict]:
    X, T, Xt, yt, order, z = data
    steps = [
        lambda: ours("fast", rnd, X, T, Xt, yt, order, args.removals, z),
        lambda: ours(*_cached(rnd, data, args.removals), bound="cached"),
        lambda: ours("exact", rnd, X, T, Xt, yt, order, args.exact_removals, z),
    ]
    if args.reference_dir is not None:
        steps.append(lambda: theirs(args, rnd, scratch))
    if args.naive_removals:
        steps.append(lambda: naive(rnd, X, T, order, args.naive_removals, z))
    if rnd % 2 == 0:
        steps.reverse()  # alternate who runs first
    load = os.getloadavg()[0]
    say(f"round {rnd} (1-minute load {load:.2f})")
    rows = [step() for step in steps]
    for row in rows:
        row["load_before_round"] = load
    return rows


def summarise(streams: pd.DataFrame, args) -> pd.DataFrame:
    """Per method, all rounds: mean and median per removal, total per stream; the ratios of the
    authors' (or the naive stand-in's) mean per removal to ours, i.e. of the totals for
    ``--removals`` removals, paired round by round."""
    baseline = "theirs (certified-removal, CPU)"
    if baseline not in set(streams["method"]):
        baseline = "naive (numpy mirror of theirs)"
    rows = []
    for method, group in streams.groupby("method", sort=False):
        row = {
            "method": method,
            "streams": len(group),
            "removals_per_stream": int(group["removals"].iloc[0]),
            "mean_ms": float(group["mean_ms"].mean()),
            "median_ms": float(group["median_ms"].median()),
            "worst_stream_mean_ms": float(group["mean_ms"].max()),
            "total_s_per_stream": float(group["total_s"].mean()),
            "refreshes": group["refreshes"].sum(min_count=1) if "refreshes" in group else None,
        }
        if (
            method != baseline
            and baseline in set(streams["method"])
            and len(group) == sum(streams["method"] == baseline)
        ):
            paired = streams[streams["method"] == baseline].set_index("round")["mean_ms"]
            mine = group.set_index("round")["mean_ms"]
            ratios = paired.reindex(mine.index) / mine
            row[f"{baseline} / this, per round"] = ", ".join(f"{r:.1f}" for r in ratios)
            row["ratio_min"] = float(ratios.min())
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["baseline"] = baseline
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-root",
        type=lambda text: Path(text).expanduser(),
        default=default_data_root(),
        help="torchvision-layout data root holding MNIST/raw/ (default: $FEDUNLEARN_DATA_ROOT, "
        "else ~/data); never downloads",
    )
    parser.add_argument(
        "--reference-dir",
        type=lambda text: Path(text).expanduser(),
        default=os.environ.get(REFERENCE_ENV),
        help="an exported copy of facebookresearch/certified-removal (default: "
        f"${REFERENCE_ENV}); without it the naive numpy mirror stands in",
    )
    common_args(parser, "results/certified-speed", data_root=False, force=True)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--removals", type=int, default=100, help="removals per stream")
    parser.add_argument(
        "--naive-removals",
        type=int,
        default=None,
        help="removals of the naive numpy mirror per round (default: 0 with --reference-dir, "
        "else 20; 0 skips it)",
    )
    parser.add_argument(
        "--exact-removals",
        type=int,
        default=None,
        help="removals of our exact mode per round (default: --removals)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads for their code")
    parser.add_argument(
        "--long-removals",
        type=int,
        default=1000,
        help="removals of one extra fast stream after the rounds, long enough for refreshes and "
        "||X'|| recomputations to come due (default 1000; 0 skips it)",
    )
    parser.add_argument("--seed", type=int, default=0, help="our removal order")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 round of 10 removals, naive 3"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.removals, args.long_removals = 1, 10, 30
        args.naive_removals = 3 if args.naive_removals is None else args.naive_removals
    if args.exact_removals is None:
        args.exact_removals = args.removals
    if args.naive_removals is None:
        args.naive_removals = 0 if args.reference_dir is not None else 20
    if args.rounds < 1 or min(args.removals, args.exact_removals) < 1:
        parser.error("--rounds, --removals and --exact-removals must be at least 1")
    if min(args.naive_removals, args.long_removals) < 0:
        parser.error("--naive-removals and --long-removals must be at least 0")
    missing = missing_mnist(args.data_root)
    if missing:
        parser.error(f"--data-root {args.data_root}: MNIST not found (missing {missing[0]})")
    if args.reference_dir is not None and not (args.reference_dir / "test_removal.py").is_file():
        parser.error(f"--reference-dir {args.reference_dir}: no test_removal.py there")
    output = args.output_dir
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not args.force:
        parser.error(f"--output-dir {output} exists and is not empty; pass --force to overwrite")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = args.output_dir.resolve()
    output.mkdir(parents=True, exist_ok=True)
    say(f"loading MNIST 3 vs 8 from {args.data_root.resolve()}")
    X, y, Xt, yt = load_mnist_pair(args.data_root)
    T = one_vs_rest_targets(y, CLASSES)
    order = np.random.default_rng(args.seed).permutation(len(X))
    z = sample_perturbation("gaussian", 1.0, (T.shape[1], X.shape[1]))  # b = sigma z, from the OS
    data = (X, T, Xt, yt, order, z)
    loads = [os.getloadavg()[0]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="certified-speed-") as scratch:
        for rnd in range(1, args.rounds + 1):
            rows += one_round(args, rnd, data, Path(scratch))
            loads.append(os.getloadavg()[0])
    if args.long_removals:
        say(f"one long fast stream: {args.long_removals} removals (refreshes come due)")
        label = f", {args.long_removals}-removal stream"
        rows.append(ours("fast", 0, X, T, Xt, yt, order, args.long_removals, z, label))
        cached = f", cached bound{label}"
        rows.append(ours(*_cached(0, data, args.long_removals, cached), bound="cached"))
    streams = pd.DataFrame(rows)
    write_table(streams, output, "streams")
    summary = summarise(streams, args)
    notes = [
        f"\nbaseline: {summary.attrs['baseline']}",
        f"1-minute load average at start and after each round: {', '.join(f'{v:.2f}' for v in loads)}",
    ]
    if args.reference_dir is not None:
        source = (args.reference_dir / "test_removal.py").read_bytes()
        notes.append(f"their test_removal.py sha256 {hashlib.sha256(source).hexdigest()[:16]}")
    fast = summary[summary["method"] == TARGET_METHOD].iloc[0]
    notes.append(
        f"{TARGET_METHOD}: mean {fast['mean_ms']:.2f} ms per removal (target <= {MEAN_TARGET * 1e3:g} "
        f"ms: {'met' if fast['mean_ms'] <= MEAN_TARGET * 1e3 else 'MISSED'}); smallest "
        f"per-round ratio {fmt(fast.get('ratio_min'))} (target >= {RATIO_TARGET:g})"
    )
    write_table(summary, output, "summary", "\n".join(notes) + "\n")
    say("")
    say(summary.map(fmt).to_markdown(index=False))
    say("\n".join(notes))
    say(f"\nresults in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
