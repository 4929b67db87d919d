"""Server memory flat in the number of clients: the scale benchmark over K and the
fraction of clients a round trains.

Runs :mod:`simulations.benchmarks.scale` once per setting ``K:fraction:rounds`` on MNIST
(``simulations/scale_mnist_1000.toml``: 1 local epoch, norms-only retention at every round, then
FedEraser forgets client 0), each in its own output folder, then writes ``scale_matrix.csv``/``.md``
(one row per setting: the ServerApp's RSS between rounds, its peak within a round and their ratio,
FedEraser's peak per step, the process tree's sampled peak, wall time per round and per client
update) and ``scale_matrix.png`` (each setting's between-round RSS and in-round peak, round by
round) and ``scale_against_k.png`` (the ServerApp's memory and the seconds against K). The claim
it measures: the peak within a round does not grow with K.

``--tile-mnist COPIES`` trains on COPIES copies of MNIST's 60,000 training images, one image a
client (``train-samples`` = K), so that K above 60,000 is possible and every K of a matrix trains the
same amount per client; ``--per-client-costs NODES`` also times and weighs, in this process,
Flower's registration of NODES nodes, one pass of its engine over them (as Flower has it and
indexed) and the partitioning (``per_client_costs.csv``/``.md``).

Usage (the settings of RESULTS.md; about 90 minutes on 2 cores)::

    python -m simulations.benchmarks.scale_matrix --data-root PATH \\
        --output-dir simulations/benchmarks/results/scale-matrix \\
        --settings 1000:1.0:3 1000:0.1:5 10000:0.1:20 10000:1.0:2

The same 1,000 clients a round at K = 1,000, 10,000 and 100,000 (issue 45; 100,000 took about an
hour on 2 shared cores; the table and figure of the three are rebuilt by ``--summarize-only``)::

    python -m simulations.benchmarks.scale_matrix --data-root PATH --tile-mnist 2 \\
        --output-dir OUT --settings 100000:0.01:20 \\
        --set node-wait-seconds=7200 --set reply-timeout=14400
    python -m simulations.benchmarks.scale_matrix --data-root PATH --tile-mnist 2 \\
        --output-dir OUT --settings 1000:1.0:5 10000:0.1:5 \\
        --set node-wait-seconds=7200 --set reply-timeout=14400
    python -m simulations.benchmarks.scale_matrix --data-root PATH --tile-mnist 2 \\
        --output-dir OUT --summarize-only --per-client-costs 100000 \\
        --settings 1000:1.0:5 10000:0.1:5 100000:0.01:20

Run it alone, or in a network namespace of its own beside anything else that starts a SuperLink.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from simulations.benchmarks import scale  # noqa: E402
from simulations.run_parser import PROJECT_ROOT  # noqa: E402

CONFIG = PROJECT_ROOT / "simulations" / "scale_mnist_1000.toml"


def setting(text: str) -> tuple[int, float, int]:
    """``K:fraction:rounds`` -> (K, fraction, rounds), each checked."""
    try:
        clients, fraction, rounds = text.split(":")
        parsed = int(clients), float(fraction), int(rounds)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--settings: {text!r} is not K:fraction:rounds (e.g. 10000:0.1:20)"
        ) from None
    if parsed[0] < 2 or not 0 < parsed[1] <= 1 or parsed[2] < 1:
        raise argparse.ArgumentTypeError(
            f"--settings: {text!r} needs K >= 2, a fraction in (0, 1] and rounds >= 1"
        )
    return parsed


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", required=True, help="dataset root holding MNIST")
    parser.add_argument("--output-dir", type=Path, required=True, help="where the tables go")
    parser.add_argument(
        "--settings", nargs="+", type=setting, required=True, help="K:fraction:rounds ..."
    )
    parser.add_argument(
        "--tile-mnist",
        type=int,
        metavar="COPIES",
        help="train on COPIES copies of MNIST's training images, one a client (scale --tile-mnist)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one key"
    )
    parser.add_argument("--note", default="", help="a second title line for scale_against_k.png")
    parser.add_argument(
        "--per-client-costs",
        type=int,
        metavar="NODES",
        help="also time and weigh Flower's node registration and the partitioning at NODES "
        "clients, in this process (per_client_costs.csv/.md)",
    )
    parser.add_argument(
        "--summarize-only", action="store_true", help="rebuild the tables from earlier runs"
    )
    parser.add_argument(
        "--reference-peak-mb",
        type=float,
        help="a peak to draw for comparison (e.g. the in-round peak before streaming aggregation)",
    )
    parser.add_argument(
        "--reference-label", default="reference peak", help="what --reference-peak-mb is"
    )
    return parser.parse_args(argv)


def rss() -> int:
    """This process's resident memory, bytes, after a garbage collection."""
    import gc

    import psutil

    gc.collect()
    return psutil.Process().memory_info().rss


