"""Benchmark: one federated round of ResNet-18 (CIFAR variant) per client, on the CPU or a GPU.

Each client does what a ClientApp actor does in one FedAvg round: load the global state, train
``--epochs`` local epochs of SGD (momentum 0.9, batch ``--batch-size``) on its ``--samples``
samples, hand back its state; the server then averages the states
(:func:`fedunlearn.training.model_state.weighted_average`). Inputs are synthetic CIFAR-shaped
tensors (3x32x32, 10 classes): the time does not depend on the pixels.

Reported per client-round (median over the clients, after one warm-up client): seconds, samples per
second, and memory:

- on CUDA, the peak of ``torch.cuda.max_memory_allocated`` during a client's round (what one Ray
  actor needs on the GPU, plus its CUDA context);
- always, an estimate from tensor sizes: parameters, gradients, SGD momentum, the client's state
  copy, and the activations autograd saves for one batch's backward (counted by a
  ``saved_tensors_hooks`` pack hook, each storage once).

``--num-gpus F`` is the GPU fraction a run gives each ClientApp actor (``fedunlearn-run
--num-gpus F``, Flower's ``client-resources-num-gpus``): the table adds how many actors share one
GPU (1/F) and the GPU memory they need together. The default setting (10 clients x 500 samples) is
the CIFAR setting's round (100 clients, fraction-train 0.1); on a small CPU use fewer, e.g.
``--clients 3 --samples 64``.

Usage::

    python -m simulations.benchmarks.resnet_round --device auto --num-gpus 0.25
    python -m simulations.benchmarks.resnet_round --device cpu --clients 3 --samples 64
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import pandas as pd
import torch

from fedunlearn.memory import MB, peak_rss_bytes
from fedunlearn.training.local import resolve_device, train_epochs
from fedunlearn.training.model_state import weighted_average
from fedunlearn.training.models import build_model
from simulations.benchmarks._args import common_args

SAMPLE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
#: A CUDA context per actor process, beside its tensors (a few hundred MB; measured by nvidia-smi,
#: not by PyTorch's allocator). Used only in the table's "GPU memory for 1/F actors" estimate.
CUDA_CONTEXT_MB = 500.0


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def activation_bytes(model: torch.nn.Module, batch: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward of one training batch (each storage counted once)."""
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(batch).sum()
    del loss
    return sum(seen.values())


def memory_estimate_mb(model: torch.nn.Module, batch_size: int) -> dict[str, float]:
    """One client's training memory from tensor sizes, MB: weights, gradients, SGD momentum and
    the state handed back (each the size of the state), and one batch's saved activations."""
    params = _tensor_bytes(model.parameters())
    state = _tensor_bytes(model.state_dict().values())
    device = next(model.parameters()).device
    batch = torch.randn(batch_size, *SAMPLE_SHAPE, device=device)
    activations = activation_bytes(model, batch)
    parts = {
        "params_mb": params / MB,
        "grads_mb": params / MB,
        "momentum_mb": params / MB,
        "state_copy_mb": state / MB,
        "activations_mb": activations / MB,
    }
    parts["estimate_mb"] = sum(parts.values())
    return parts


