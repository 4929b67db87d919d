"""The reference implementation of poisoning recovery (Jiang, Shen et al., *Crab*, IEEE TIFS 2025;
public code github.com/shenjiyuan123/Adaptive_Recovery, which also implements FedRecover, FedEraser
and retraining) run on the setting shared with ``simulations/reference_mnist.toml``.

The shared setting (read from the TOML's data keys, so both sides train on the same clients):

- MNIST, the seeded ``train-samples = 10000`` subset of the training set split IID over K = 10
  clients by ``fedunlearn.data.load_federated_data`` (1,000 samples each, the partitions our runs
  use); the 10,000 test images split IID (seed 0) into 10 shards of 1,000, one per client.
- The reference's CNN ``FedAvgCNN``: conv 32@5x5, pool, conv 64@5x5, pool, FC 512, FC 10
  (= our ``cifar10-cnn``).
- 10 rounds of FedAvg with every client, E_loc = 1, batch 64. The reference keeps its optimiser:
  Adam, lr 0.005, state kept across rounds per client. Seed 0 for Python, NumPy and torch; one
  torch thread (``--threads``).
- Attack: the reference's "backdoor I" on 2 clients its seeded RNG draws (clients 5 and 7 with
  seed 0): on a malicious client every sample of another class gets a 4x4 white square in the
  bottom-right corner and label 2, its samples of class 2 are dropped. Those clients are removed
  after training, then each method recovers: ``Retrain`` (FedAvg from the initial model, 10 rounds),
  ``FedEraser`` (calibration every second round, full local epochs), ``FedRecover`` (the
  reference's version: the remaining clients retrain every round with torch's L-BFGS optimiser;
  there is no Hessian estimation) and ``Crab`` (selected rounds and clients, adaptive rollback).
- Readouts, computed by the reference's own ``evaluate`` on the model each method returns: test
  accuracy (mean over the 8 remaining clients' test shards: 8,000 test images), attack success rate
  (share of the malicious clients' stamped training samples classified as 2), wall time of the
  training and of the recovery, and client-epochs of the recovery (counted from the rounds the
  reference prints: it does not count them itself). Their loops evaluate every round (the loss
  steers FedRecover's and Crab's), so both wall times include that evaluation.

What the reference does that a reader of its numbers should know (commit e899781):

- FedEraser (``serverEraser.unlearning``) calibrates along mean(new client models) minus their
  FedAvg aggregate, not minus the global model the clients started from: with equally large
  clients that is 0, and eq. (2)'s unit direction 0/0 makes every parameter NaN.
- FedRecover (``serverFedRecover.recover``) is retraining with L-BFGS as the clients' optimiser;
  no update is estimated from the history, and a rising loss reloads the poisoned run's model.
- The accuracies FedEraser's and Crab's loops print are the clients' models' (old ones in
  FedEraser), not the recovered global model's; hence the patch's final evaluation.

The reference runs unchanged except for ``reference/adaptive_recovery.patch`` (time the recovery and
evaluate the returned model) and stand-ins for four packages it imports but this run does not use
(``wandb``, ``h5py``, ``xgboost``, ``ujson``); see ``reference/README.md``.

Usage::

    python -m simulations.benchmarks.reference_recovery --reference-dir PATH \\
        [--data-root DIR] [--methods Retrain FedEraser FedRecover Crab]

``--reference-dir`` defaults to ``$FEDUNLEARN_REFERENCE_DIR``. Writes
``reference_recovery_theirs.csv``/``.md`` to ``--output-dir`` (default
``simulations/benchmarks/results``) and each method's log to ``--log-dir``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from fedunlearn.config import ExperimentConfig
from fedunlearn.data import load_federated_data, partition_indices
from simulations.benchmarks import default_data_root
from simulations.benchmarks._args import common_args
from simulations.run import load_run_config

SIMULATIONS = Path(__file__).resolve().parents[1]
SHARED_CONFIG = SIMULATIONS / "reference_mnist.toml"
METHODS = ("Retrain", "FedEraser", "FedRecover", "Crab")
#: The reference's attack on the shared setting ("backdoor I": fixed target label, no clamping).
ATTACK_ARGUMENTS = "-backdoor --trigger_size 4 --label_inject_mode Fix --tampered_label 2".split()
NUM_MALICIOUS = 2

# Runs FedMoss.py as its __main__ after seeding every RNG it draws from (it seeds none itself) and
# putting stand-ins in place of packages it imports but this run never uses, so that it runs with
# the project's environment and no network: the Weights & Biases logger (no-op), the HDF5 result
# file (not written: results come from the log), XGBoost (membership attack, not run), ujson
# (dataset generation, not run; the json module has the same calls).
_LAUNCHER = r"""
import json, random, runpy, sys, types
import numpy, torch
reference, seed, threads, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
wandb = types.ModuleType("wandb")
wandb.init = wandb.log = lambda *args, **kwargs: None
class _NoFile:
    def __init__(self, *args, **kwargs): pass
    def __enter__(self): return self
    def __exit__(self, *exc): return False
    def create_dataset(self, *args, **kwargs): pass
