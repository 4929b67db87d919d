"""``fedunlearn-run --engine local``: a simulated federation in worker processes of one command,
without a SuperLink and without Ray.

``flwr run`` (the default engine) starts the ``flwr`` CLI, a local SuperLink, ``flwr-simulation``,
Ray and one ClientApp actor per CPU before the first round, then discovers the nodes: about 20 s
of the main job's 45 on 2 cores (``simulations/benchmarks/start_cost.py``). The local engine
serves the same ServerApp on a grid of its own, :class:`LocalGrid`, through Flower's ``Grid``
interface (push, pull, send-and-receive of ``Message`` objects). Its nodes answer with the app's
ClientApp, exactly as a simulated SuperNode does:

* node ``FIRST_NODE + k`` holds partition ``k`` of ``K`` (``node_config``: ``partition-id``,
  ``num-partitions``, as Flower's simulation sets them) and keeps its ``Context`` (``state``) from
  one message to the next;
* its reply is what the ClientApp returns, or an error reply when the ClientApp raised (as a
  SuperNode reports a failed ClientApp); a message to a node the federation does not hold gets
  an error reply too, never a silent drop;
* both apps are loaded from the app folder's ``[tool.flwr.app.components]`` and the run config is
  the app's defaults fused with the run's keys, with Flower's own functions.

The nodes live in ``W`` worker processes (``--num-cpus`` CPUs of the machine per worker, like
Ray's client resources; node ``k`` always in worker ``k mod W``, so its state stays with it), each
with ``--num-cpus`` PyTorch threads. ``W`` = 0 answers in the server's own process, one message at
a time (the tests' federation). The workers start while the ServerApp loads its data, so their
imports overlap the server's.

What the engine is not: a deployment (no transport, no TLS, no authentication: every party is
this command's own code) or a Ray cluster. The ServerApp does not know which engine serves it, so
its guarantees (the forgotten client receives no message after training, a reply is checked
before it is used) hold on both; `tests/federation/test_local_engine.py` runs the main job on both
and compares the models, bit for bit.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import queue
import signal
import sys
import time
import tomllib
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run

#: The first node id; node ``FIRST_NODE + k`` holds partition ``k``.
FIRST_NODE = 100
#: The error code a SuperNode reports when its ClientApp raised (Flower's ``ErrorCode``).
CLIENT_APP_RAISED_AN_EXCEPTION = 2
#: The run id the local engine gives its one run.
LOCAL_RUN_ID = 1


@contextmanager
def flower_task_identity(run_id: int = LOCAL_RUN_ID, node_id: int = 0) -> Iterator[None]:
    """Flower stamps each new Message with the run and node it belongs to, which its runtime
    sets for a ServerApp or ClientApp process; outside that runtime, set them (run ``run_id``,
    node ``node_id``: 0 is the server) and restore what was there."""
    from flwr.supercore.task_identity import TaskIdentity

    previous = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, node_id
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = previous


def node_context(partition: int, num_nodes: int, run_config: Mapping[str, Any]) -> Context:
    """The Context Flower's simulation gives node ``FIRST_NODE + partition``."""
    return Context(
        run_id=LOCAL_RUN_ID,
        node_id=FIRST_NODE + partition,
        node_config={"partition-id": partition, "num-partitions": num_nodes},
        state=RecordDict(),
        run_config=dict(run_config),
    )


def error_reply(message: Message, reason: str) -> Message:
    """The reply a SuperNode sends when its ClientApp could not answer ``message``."""
    return Message(Error(CLIENT_APP_RAISED_AN_EXCEPTION, reason), reply_to=message)


def answer(client_app, contexts: Mapping[int, Context], message: Message) -> Message:
    """``client_app``'s reply to ``message`` in the Context of its destination node (an error
    reply when the node is not in ``contexts`` or the ClientApp raised)."""
    node = message.metadata.dst_node_id
    if node not in contexts:
        return error_reply(message, f"no node {node} in this federation")
    try:
        return client_app(message, contexts[node])
    except Exception as error:  # what a SuperNode sends when its ClientApp raised
        return error_reply(message, f"{type(error).__name__}: {error}")


