"""The ServerApp's own CPU threads: one, unless ``OMP_NUM_THREADS`` says otherwise.

The server's tensor work per round is on tensors of one model's size (reply checks, FedAvg, update
norms, the store's checksums and finiteness checks) plus one test-set evaluation. In a simulation
the client workers keep every core busy, and PyTorch's default of one intra-op thread per core
then makes each small operation wait for a second thread that has no core: measured on the 2-core
CI machine under a simulation's load, ``torch.isfinite(x).all()`` on an MNIST-CNN-sized tensor
took 6-19 ms with 2 threads against 1.6-2.0 ms with 1, and a 10,000-image evaluation 5.9-7.1 s
against 4.5-4.9 s. ``OMP_NUM_THREADS``, the standard knob,
wins when set (a deployed server with cores of its own).
"""

from __future__ import annotations

import os

import torch

#: The ServerApp's intra-op threads when ``OMP_NUM_THREADS`` is not set.
DEFAULT_SERVER_THREADS = 1


def use_server_threads() -> int:
    """Set this process's PyTorch intra-op threads for the ServerApp (``OMP_NUM_THREADS`` when it
    holds a positive integer, else :data:`DEFAULT_SERVER_THREADS`); returns the number set."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    threads = int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_SERVER_THREADS
    torch.set_num_threads(threads)
    return threads