h5py = types.ModuleType("h5py")
h5py.File = _NoFile
xgboost = types.ModuleType("xgboost")
def _no_xgboost(*args, **kwargs):
    raise RuntimeError("xgboost is not installed: run without -verify")
xgboost.XGBClassifier = _no_xgboost
sys.modules.update(wandb=wandb, h5py=h5py, xgboost=xgboost, ujson=json)
random.seed(seed); numpy.random.seed(seed); torch.manual_seed(seed)
torch.set_num_threads(threads)
sys.path.insert(0, reference)
sys.argv = [reference + "/FedMoss.py", *argv]
runpy.run_path(reference + "/FedMoss.py", run_name="__main__")
"""


def shared_setting(config_path: Path, data_root: str | None) -> ExperimentConfig:
    """The shared setting from our run config (keys this script does not use are tolerated)."""
    values = load_run_config(config_path)
    if data_root:
        values["data-root"] = data_root
    return ExperimentConfig.from_run_config(values, strict=False)


def write_client_files(config: ExperimentConfig, folder: Path) -> None:
    """The clients' data in the reference's layout, ``<folder>/mnist/{train,test}/<k>.npz`` (a pickled
    ``{"x": float32 (N, 1, 28, 28), "y": int64 (N,)}``), normalised as its ``generate_mnist.py`` does:
    ``(pixel / 255 - 0.5) / 0.5``. Training samples are our partitions; test shards an IID split."""
    import torchvision

    partitions = load_federated_data(config).partitions
    root = str(config.data_root_path)
    train = torchvision.datasets.MNIST(root, train=True, download=False)
    test = torchvision.datasets.MNIST(root, train=False, download=False)
    shards = partition_indices(test.targets.numpy(), config.num_clients, "iid", seed=config.seed)
    for split, source, parts in (("train", train, partitions), ("test", test, shards)):
        (folder / "mnist" / split).mkdir(parents=True, exist_ok=True)
        for client, index in enumerate(parts):
            x = source.data.numpy()[index][:, None].astype(np.float32) / 255.0
            y = source.targets.numpy()[index].astype(np.int64)
            with open(folder / "mnist" / split / f"{client}.npz", "wb") as handle:
                np.savez_compressed(handle, data={"x": (x - 0.5) / 0.5, "y": y})


def their_arguments(config: ExperimentConfig, method: str, device: str) -> list[str]:
    """FedMoss.py's command line for ``method`` on the shared setting. Its loops run
    ``global_rounds + 1`` rounds (0..global_rounds), hence ``rounds - 1``."""
    return [
        "--algorithm", method, "--dataset", "mnist", "--model", "cnn", "--device", device,
        "--num_clients", str(config.num_clients), "--unlearn_clients_number", str(NUM_MALICIOUS),
        "--global_rounds", str(config.rounds - 1), "--local_epochs", str(config.local_epochs),
        "--batch_size", str(config.batch_size), *ATTACK_ARGUMENTS,
    ]  # fmt: skip


def run_method(
    reference: Path, data: Path, arguments: list[str], seed: int, threads: int, log: Path
) -> float:
    """Run FedMoss.py in a scratch folder (it writes every round's client models to its working
    directory) and keep its output in ``log``; returns the wall seconds."""
    environment = dict(os.environ)
    # The reference pickles whole models and clients; torch >= 2.6 loads weights only by default.
    environment["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    command = [sys.executable, "-c", _LAUNCHER, str(reference), str(seed), str(threads)]
    command += arguments
    with tempfile.TemporaryDirectory(prefix="reference-recovery-") as scratch:
        (Path(scratch) / "data").symlink_to(data)
        started = time.perf_counter()
        with open(log, "w") as output:
            done = subprocess.run(
                command, cwd=scratch, env=environment, stdout=output, stderr=subprocess.STDOUT
            )
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the reference exited with {done.returncode}; see {log}")
    return seconds


def _final_metrics(text: str, stage: str) -> tuple[float, float]:
    """Test accuracy and attack success rate of the patch's final evaluation of ``stage``; NaN when
    the model has non-finite parameters (their FedEraser's calibration divides 0 by 0 when the
    remaining clients hold equally many samples: see ``reference/README.md``)."""
    section = text.split(f"=== Final model of the {stage}", 1)[1]
    if section.startswith(": non-finite"):
        return float("nan"), float("nan")
    accuracy = re.search(r"Averaged Test Accurancy: ([\d.]+)", section)
    success = re.search(r"Averaged Attack success rate: ([\d.]+)", section)
    return float(accuracy.group(1)), float(success.group(1))


def _recovery_client_epochs(text: str, method: str, remaining: int, local_epochs: int) -> int:
    """Client-epochs of the recovery, from the rounds the reference prints. Retrain, FedEraser and
    FedRecover train every remaining client E_loc epochs per printed round (FedRecover with L-BFGS,
    up to 5 loss evaluations per batch); Crab's round prints the ids of the clients it selected,
    each of which trains one epoch from the old and one from the new global model."""
    recovery = text.split("Recovery seconds", 1)[0]
    if method == "Crab":
        recovery = recovery.split("***************", 1)[1]
        selected = re.findall(r"^\[([\d, ]*)\]$", recovery, flags=re.MULTILINE)
        return sum(2 * len([i for i in ids.split(",") if i.strip()]) for ids in selected)
    rounds = len(re.findall(rf"-{{13}}{method} Round number", recovery))
    return rounds * remaining * local_epochs


def parse_log(text: str, method: str, config: ExperimentConfig) -> dict[str, object]:
    """One row of the table from a FedMoss.py log."""
    targets = re.search(r"Target clients id: \[([\d, ]*)\]", text).group(1)
    malicious = sorted(int(i) for i in targets.split(","))
    train_accuracy, train_success = _final_metrics(text, "training")
    accuracy, success = _final_metrics(text, "recovery")
    remaining = config.num_clients - len(malicious)
    row = {
        "method": method,
        "malicious_clients": ",".join(str(i) for i in malicious),
        "poisoned_test_accuracy": train_accuracy,
        "poisoned_attack_success": train_success,
        "test_accuracy": accuracy,
        "attack_success": success,
        "recovery_client_epochs": _recovery_client_epochs(
            text, method, remaining, config.local_epochs
        ),
        "training_seconds": float(re.search(r"Training seconds: ([\d.]+)", text).group(1)),
        "recovery_seconds": float(re.search(r"Recovery seconds: ([\d.]+)", text).group(1)),
    }
    if method == "Crab":
        stored = re.findall(r"select clients from epoch \d+: \[([\d, ]*)\]", text)
        row["crab_rounds_kept"] = len(stored)
        row["crab_client_models_kept"] = sum(len(s.split(",")) for s in stored if s.strip())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference-dir",
        type=Path,
        default=os.environ.get("FEDUNLEARN_REFERENCE_DIR"),
        help="the exported and patched Adaptive_Recovery (default: $FEDUNLEARN_REFERENCE_DIR)",
    )
    parser.add_argument("--data-root", default=default_data_root(), help="holds MNIST/raw")
    parser.add_argument("--config", type=Path, default=SHARED_CONFIG, help="the shared setting")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the reference")
    common_args(parser, SIMULATIONS / "benchmarks" / "results", data_root=False)
    parser.add_argument("--log-dir", type=Path, default=Path("results/reference-recovery"))
    args = parser.parse_args(argv)
    if args.reference_dir is None or not (args.reference_dir / "FedMoss.py").is_file():
        parser.error(
            f"--reference-dir {args.reference_dir}: a folder holding the reference's FedMoss.py "
            "(set it or $FEDUNLEARN_REFERENCE_DIR)"
        )
    config = shared_setting(args.config, args.data_root)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    data = Path(tempfile.mkdtemp(prefix="reference-recovery-data-"))
    try:
        write_client_files(config, data)
        for method in args.methods:
            log = args.log_dir / f"{method}.log"
            arguments = their_arguments(config, method, args.device)
            print(f"=== {method}: FedMoss.py {' '.join(arguments)}", flush=True)
            reference = args.reference_dir.resolve()
            seconds = run_method(reference, data, arguments, config.seed, args.threads, log)
            row = parse_log(log.read_text(), method, config)
            row["wall_seconds"] = round(seconds, 1)
            print(f"=== {method}: {row}", flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    table = pd.DataFrame(rows)
    stem = args.output_dir / "reference_recovery_theirs"
    table.to_csv(stem.with_suffix(".csv"), index=False)
    markdown = to_markdown(table)
    stem.with_suffix(".md").write_text(markdown + "\n")
    print(markdown)
    return 0


def to_markdown(table: pd.DataFrame) -> str:
    """The table with rates to 4 decimals, seconds to 1, counts as integers and "–" where a column
    does not apply (Crab's selection for the other methods) or the model was not finite."""

    def cell(column: str, value) -> str:
        if isinstance(value, str):
            return value
        if pd.isna(value):
            return "–"
        if column.endswith("_seconds"):
            return f"{value:.1f}"
        if column.endswith(("_accuracy", "_success")):
            return f"{value:.4f}"
        return str(int(value))

    shown = pd.DataFrame({c: [cell(c, v) for v in table[c]] for c in table.columns})
    return shown.to_markdown(index=False, stralign="right", disable_numparse=True)


if __name__ == "__main__":
    sys.exit(main())