def fused_run_config(app_dir: Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The run config Flower gives a run of the app in ``app_dir``: its
    ``[tool.flwr.app.config]`` defaults with ``overrides`` on top (Flower's own function)."""
    from flwr.common.config import get_fused_config_from_dir

    return dict(get_fused_config_from_dir(Path(app_dir), dict(overrides)))


def load_component(app_dir: Path, which: str):
    """The ``serverapp`` or ``clientapp`` object that the app folder's pyproject names (Flower's
    own loader, which puts the folder on the import path)."""
    from flwr.common.config import get_project_config
    from flwr.supercore.object_ref import load_app

    reference = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"][which]
    return load_app(reference, RuntimeError, Path(app_dir))


def warm_up() -> None:
    """Import now what a ClientApp's first training round would: PyTorch imports its compiler
    (``torch._dynamo``, about 1 s of CPU) the first time an optimizer is built. The launcher
    does it once before it forks (every fork inherits it); a spawned worker does it itself while
    the server validates, loads its data and evaluates round 0."""
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)


def _serve_worker(
    app_dir: str,
    run_config: Mapping[str, Any],
    num_nodes: int,
    partitions: Sequence[int],
    threads: int,
    inbox,
    outbox,
    parent: int,
    visible_gpus: str,
) -> None:
    """A worker process: the GPUs it may see (``visible_gpus``, ``CUDA_VISIBLE_DEVICES``'s
    value: "" for none, as Ray hides the GPUs from a client without a GPU share), its PyTorch
    threads, the ClientApp and the Contexts of the nodes it holds; then ``(message id, reply)``
    on ``outbox`` for each ``(message id, message)`` from ``inbox``, until None arrives."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle, not ours
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpus  # before CUDA starts in this process
    import torch

    torch.set_num_threads(threads)
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, LOCAL_RUN_ID, 0
    client_app = load_component(Path(app_dir), "clientapp")
    contexts = {FIRST_NODE + k: node_context(k, num_nodes, run_config) for k in partitions}
    warm_up()
    while (task := _next_task(inbox, parent)) is not None:
        message_id, message = task
        outbox.put((message_id, answer(client_app, contexts, message)))


def _next_task(inbox, parent: int):
    """The next ``(message id, message)`` from ``inbox``; None when the engine said stop or is
    gone (a worker never outlives the process that started it, even a killed one)."""
    while True:
        try:
            return inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


class LocalGrid(Grid):
    """Flower's ``Grid`` over ``num_nodes`` nodes answering with the ClientApp in ``workers``
    processes (0: in this process, when the message is pushed).

    Parameters
    ----------
    run_config : mapping
        The run config every node's Context holds.
    num_nodes : int
        The federation's size K.
    workers : int (default: 0)
        Worker processes; node ``k`` is served by worker ``k mod workers``. At most ``num_nodes``.
    threads : int (default: 1)
        PyTorch threads per worker.
    gpu : bool (default: False)
        Whether the workers see a GPU: worker ``w`` sees GPU ``w mod G`` of the G this machine
        shows (:func:`visible_gpus`); without, none, so a client trains on the CPU as it does in
        Flower's simulation without ``--num-gpus``.
    client_app : ClientApp, optional
        The ClientApp answering in this process (no workers); default: the one ``app_dir``'s
        pyproject names.
    app_dir : path, optional
        The Flower App folder (the workers load the ClientApp from it).
    """

    #: Messages the ServerApp keeps pushed but unanswered (``server.federation.queries``): the
    #: workers' queues hold no more, and the server pulls every 0.05 s instead of backing off.
    in_flight_window = 32

    def __init__(
        self,
        run_config: Mapping[str, Any],
        num_nodes: int,
        workers: int = 0,
        *,
        threads: int = 1,
        gpu: bool = False,
        client_app=None,
        app_dir: Path | None = None,
    ) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes: {num_nodes!r}; allowed: an integer >= 1")
        if workers < 0:
            raise ValueError(f"workers: {workers!r}; allowed: an integer >= 0")
        self.run_config, self.num_nodes = dict(run_config), num_nodes
        self.workers = min(workers, num_nodes)
        self._run = Run.create_empty(LOCAL_RUN_ID)
        self._replies: dict[str, Message] = {}
        # a message sent to a worker and not answered yet: message id -> (worker, message)
        self._pending: dict[str, tuple[int, Message]] = {}
        self._processes: list = []
        if self.workers == 0:
            self.app = client_app or load_component(Path(app_dir or "."), "clientapp")
            self.contexts = {
                FIRST_NODE + k: node_context(k, num_nodes, self.run_config)
                for k in range(num_nodes)
            }
        else:
            self._start_workers(app_dir, threads, gpu)

    def _start_workers(self, app_dir: Path | None, threads: int, gpu: bool) -> None:
        """The worker processes, all started before this process has a thread of its own (a
        queue's feeder thread starts with its first message): forked where the platform can,
        so they inherit the modules (and the data already loaded) of this process; worker ``w``
        holds partitions ``w, w + W, ...``. Each loads the ClientApp and warms up
        (:func:`warm_up`) at once, while this process goes on."""
        if app_dir is None:
            raise ValueError("app_dir: None; allowed: the app folder the workers load from")
        context = multiprocessing.get_context("fork" if fork_is_safe() else "spawn")
        gpus = visible_gpus() if gpu else []
        if gpu and not gpus:
            raise ValueError("gpu: True; allowed: False on a machine that shows no NVIDIA GPU")
        self._outbox = context.Queue()
        self._inboxes = [context.Queue() for _ in range(self.workers)]
        sys.stdout.flush()
        sys.stderr.flush()
        for index, inbox in enumerate(self._inboxes):
            partitions = list(range(index, self.num_nodes, self.workers))
            process = context.Process(
                target=_serve_worker,
                args=(
                    str(app_dir),
                    self.run_config,
                    self.num_nodes,
                    partitions,
                    self._threads(threads),
                    inbox,
                    self._outbox,
                    os.getpid(),
                    gpus[index % len(gpus)] if gpus else "",
                ),
                name=f"fedunlearn-local-worker-{index}",
                daemon=True,
            )
            process.start()
            self._processes.append(process)

    @staticmethod
    def _threads(threads: int) -> int:
        if threads < 1:
            raise ValueError(f"threads: {threads!r}; allowed: an integer >= 1")
        return threads

    # -- Flower's Grid ------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(range(FIRST_NODE, FIRST_NODE + self.num_nodes))

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Each message gets an id (as Flower's grid gives it) and goes to its node's worker, or
        is answered here (no workers)."""
        ids = []
        for message in messages:
            if message.metadata.reply_to_message_id:
                raise ValueError("messages: a reply; allowed: messages to a node")
            message_id = str(uuid4())
            message.metadata.__dict__["_message_id"] = message_id  # as Flower's grid stamps it
            if self.workers == 0:
                reply = self.answer(message)
                if reply is not None:
                    self._replies[message_id] = reply
            else:
                worker = (message.metadata.dst_node_id - FIRST_NODE) % self.workers
                self._pending[message_id] = (worker, message)
                self._inboxes[worker].put((message_id, message))
            ids.append(message_id)
        return ids

    def answer(self, message: Message) -> Message | None:
        """The reply to ``message`` in this process (no workers); a subclass may lose, delay or
        change it (None: no reply)."""
        return answer(self.app, self.contexts, message)

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies that arrived for ``message_ids``, each handed over once."""
        self._receive(timeout=0.0)
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        """Push ``messages``, wait for their replies (at most ``timeout`` seconds), pull them."""
        ids = self.push_messages(messages)
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(i in self._pending for i in ids):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._receive(timeout=min(left if left is not None else 1.0, 1.0))
        return self.pull_messages(ids)

    def _receive(self, timeout: float) -> None:
        """Move the workers' replies to the arrived ones (waiting up to ``timeout`` seconds for
        the first); a worker that died answers each of its pending messages with an error."""
        if not self._pending:
            return
        try:
            item = self._outbox.get(timeout=timeout) if timeout > 0 else self._outbox.get_nowait()
            while True:
                message_id, reply = item
                if self._pending.pop(message_id, None) is not None:
                    self._replies[message_id] = reply
                item = self._outbox.get_nowait()
        except queue.Empty:
            pass
        self._answer_for_dead_workers()

    def _answer_for_dead_workers(self) -> None:
        dead = {w: p.exitcode for w, p in enumerate(self._processes) if not p.is_alive()}
        for message_id, (worker, message) in list(self._pending.items()):
            if worker in dead:
                del self._pending[message_id]
                self._replies[message_id] = error_reply(
                    message, f"local worker {worker} died (exit code {dead[worker]})"
                )

    def close(self) -> None:
        """Stop the worker processes (what they still had queued is dropped)."""
        for inbox in getattr(self, "_inboxes", []):
            inbox.put(None)
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
        self._processes = []

    def __enter__(self) -> LocalGrid:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def visible_gpus(environ: Mapping[str, str] | None = None, dev: Path = Path("/dev")) -> list[str]:
    """The NVIDIA GPUs this process may use, found without starting CUDA: the entries of
    ``CUDA_VISIBLE_DEVICES`` when it is set, else the machine's ``/dev/nvidiaN`` devices."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [g.strip() for g in environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    found = (p.name[len("nvidia") :] for p in dev.glob("nvidia*"))
    return sorted((n for n in found if n.isdigit()), key=int)


def fork_is_safe() -> bool:
    """Whether the workers (and the launcher's engine) may be forks of this process: a platform
    that forks (Linux) and no NVIDIA GPU to see. A process that asked CUDA anything (even
    ``torch.cuda.is_available()``) leaves its forks unable to use it, so on a GPU machine they
    are fresh processes instead (spawned: each imports PyTorch and the apps itself)."""
    return sys.platform.startswith("linux") and not visible_gpus()


def worker_count(
    num_cpus: float,
    num_nodes: int,
    cpus: int | None = None,
    num_gpus: float = 0.0,
    gpus: int | None = None,
) -> int:
    """Worker processes for ``num_cpus`` CPUs (and ``num_gpus`` of a GPU) each, on a machine of
    ``cpus`` CPUs and ``gpus`` GPUs (default: this one's), as Ray fits its client actors:
    floor(cpus / num_cpus), capped by floor(gpus / num_gpus); at least 1, at most ``num_nodes``."""
    if not num_cpus > 0:
        raise ValueError(f"num_cpus: {num_cpus!r}; allowed: a number > 0")
    if not 0 <= num_gpus <= 1:
        raise ValueError(f"num_gpus: {num_gpus!r}; allowed: a GPU fraction in [0, 1]")
    cpus = cpus or len(os.sched_getaffinity(0))
    fit = math.floor(cpus / num_cpus)
    if num_gpus > 0:
        gpus = len(visible_gpus()) if gpus is None else gpus
        if gpus == 0:
            raise ValueError(f"num_gpus: {num_gpus!r}; allowed: 0 on a machine without a GPU")
        fit = min(fit, math.floor(gpus / num_gpus))
    return max(1, min(num_nodes, fit))


def serve_locally(
    app_dir: Path,
    overrides: Mapping[str, Any],
    num_nodes: int,
    workers: int,
    threads: int = 1,
    gpu: bool = False,
) -> None:
    """Run the app's ServerApp over :class:`LocalGrid` of ``num_nodes`` nodes in ``workers``
    processes, with the app's run config fused with ``overrides``."""
    run_config = fused_run_config(app_dir, overrides)
    context = Context(
        run_id=LOCAL_RUN_ID, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    # the workers first: they load the ClientApp and warm up while the ServerApp is imported
    grid = LocalGrid(run_config, num_nodes, workers, threads=threads, gpu=gpu, app_dir=app_dir)
    with grid:
        server_app = load_component(app_dir, "serverapp")
        with flower_task_identity():
            server_app(grid, context)


def parser() -> argparse.ArgumentParser:
    """The engine's own command line (``fedunlearn-run --engine local`` builds it)."""
    p = argparse.ArgumentParser(prog="python -m simulations.local_engine", description=__doc__)
    p.add_argument("--app", type=Path, required=True, help="the Flower App folder")
    p.add_argument("--run-config", type=Path, required=True, help="flat run-config TOML")
    p.add_argument("--num-clients", type=int, required=True, help="the federation's size K")
    p.add_argument("--workers", type=int, required=True, help="worker processes (0: none)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch threads per worker")
    p.add_argument("--gpu", action="store_true", help="the workers see the machine's GPUs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one run; exit 0 when the ServerApp returned, 1 when it raised (the traceback on
    standard error, after the app's own ``[fedunlearn] error:`` line when it refused)."""
    args = parser().parse_args(argv)
    overrides = tomllib.loads(args.run_config.read_text(encoding="utf-8"))
    print(
        f"Local engine: {args.num_clients} clients in {args.workers} worker process(es)", flush=True
    )
    try:
        serve_locally(
            args.app.resolve(), overrides, args.num_clients, args.workers, args.threads, args.gpu
        )
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
