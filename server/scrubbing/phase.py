"""Scrubbing the federated model (Golatkar et al., *Eternal Sunshine of the Spotless Net*): the
server-side plug-in's orchestration and its statistics query.

After training, the cohort D_f named by ``scrub-forget`` (a class across clients, samples of a client,
or a whole client) is forgotten by every method in ``scrub-methods``, each an entry of
:data:`fedunlearn.registry.SCRUBBING` (Newton, forget-only Newton and finite-time scrubs of the
head, Fisher forgetting, Section 5.2's baselines; their server side is :mod:`server.scrubbing.methods`,
their math :mod:`fedunlearn.scrubbing.scrubbers`), run by the shared
:class:`server.method_runner.MethodRunner` after ``retrain`` (FedRetrain without D_f, from the same
initial weights and seed: the reference); ``original`` is the trained model. The clients compute the
sums the scrubs need at the model the server sends (``query.scrub_stats``,
``clients/scrub_queries.py``), asked through :class:`ScrubStatistics`.

Readouts (Section 5.3, :mod:`server.scrubbing.readouts`): error on D_test, D_f and D_r; relearn time;
output-entropy histograms; the information bound (Proposition 2) over a lambda grid with the error
it costs (the paper's Fig. 2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedunlearn.certified.curvature import head_matrix
from fedunlearn.console_table import SCRUBBING_COLUMNS, console_table
from fedunlearn.data.federated_data import run_settings
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.messages import SCRUB_QUERY
from fedunlearn.preflight import cohort_masks
from fedunlearn.progress import Progress
from fedunlearn.registry import SCRUBBING
from fedunlearn.reply_checks import (
    RefusedReply,
    check_array_specs,
    check_count,
    check_finite_arrays,
    check_metrics,
    check_partition,
    decoded_arrays,
)
from fedunlearn.scrubbing.readout_figures import (
    plot_entropy_histograms,
    plot_information_tradeoff,
    plot_relearn_times,
)
from fedunlearn.store.run_directory import SCRUBBING_LOG
from server.federation.missing import MissingClients
from server.federation.queries import QueryFailedError, query_nodes
from server.method_runner import MethodRunner, SharedStatistics
from server.progress import Log
from server.scrubbing.methods import ScrubContext, retrain
from server.scrubbing.readouts import information_tradeoff, readout_data, readouts
from server.training.rounds import TrainingOutcome


class ScrubStatistics:
    """Asks clients for sums over their D_r / D_f at a model, checks every reply, adds them up.

    A reply is refused (the query fails, naming the node and the reason; nothing is summed) unless
    it holds exactly the sums asked for, with the shapes the model implies, finite, and counts
    equal to the sizes of the client's D_r / D_f that the server computes from the run config
    (``masks``; capped at ``max-samples`` for the Fisher).
    """

    def __init__(
        self,
        grid: Grid,
        outcome: TrainingOutcome,
        forget: ForgetSet,
        masks: Mapping[int, np.ndarray],
        log: Log | None = None,
    ) -> None:
        self.grid = grid
        self.timeout = outcome.config.reply_timeout
        self.log = log
        self.members = outcome.members
        self.node_of = dict(outcome.members.node_of_partition)
        self.forget = forget
        self.masks = masks
        self.settings = run_settings(outcome.config)
        self.parameters = {
            name: tuple(tensor.shape) for name, tensor in outcome.new_model().named_parameters()
        }
        self.messages = 0

    def ask(
        self,
        op: str,
        state: Mapping[str, torch.Tensor],
        parts: Sequence[str],
        partitions: Sequence[int],
        **config,
    ) -> dict[str, dict]:
        """``{part: {"count": n, name: summed array}}`` over ``partitions``."""
        record = {"op": op, "parts": list(parts), "forget": str(self.forget), **config}
        messages = [
            Message(
                content=RecordDict(
                    {
                        "config": ConfigRecord({**record, **self.settings}),
                        "model": ArrayRecord(dict(state)),
                    }
                ),
                dst_node_id=self.node_of[p],
                message_type=SCRUB_QUERY,
            )
            for p in partitions
        ]
        asked = {self.node_of[p]: p for p in partitions}
        replies = query_nodes(
            self.grid, messages, op=op, who="scrubbing", timeout=self.timeout,
            partition_of=asked, log=self.log,
        )  # fmt: skip
        self.messages += len(messages)
        totals: dict[str, dict] = {part: {"count": 0} for part in parts}
        # summed in partition order, so the totals do not depend on the order replies arrive in
        for node, reply in sorted(replies.items(), key=lambda item: asked[item[0]]):
            partition = asked[node]
            counts, arrays = self._checked(reply, partition, op, parts, state, config)
            for part in parts:
                totals[part]["count"] += counts[part]
            for key, value in arrays.items():
                part, name = key.split(".", 1)
                totals[part][name] = totals[part].get(name, 0.0) + value
        return totals

    def _checked(self, reply, partition, op, parts, state, config):
        """(counts per part, arrays as float64) of one reply, or a RuntimeError naming its node."""
        node = reply.metadata.src_node_id
        try:
            content = reply.content
            if set(content.keys()) != {"stats", "metrics"}:
                raise RefusedReply(f"records {sorted(content.keys())}, expected stats and metrics")
            counts = self._expected_counts(partition, parts, op, config)
            metrics = check_metrics(
                content["metrics"], {"partition-id", *(f"{part}.count" for part in parts)}
            )
            check_partition(metrics["partition-id"], partition)
            for part in parts:
                got = check_count(f"{part}.count", metrics[f"{part}.count"], 0, 2**62)
                if got != counts[part]:
                    raise RefusedReply(f"{part}.count = {got}, its {part} part has {counts[part]}")
            specs = self._expected_arrays(op, parts, counts, state, config)
            stats = content["stats"]
            check_array_specs(specs, {k: (tuple(a.shape), a.dtype) for k, a in stats.items()})
            arrays = decoded_arrays(stats)
            check_finite_arrays(arrays.items())
            sums = list(arrays) if op == "fisher" else [k for k in arrays if k.endswith(".loss")]
            negative = [k for k in sums if (arrays[k] < 0).any()]  # losses and Fishers are >= 0
            if negative:
                raise RefusedReply(f"negative sums in {negative[:3]}")
        except RefusedReply as refused:
            raise QueryFailedError(  # a FedUnlearnError: the run ends with this one line
                f"scrubbing: {op} reply of node {node} (client {partition}) refused: "
                f"{refused.reason}"
            ) from None
        return counts, {k: a.astype(np.float64) for k, a in arrays.items()}

    def _expected_counts(self, partition, parts, op, config) -> dict[str, int]:
        mask = self.masks[partition]
        sizes = {"forgotten": int(mask.sum()), "retained": int((~mask).sum())}
        if op == "fisher":
            limit = int(config["max-samples"])
            sizes = {part: min(size, limit) for part, size in sizes.items()}
        return {part: sizes[part] for part in parts}

    def _expected_arrays(self, op, parts, counts, state, config) -> dict[str, tuple]:
        """(shape, dtype) of every array a reply must hold."""
        if op == "head":
            k, d = head_matrix(state).shape
            shapes = {"loss": ((1,), "float64"), "gradient": ((k, d), "float64")}
            if bool(config.get("hessian", False)):
                shapes["blocks"] = ((k * (k + 1) // 2, d * (d + 1) // 2), "float32")
            return {f"{part}.{n}": spec for part in parts for n, spec in shapes.items()}
        return {
            f"{part}.{name}": (shape, "float64")
            for part in parts
            if counts[part] > 0
            for name, shape in self.parameters.items()
        }


def run_scrubbing(
    grid: Grid, outcome: TrainingOutcome, *, log: Log = print, missing: MissingClients | None = None
) -> pd.DataFrame:
    """Forget ``scrub-forget`` with every method in ``scrub-methods``; returns the readout table.
    ``missing``: the run's account of who is missing; a client that goes missing during the
    phase (dropped, or refused, in ``retrain``'s rounds) refuses every later method, by name, as
    their sums would leave it out (the log's ``refused_methods``)."""
    config = outcome.config
    num_classes = outcome.data.splits.num_classes
    forget = ForgetSet.parse(
        config.scrub_forget, num_clients=config.num_clients, num_classes=num_classes
    )
    selected = config.scrubbing_methods
    masks = cohort_masks(config, outcome.data)
    partitions = outcome.members.partition_ids
    context = ScrubContext(
        grid,
        outcome,
        forget,
        ScrubStatistics(grid, outcome, forget, masks, log=log),
        holders=[p for p in partitions if masks[p].any()],
        keepers=[p for p in partitions if (~masks[p]).any()],
        log=log,
        shared=SharedStatistics(),
    )
    n_forget = int(sum(m.sum() for m in masks.values()))
    log(
        f"scrubbing {forget} ({n_forget} samples on {len(context.holders)} client(s)): "
        f"{', '.join(selected)}"
    )
    runner = MethodRunner(outcome.run, log=log, label="scrub ", shared=context.shared)
    runner.add("original", outcome.final_state)
    specs = [spec for spec in SCRUBBING if spec.name in selected]
    methods = Progress("scrubbing", len(specs) + 1, unit="methods", log=log).start()
    runner.time("retrain", lambda: retrain(context), model_file="model_scrub_retrain")
    methods.advance()
    # In the registry's order: methods sharing statistics run one after the other.
    runner.run_all(
        specs,
        context,
        refusal=None if missing is None else lambda spec: _missing_refusal(missing),
        progress=methods,
    )

    data = readout_data(outcome, masks, forget)
    tradeoff = information_tradeoff(context, data, runner.models)
    table, entropies = readouts(outcome, data, runner.models, runner.seconds, tradeoff, log)
    _publish(context, runner, table, tradeoff, entropies, f"{forget}, {n_forget} samples")
    outcome.run.append_log(
        SCRUBBING_LOG,
        {
            "forget": str(forget),
            "forgotten_samples": n_forget,
            "holders": context.holders,
            "methods": selected,
            "seconds": runner.seconds,
            "details": runner.details,
            "messages": context.stats.messages,
            "refused_methods": runner.refused,
        },
    )
    log(f"scrubbing table {outcome.run.path / 'scrubbing.csv'}; figures scrubbing_*.png")
    return table


def _missing_refusal(missing: MissingClients) -> str | None:
    """Why a scrubbing method is refused now: a client missing (every method needs every one)."""
    causes = missing.causes()
    if not causes:
        return None
    return f"{missing.describe(causes)}; it needs every client's answer"


def _publish(
    context: ScrubContext, runner: MethodRunner, table, tradeoff, entropies, forget: str
) -> None:
    """The readout and trade-off tables (lambdas span 1e-12 .. 1e-4: 4 significant digits) and
    the figures, whose captions say which data D_f is (``forget``)."""
    run = context.outcome.run
    runner.publish(
        "scrubbing",
        table,
        title="scrubbing results (every column: scrubbing.csv)",
        floatfmt=".4g",
        console=lambda frame: console_table(frame, SCRUBBING_COLUMNS),
    )
    run.write_table("scrubbing_tradeoff", tradeoff, floatfmt=".4g")
    num_classes = context.outcome.data.splits.num_classes
    plot_entropy_histograms(
        entropies, run.path / "scrubbing_entropy.png", num_classes=num_classes, forget=forget
    )
    plot_relearn_times(table, run.path / "scrubbing_relearn.png", forget=forget)
    if not tradeoff.empty:
        plot_information_tradeoff(tradeoff, run.path / "scrubbing_tradeoff.png", forget=forget)