def flower_registration(nodes: int) -> dict:
    """What Flower's simulation runtime does per node before the first message, timed and
    weighed in this process: ``_register_nodes`` (the link state's node records) and
    ``_register_node_info_stores`` (each node's run store and Context; with this app's folder,
    as a run from a FAB has it, each node's Context reads and checks its pyproject.toml)."""
    from flwr.server.superlink.fleet.vce.vce_api import _register_node_info_stores, _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    factory.state()
    before, started = rss(), time.perf_counter()
    mapping = _register_nodes(nodes, factory)
    registered, after_nodes = time.perf_counter(), rss()
    stores = _register_node_info_stores(mapping, Run.create_empty(run_id=1), str(PROJECT_ROOT))
    done, after_stores = time.perf_counter(), rss()
    assert len(stores) == nodes
    return {
        "link_state_node_seconds": (registered - started) / nodes,
        "link_state_node_bytes": (after_nodes - before) / nodes,
        "node_context_seconds": (done - registered) / nodes,
        "node_context_bytes": (after_stores - after_nodes) / nodes,
    }


def engine_pass(nodes: int, in_flight: int = 32) -> dict:
    """One pass of Flower's simulation engine over ``nodes`` registered nodes with ``in_flight``
    messages stored (``add_messages_to_queue``: each node's ``get_message_ins``), timed as Flower
    has it and with :mod:`server.federation.message_index`; per node."""
    from flwr.app import Message, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    from server.federation import message_index

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
    seconds = {}
    lookups = {
        "flower": message_index.FLOWER_GET_MESSAGE_INS,
        "indexed": message_index.get_message_ins_indexed,
    }
    for variant, get_message_ins in lookups.items():
        factory = LinkStateFactory(
            FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
        )
        state = factory.state()
        run = Run.create_empty(run_id=1)
        run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
        state.run_ids[1] = RunRecord(run=run)
        state.task_store[1] = Task(task_id=1, run_id=1)
        node_ids = list(_register_nodes(nodes, factory))
        grid = InMemoryGrid(state_factory=factory)
        grid.set_run(run)
        step = max(nodes // in_flight, 1)
        targets = node_ids[::step][:in_flight]
        grid.push_messages([Message(RecordDict(), n, "train", group_id="1") for n in targets])
        started = time.perf_counter()
        got = sum(len(get_message_ins(state, n, 1)) for n in node_ids)
        seconds[variant] = time.perf_counter() - started
        assert got == len(targets)
    return {
        "engine_pass_seconds_flower": seconds["flower"] / nodes,
        "engine_pass_seconds_indexed": seconds["indexed"] / nodes,
    }


def partitioning(clients: int, copies: int) -> dict:
    """Every party's split of the tiled MNIST labels over ``clients`` (one sample each), timed and
    weighed: ``training_pool`` then ``partition_indices``, as ``load_federated_data`` calls them."""
    import numpy as np

    from fedunlearn.data.federated_data import training_pool
    from fedunlearn.data.partitioning import partition_indices

    labels = np.tile(np.arange(10), 6000 * copies)
    before, started = rss(), time.perf_counter()
    pool = training_pool(len(labels), clients, seed=0)
    parts = tuple(pool[part] for part in partition_indices(labels[pool], clients, seed=0))
    seconds, after = time.perf_counter() - started, rss()
    assert len(parts) == clients
    return {"partition_seconds": seconds / clients, "partition_bytes": (after - before) / clients}


def per_client_costs(nodes: int, copies: int) -> pd.DataFrame:
    """:func:`flower_registration`, :func:`partitioning` and :func:`engine_pass` at ``nodes``,
    one row per cost."""
    costs = {**flower_registration(nodes), **partitioning(nodes, copies), **engine_pass(nodes)}
    return pd.DataFrame(
        [{"measured_at": nodes, "cost": key, "per_client": value} for key, value in costs.items()]
    )


def folder(output: Path, clients: int, fraction: float, rounds: int) -> Path:
    return output / f"k{clients}-f{fraction:g}-r{rounds}"


def run_setting(args, clients: int, fraction: float, rounds: int) -> int:
    """One scale run; its outputs in :func:`folder`."""
    return scale.main(
        [
            str(CONFIG),
            "--clients", str(clients),
            "--rounds", str(rounds),
            "--warmup-rounds", "0",
            "--data-root", args.data_root,
            "--output-dir", str(folder(args.output_dir, clients, fraction, rounds)),
            "--set", f"fraction-train={fraction}",
            "--set", "min-train-clients=2",
            "--set", "node-wait-seconds=1800",
            *(["--tile-mnist", str(args.tile_mnist)] if args.tile_mnist else []),
            *[x for item in args.set for x in ("--set", item)],
        ]
    )  # fmt: skip


def row(output: Path, clients: int, fraction: float, rounds: int) -> dict | None:
    """The setting's line of the table (None when it has not run)."""
    path = folder(output, clients, fraction, rounds) / "scale_summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    run = Path(summary.get("run_directory", "") or "missing")
    if run.is_dir():  # the calibration count of a sampled run, read again from its history
        summary.update(scale.unlearning_costs(run, clients, 1))
    between = summary["server_rss_mb_between_rounds_max"]
    peak = summary["server_round_peak_rss_mb_max"]
    return {
        "clients": clients,
        "fraction_train": fraction,
        "rounds": rounds,
        "updates_per_round": max(int(clients * fraction), 2),
        "rss_between_rounds_max_mb": between,
        "round_peak_rss_max_mb": peak,
        "peak_over_between": round(peak / between, 3),
        "federaser_step_peak_max_mb": summary.get("federaser_peak_rss_mb", float("nan")),
        "federaser_peak_over_between": round(
            summary.get("federaser_peak_rss_mb", float("nan")) / between, 3
        ),
        "process_tree_peak_mb": round(summary["process_tree_peak_rss_mb_sampled"], 1),
        "mean_round_wall_s": round(summary["mean_round_wall_seconds_after_round_1"], 2),
        "s_per_client_update": round(summary["mean_seconds_per_update_after_round_1"], 4),
        "federaser_s": summary.get("federaser_seconds", float("nan")),
        "s_per_calibration_update": summary.get("seconds_per_calibration_update", float("nan")),
        "run_seconds": summary["seconds"],
        "setup_s": before_round_1(run)[0],
        "setup_peak_rss_mb": before_round_1(run)[1],
        "store_bytes_after_training": summary.get("store_bytes_after_training", float("nan")),
    }


def before_round_1(run: Path) -> tuple[float, float]:
    """The ServerApp's seconds and peak RSS from its start to round 0's evaluation: the data,
    Flower's node registration (which runs beside it), Ray's start and discovery (every node
    describes itself); ``metrics.csv``'s round 0 row, NaN when the run is not there."""
    path = run / "metrics.csv"
    if not path.is_file():
        return float("nan"), float("nan")
    first = pd.read_csv(path).query("round == 0")
    if not len(first):
        return float("nan"), float("nan")
    return float(first["elapsed_seconds"].iloc[0]), float(first["server_round_peak_rss_mb"].iloc[0])


def plot_against_k(table: pd.DataFrame, path: Path, note: str = "") -> None:
    """The ServerApp's memory (left) and the seconds (right) against K, one point per setting."""
    fig, (memory, seconds) = plt.subplots(1, 2, figsize=(11, 4.5))
    k = table["clients"]
    memory.plot(k, table["round_peak_rss_max_mb"], "^-", label="peak within a training round")
    memory.plot(k, table["rss_between_rounds_max_mb"], "o-", label="between rounds (after each)")
    memory.plot(k, table["federaser_step_peak_max_mb"], "s--", label="FedEraser, peak per step")
    memory.plot(k, table["setup_peak_rss_mb"], "x:", label="before round 1 (data, discovery)")
    memory.set_ylabel("ServerApp RSS (MiB)")
    memory.set_ylim(bottom=0)
    seconds.plot(k, table["mean_round_wall_s"], "o-", label="a training round (after round 1)")
    steps = table["federaser_s"] / table["rounds"]  # FedEraser takes a step per retained round
    seconds.plot(k, steps, "s--", label="a FedEraser step (its wall time / steps)")
    seconds.plot(k, table["setup_s"], "x:", label="start to round 0: registration, Ray, discovery")
    seconds.set_ylabel("wall seconds (2 shared cores)")
    seconds.set_yscale("log")
    for ax in (memory, seconds):
        ax.set_xscale("log")
        ax.set_xlabel("K, clients in the federation (log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    sizes = sorted(set(table["updates_per_round"]))
    per_round = (
        f"the same {sizes[0]:,} clients a round at every K"
        if len(sizes) == 1
        else ", ".join(f"K = {c:,}: {u:,} a round" for c, u in zip(k, table["updates_per_round"]))
    )
    title = f"ServerApp memory and time against K ({per_round})"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(output: Path, settings, reference: float | None = None, label: str = "") -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if reference is not None:
        ax.axhline(reference, color="grey", ls="--", label=f"{label}: {reference:,.0f} MiB")
    for clients, fraction, rounds in settings:
        table = folder(output, clients, fraction, rounds) / "scale.csv"
        if not table.is_file():
            continue
        rounds_table = pd.read_csv(table)
        label = f"K = {clients:,}, fraction {fraction:g}"
        line = ax.plot(rounds_table["round"], rounds_table["server_round_peak_rss_mb"], "^-")
        ax.plot(
            rounds_table["round"],
            rounds_table["server_rss_mb"],
            "o:",
            color=line[0].get_color(),
            label=f"{label}: peak within the round (▲), after it (●)",
        )
    ax.set_xlabel("training round")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("ServerApp RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title("ServerApp memory within and between rounds (MNIST, norms retention)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output / "scale_matrix.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.per_client_costs:
        costs = per_client_costs(args.per_client_costs, args.tile_mnist or 1)
        costs.to_csv(args.output_dir / "per_client_costs.csv", index=False)
        (args.output_dir / "per_client_costs.md").write_text(costs.to_markdown(index=False) + "\n")
        print(costs.to_markdown(index=False), flush=True)
    for clients, fraction, rounds in args.settings:
        if args.summarize_only or row(args.output_dir, clients, fraction, rounds) is not None:
            continue
        print(f"=== K = {clients}, fraction-train = {fraction}, {rounds} rounds", flush=True)
        code = run_setting(args, clients, fraction, rounds)
        if code != 0:
            print(f"the setting {clients}:{fraction}:{rounds} failed ({code})", file=sys.stderr)
    rows = [r for s in args.settings if (r := row(args.output_dir, *s)) is not None]
    if not rows:
        print("no setting has run yet", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows)
    table.to_csv(args.output_dir / "scale_matrix.csv", index=False)
    (args.output_dir / "scale_matrix.md").write_text(table.to_markdown(index=False) + "\n")
    plot(args.output_dir, args.settings, args.reference_peak_mb, args.reference_label)
    plot_against_k(table, args.output_dir / "scale_against_k.png", args.note)
    print(table.to_markdown(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
