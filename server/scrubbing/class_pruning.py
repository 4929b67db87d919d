"""Class-level unlearning by class-discriminative pruning (Wang, Guo, Xie and Qi, WWW 2022): the
server side of the ``class-pruning`` scrubbing method.

1. Every client is asked, at the trained model, for its per-class sums of the pruned layer's
   pooled activations (``query.prune_stats``, ``clients/prune_queries.py``); each reply is
   checked (:func:`checked_prune_reply`) and the sums are added up.
2. The core (:mod:`fedunlearn.scrubbing.pruning`) scores the channels of the ``prune-layer``
   layer by TF-IDF over the classes (eqs. 4-6) and the forgotten class's top ``prune-ratio`` of
   them are pruned (eq. 7).
3. ``prune-finetune-rounds`` FedAvg rounds of ``prune-finetune-epochs`` local epochs fine-tune the
   pruned model on D_r: the clients leave the forgotten class out (``forget`` in their config).

It applies to a class cohort (``scrub-forget = class:C``) only: for another it logs why and
returns None (the runner then skips it). A judge run's stack of models is refused.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedunlearn.data.federated_data import run_settings
from fedunlearn.errors import ConfigError
from fedunlearn.messages import PRUNE_QUERY
from fedunlearn.reply_checks import (
    RefusedReply,
    check_array_specs,
    check_count,
    check_finite_arrays,
    check_metrics,
    check_partition,
    decoded_arrays,
)
from fedunlearn.scrubbing.pruning import (
    PruningLayer,
    prune_channels,
    pruning_layer,
    select_channels,
)
from fedunlearn.training.stacked import stack_size
from server.federation.queries import BadReplyError, query_nodes
from server.scrubbing.methods import ScrubContext
from server.training.rounds import participant_rounds

WHO = "class pruning"


def class_pruning(context: ScrubContext, name: str):
    """Prune the forgotten class's most discriminative channels, then fine-tune on D_r; returns
    (state, details) or None when the cohort is not a class."""
    forget, config = context.forget, context.config
    if not forget.is_class:
        context.log(f"{name} skipped: it forgets a class, and {forget} is not one")
        return None
    if stack_size(context.original):
        raise ConfigError(
            "judge-models", stack_size(context.original), "0: class-pruning prunes one network"
        )
    layer = pruning_layer(context.outcome.new_model(), config.prune_layer)
    partitions = list(context.outcome.members.partition_ids)
    sums, counts = prune_statistics(context, layer, partitions)
    channels, scores = select_channels(sums, counts, forget.label, config.prune_ratio)
    pruned = prune_channels(context.original, channels, layer.name, layer.next_name)
    context.log(
        f"{name}: pruned {len(channels)} of {layer.channels} channels of {layer.name} "
        f"(TF-IDF for {forget} {float(scores[channels[0]]):.3g} .. "
        f"{float(scores[channels[-1]]):.3g}); fine-tuning {config.prune_finetune_rounds} round(s)"
    )
    state = participant_rounds(
        context.grid,
        context.outcome,
        pruned,
        context.keepers,
        name=name,
        log=context.log,
        rounds=config.prune_finetune_rounds,
        extra_config={"forget": str(forget), "local-epochs": config.prune_finetune_epochs},
    )
    rounds, epochs = config.prune_finetune_rounds, config.prune_finetune_epochs
    return state, {
        "layer": layer.name,
        "channels": channels,
        "ratio": config.prune_ratio,
        "clients": list(context.keepers),
        "rounds": rounds,
        "client_epochs": len(context.keepers) * rounds * epochs,
        "query_messages": len(partitions),
    }


def prune_statistics(
    context: ScrubContext, layer: PruningLayer, partitions: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clients' per-class channel sums and class counts, each reply checked, added up in
    partition order (so the totals do not depend on the order replies arrive in)."""
    outcome = context.outcome
    num_classes = outcome.data.splits.num_classes
    record = {"layer": layer.name, "num-classes": num_classes, **run_settings(context.config)}
    node_of = outcome.members.node_of_partition
    messages = [
        Message(
            content=RecordDict(
                {"config": ConfigRecord(record), "arrays": ArrayRecord(dict(context.original))}
            ),
            dst_node_id=node_of[p],
            message_type=PRUNE_QUERY,
        )
        for p in partitions
    ]
    asked = {node_of[p]: p for p in partitions}
    replies = query_nodes(
        context.grid, messages, op="prune_stats", who=WHO, timeout=context.config.reply_timeout,
        partition_of=asked, log=context.log,
    )  # fmt: skip
    sums = torch.zeros(num_classes, layer.channels, dtype=torch.float64)
    counts = torch.zeros(num_classes, dtype=torch.int64)
    for node, reply in sorted(replies.items(), key=lambda item: asked[item[0]]):
        partition = asked[node]
        labels = outcome.data.client_split(partition).y.numpy()
        expected = np.bincount(labels, minlength=num_classes)
        try:
            got_sums, got_counts = checked_prune_reply(
                reply.content, partition, expected, outcome.members.num_examples[partition],
                layer.channels,
            )  # fmt: skip
        except RefusedReply as refused:
            raise BadReplyError(node, partition, "prune_stats", refused.reason, WHO) from None
        sums += torch.from_numpy(got_sums)
        counts += torch.from_numpy(got_counts)
    return sums, counts


def checked_prune_reply(
    content, partition: int, class_counts: np.ndarray, declared: int, channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """(sums, counts) of one ``query.prune_stats`` reply, or :class:`RefusedReply` saying why.

    A reply holds exactly ``stats`` (``sums`` float64 of shape (classes, channels), ``counts``
    int64 of shape (classes,)) and ``metrics`` (``partition-id``, the node's partition); every sum
    finite and >= 0 (activations after ReLU), zero for a class with no sample; every count in
    [0, N_k] (N_k the size the node declared) and equal to the class sizes of the partition the
    server computes from the run config (a count decides a class's weight in A*).
    """
    if set(content.keys()) != {"stats", "metrics"}:
        raise RefusedReply(f"records {sorted(content.keys())}, expected stats and metrics")
    metrics = check_metrics(content["metrics"], {"partition-id"})
    check_partition(metrics["partition-id"], partition)
    classes = len(class_counts)
    stats = content["stats"]
    check_array_specs(
        {"sums": ((classes, channels), "float64"), "counts": ((classes,), "int64")},
        {key: (tuple(array.shape), array.dtype) for key, array in stats.items()},
    )
    decoded = decoded_arrays(stats)
    sums, counts = decoded["sums"], decoded["counts"]
    for label, count in enumerate(counts.tolist()):
        got = check_count(f"counts[{label}]", count, 0, declared)
        if got != int(class_counts[label]):
            raise RefusedReply(
                f"counts[{label}] = {got}, the partition holds {int(class_counts[label])}"
            )
    check_finite_arrays([("sums", sums)])
    if (sums < 0).any():
        raise RefusedReply("negative sums: activations after ReLU are >= 0")
    if (sums[counts == 0] != 0).any():
        raise RefusedReply("non-zero sums for a class with no sample")
    return sums.astype(np.float64), counts.astype(np.int64)
