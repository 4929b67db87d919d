"""Micro-benchmark: N models trained one by one vs as one :class:`ModelStack`, seconds per model.

For each setting (a client's local training in the judge's runs) and N in ``--members``, times

- ``separate``: N calls of :func:`fedunlearn.training.local.train_epochs`, one per model;
- ``stacked``: one :func:`fedunlearn.training.stacked.train_stack_epochs` (batched matmul and grouped
  convolution over the member dimension, the formulation the stack uses for our models);
- ``stacked-vmap``: the same through ``torch.func.vmap`` over ``functional_call`` (the stack's
  fallback for other bodies), to show which formulation is faster,

each the fastest of ``--repeats`` runs, and writes ``stack_speed.csv``/``.md`` with seconds per model
and the speed-up of each stacked formulation over separate training. Timing needs no real data:
inputs are random tensors of each dataset's sample shape, as many as one client holds.

Usage::

    python -m simulations.benchmarks.stack_speed --output-dir results/stack_speed
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from unittest import mock

import pandas as pd
import torch

from fedunlearn.seeding import derive_seed
from fedunlearn.training import stacked
from fedunlearn.training.local import resolve_device, train_epochs
from fedunlearn.training.stacked import build_model_stack, member_seeds, train_stack_epochs
from simulations.benchmarks._args import common_args


@dataclass(frozen=True)
class Setting:
    """One client's local training: model, sample shape, samples held and the SGD settings."""

    name: str
    model: str
    dataset: str
    sample_shape: tuple[int, ...]
    num_classes: int
    samples: int
    batch_size: int
    epochs: int
    lr: float
    momentum: float


SETTINGS = (
    # simulations/digits.toml's clients (1347 training samples over 10, batch 32), 2 local epochs.
    Setting("digits", "digits-cnn", "digits", (1, 8, 8), 10, 135, 32, 2, 0.05, 0.9),
    # simulations/adult.toml's training (108 encoded features, batch 64) on a small-data client.
    Setting("adult", "adult-mlp", "adult", (108,), 2, 100, 64, 2, 0.01, 0.9),
    # simulations/mia_mnist.toml: 2000 training samples over 20 clients, batch 16, 5 local epochs.
    Setting("mnist", "mnist-cnn", "mnist", (1, 28, 28), 10, 100, 16, 5, 0.05, 0.9),
)


def _best_of(repeats: int, run, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the kernels queued, not only launched
        times.append(time.perf_counter() - started)
    return min(times)


def time_setting(
    setting: Setting, members: int, repeats: int, device: torch.device | str = "cpu"
) -> dict:
    """Seconds per model of each formulation for ``members`` models in ``setting``."""
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(setting.samples, *setting.sample_shape, generator=generator)
    y = torch.randint(0, setting.num_classes, (setting.samples,), generator=generator)
    stack = build_model_stack(
        setting.model,
        setting.dataset,
        setting.sample_shape,
        setting.num_classes,
        member_seeds(0, members),
    )
    seeds = [derive_seed(0, "train", index) for index in range(members)]
    sgd = dict(
        epochs=setting.epochs,
        lr=setting.lr,
        batch_size=setting.batch_size,
        momentum=setting.momentum,
        device=device,
    )

    def separate():
        for member, seed in zip(copy.deepcopy(stack).members, seeds, strict=True):
            train_epochs(member, x, y, seed=seed, **sgd)

    def stacked_run():
        train_stack_epochs(copy.deepcopy(stack), x, y, seeds=seeds, **sgd)

    def vmap_run():
        with mock.patch.object(stacked, "_is_plain_sequential", return_value=False):
            stacked_run()

    row = {
        "setting": setting.name,
        "model": setting.model,
        "members": members,
        "device": device.type,
    }
    for label, run in (
        ("separate", separate),
        ("stacked", stacked_run),
        ("stacked-vmap", vmap_run),
    ):
        run()  # warm-up: first-call allocations and kernel selection are not what we measure
        row[f"{label}_s_per_model"] = _best_of(repeats, run, device) / members
    row["speedup"] = row["separate_s_per_model"] / row["stacked_s_per_model"]
    row["speedup_vmap"] = row["separate_s_per_model"] / row["stacked-vmap_s_per_model"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser, "results/stack_speed", data_root=False)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--settings", nargs="+", default=[s.name for s in SETTINGS])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument(
        "--device", default="cpu", help="cpu, cuda or auto (cuda when visible): where models train"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    rows = []
    for setting in SETTINGS:
        if setting.name not in args.settings:
            continue
        for members in args.members:
            row = time_setting(setting, members, args.repeats, device)
            print(
                f"{setting.name} N={members}: separate {row['separate_s_per_model']:.4f}s, "
                f"stacked {row['stacked_s_per_model']:.4f}s per model "
                f"(x{row['speedup']:.1f}; vmap x{row['speedup_vmap']:.1f})",
                flush=True,
            )
            rows.append(row)
    table = pd.DataFrame(rows)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.output_dir / "stack_speed.csv", index=False)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    header = (
        f"Seconds per model, best of {args.repeats}, on {where}, {args.threads} CPU thread(s).\n\n"
    )
    markdown = table.to_markdown(index=False, floatfmt=".4f")
    (args.output_dir / "stack_speed.md").write_text(header + markdown + "\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