def client_round(
    model_name: str,
    global_state: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    args: argparse.Namespace,
    device: torch.device,
    seed: int,
) -> tuple[dict[str, torch.Tensor], float, float, float]:
    """One client's round: (its state, wall seconds, process CPU seconds, peak CUDA MB or NaN)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    started, cpu_started = time.perf_counter(), time.process_time()
    model = build_model(model_name, SAMPLE_SHAPE, NUM_CLASSES)
    model.load_state_dict(global_state)
    train_epochs(
        model,
        x,
        y,
        epochs=args.epochs,
        lr=0.05,
        batch_size=args.batch_size,
        seed=seed,
        momentum=0.9,
        device=device,
    )
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # the reply's arrays
    peak = math.nan
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) / MB
    return state, time.perf_counter() - started, time.process_time() - cpu_started, peak


def run_round(args: argparse.Namespace, device: torch.device) -> dict:
    """Time one round of ``args.clients`` clients (plus a warm-up client) and its aggregation."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, *SAMPLE_SHAPE, generator=generator)
    y = torch.randint(0, NUM_CLASSES, (args.samples,), generator=generator)
    global_model = build_model(args.model, SAMPLE_SHAPE, NUM_CLASSES, seed=0)
    global_state = global_model.state_dict()
    client_round(
        args.model, global_state, x[: args.batch_size], y[: args.batch_size], args, device, 0
    )
    states, seconds, cpu_seconds, peaks = [], [], [], []
    for client in range(args.clients):
        state, elapsed, cpu, peak = client_round(
            args.model, global_state, x, y, args, device, client
        )
        states.append(state)
        seconds.append(elapsed)
        cpu_seconds.append(cpu)
        peaks.append(peak)
        print(f"client {client}: {elapsed:.2f} s ({cpu:.2f} s of CPU)", flush=True)
    started = time.perf_counter()
    weighted_average(states, [args.samples] * args.clients)
    aggregation = time.perf_counter() - started
    median = statistics.median(seconds)
    row = {
        "model": args.model,
        "device": device.type,
        "clients": args.clients,
        "samples_per_client": args.samples,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "median_s_per_client_round": median,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "median_cpu_s": statistics.median(cpu_seconds),
        "samples_per_s": args.samples * args.epochs / median,
        "aggregation_s": aggregation,
        "peak_cuda_mb": max(peaks),
        "peak_rss_mb": (peak_rss_bytes() or 0) / MB,
    }
    row |= memory_estimate_mb(global_model.to(device), args.batch_size)
    return row


def gpu_sharing(row: dict, num_gpus: float) -> dict:
    """Actors sharing one GPU at ``num_gpus`` per actor, and the GPU memory they need together."""
    if not 0 < num_gpus <= 1:
        return {}
    actors = math.floor(1 / num_gpus + 1e-9)
    per_actor = row["peak_cuda_mb"] if not math.isnan(row["peak_cuda_mb"]) else row["estimate_mb"]
    return {
        "num_gpus_per_actor": num_gpus,
        "actors_per_gpu": actors,
        "gpu_mb_for_actors": actors * (per_actor + CUDA_CONTEXT_MB),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_args(parser, "simulations/benchmarks/results/resnet_round", data_root=False)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--model", default="resnet18-cifar", help="resnet18-cifar or -gn")
    parser.add_argument("--clients", type=int, default=10, help="clients timed (default 10)")
    parser.add_argument("--samples", type=int, default=500, help="samples per client")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument(
        "--num-gpus", type=float, default=0.25, help="GPU fraction per actor (as fedunlearn-run's)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    load_start = os.getloadavg()[0]
    row = run_round(args, device)
    row |= gpu_sharing(row, args.num_gpus)
    table = pd.DataFrame([row])
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = f"resnet_round_{device.type}"
    table.to_csv(args.output_dir / f"{stem}.csv", index=False)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    header = (
        f"One FedAvg round of {args.model} per client on {where}, {torch.get_num_threads()} CPU "
        f"thread(s); median of {args.clients} clients after a warm-up; 1-min load average "
        f"{load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end. median_cpu_s: the process's "
        "CPU seconds (less sensitive than wall time to other processes). The *_mb columns other than "
        "peak_cuda_mb and peak_rss_mb are estimates from tensor sizes.\n\n"
    )
    markdown = pd.DataFrame(
        [
            (key, f"{value:.2f}" if isinstance(value, float) else value)
            for key, value in row.items()
        ],
        columns=["", "value"],
    ).to_markdown(index=False)
    (args.output_dir / f"{stem}.md").write_text(header + markdown + "\n")
    print(header + markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
