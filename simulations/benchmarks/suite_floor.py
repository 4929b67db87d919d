"""The suite's compute floor: the seconds its clients' local training alone takes on this machine.

Every suite point (:mod:`simulations.benchmarks.suite`) trains ``rounds x K x E`` client-epochs,
then its methods spend their own (the ``client_epochs`` column of each ``unlearning.csv``). This
benchmark times one client-epoch of each dataset's model on its client's share of samples
(:func:`fedunlearn.training.local.train_epochs` on random tensors of the sample shape, batch size
and SGD settings of the suite, one CPU thread, best of ``--repeats``), reads the client-epochs of
every point of a suite output directory (``--suite-dir``; a regime's points of a dataset not run
there take that regime's mean over the points that ran), and writes per regime and dataset the
floor: client-epochs x seconds per client-epoch, over ``--cores`` points at once. Nothing else
(messages, Ray, evaluation, the server's aggregation and checks, starting runs) is counted, so no
way of running the suite on this machine can finish faster than the floor.

Writes ``suite_floor.csv/.md``.

Usage::

    python -m simulations.benchmarks.suite_floor --suite-dir results/suite \\
        --output-dir results/suite-floor [--cores 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from fedunlearn.training.local import train_epochs
from fedunlearn.training.models import build_dataset_model
from simulations.benchmarks._args import common_args
from simulations.benchmarks.suite import PARTITIONS, REGIMES, SEEDS


@dataclass(frozen=True)
class Client:
    """One suite client's local training: its model, samples and SGD settings."""

    dataset: str
    model: str
    shape: tuple[int, ...]
    classes: int
    samples: int
    lr: float
    momentum: float


#: K = 10 clients: digits' 1,347 training samples, the others' seeded 6,000-sample subsets; the
#: learning rates and momenta of :data:`simulations.benchmarks.suite.DATASETS`; batch 32.
CLIENTS = (
    Client("digits", "digits-cnn", (1, 8, 8), 10, 135, 0.05, 0.9),
    Client("mnist", "mnist-cnn", (1, 28, 28), 10, 600, 0.02, 0.9),
    Client("fashion-mnist", "mnist-cnn", (1, 28, 28), 10, 600, 0.02, 0.9),
    Client("adult", "adult-mlp", (108,), 2, 600, 0.01, 0.9),
)
K, BATCH = 10, 32


def seconds_per_client_epoch(client: Client, repeats: int) -> float:
    """The fastest of ``repeats`` timings of one local epoch of ``client``."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(client.samples, *client.shape, generator=generator)
    y = torch.randint(0, client.classes, (client.samples,), generator=generator)
    model = build_dataset_model(client.model, client.dataset, client.shape, client.classes, seed=0)
    sgd = dict(epochs=1, lr=client.lr, batch_size=BATCH, momentum=client.momentum, seed=0)
    train_epochs(model, x, y, **sgd)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        train_epochs(model, x, y, **sgd)
        times.append(time.perf_counter() - started)
    return min(times)


def training_client_epochs(regime: str) -> int:
    """rounds x K x E of ``regime``'s training."""
    keys = dict(item.split("=") for item in REGIMES[regime])
    return int(keys["rounds"]) * K * int(keys["local-epochs"])


def method_client_epochs(suite_dir: Path, regime: str, dataset: str) -> tuple[float, int]:
    """The mean over ``dataset``'s points in ``regime`` (else over the regime's points) of the
    methods' client-epochs, and how many points it read."""
    points = sorted((suite_dir / regime).glob(f"{dataset}-*/unlearning.csv"))
    points = points or sorted((suite_dir / regime).glob("*/unlearning.csv"))
    if not points:
        raise SystemExit(f"no {regime} point with unlearning.csv under {suite_dir / regime}")
    sums = [pd.read_csv(p)["client_epochs"].fillna(0).sum() for p in points]
    return sum(sums) / len(sums), len(points)


def floor_table(suite_dir: Path, cores: int, repeats: int) -> pd.DataFrame:
    """Per regime and dataset: client-epochs per point, seconds per client-epoch, floor."""
    rows = []
    points = len(PARTITIONS) * len(SEEDS)
    for client in CLIENTS:
        seconds = seconds_per_client_epoch(client, repeats)
        for regime in REGIMES:
            methods, read = method_client_epochs(suite_dir, regime, client.dataset)
            epochs = training_client_epochs(regime) + methods
            rows.append(
                {
                    "regime": regime,
                    "dataset": client.dataset,
                    "points": points,
                    "client_epochs_per_point": epochs,
                    "points_read": read,
                    "s_per_client_epoch": seconds,
                    "floor_minutes": points * epochs * seconds / cores / 60,
                }
            )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite-dir", type=Path, required=True, help="a suite's --output-dir")
    parser.add_argument("--cores", type=int, default=2, help="points trained at once")
    parser.add_argument("--repeats", type=int, default=3)
    common_args(parser, "results/suite-floor", data_root=False)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    table = floor_table(args.suite_dir, args.cores, args.repeats)
    total = table["floor_minutes"].sum()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.output_dir / "suite_floor.csv", index=False)
    title = (
        f"The suite's compute floor on {args.cores} core(s): {total:.1f} min of local training "
        f"alone ({', '.join(f'{r}: {m:.1f}' for r, m in table.groupby('regime')['floor_minutes'].sum().items())})"
    )
    markdown = f"{title}\n\n{table.to_markdown(index=False, floatfmt='.4f')}\n"
    (args.output_dir / "suite_floor.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
