"""One training round on the grid: configure, send, screen, aggregate; whole or reply by reply.

A round is aggregated reply by reply (:class:`strategies.streaming.StreamingRound`) where the
strategy can fold (``Retaining.stream_train``: FedAvg or FedProx, retention decided before the
round): each reply is screened as it arrives, then waits in the reorder buffer (``window`` replies
in memory, the rest on disk) for its turn to be added to the sum and written to the store, and the
server never holds the round's K replies at once. With ``max-update-ratio`` (on by default), which
compares each update's norm with the round's others, the buffer is gated: every reply waits for
the round's end, the outliers are withdrawn, then the rest are folded. Otherwise (FedMedian,
FedTrimmedAvg, Krum, DP-FedAvg, a policy that must see the round first) the round's replies are
collected, screened together and aggregated whole. Both give the same model, bit for bit, when
every client asked replies with its declared count.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message

from fedunlearn.errors import TooFewReplies
from server.federation.members import failure_reasons
from server.federation.queries import collect_replies
from server.progress import round_label
from strategies.retaining import Retaining


class DivergedRound(RuntimeError):
    """A round failed because the clients' training diverged from the model sent: every refused
    reply was refused for a non-finite value, and no reply was an error. The caller may report
    the model it sent (``state``: that round's start model, CPU tensors) as diverged instead of
    ending the run."""

    def __init__(self, message: str, state: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__(message)
        self.state = state


def train_round(grid, strategy, config, server_round, arrays, train_config, screen, phase, log):
    """One training round: configure, send, screen, aggregate. Returns (new arrays, aggregated
    metrics, valid replies); fails when fewer than ``min-reply-fraction`` of the asked replied
    validly."""
    messages = list(
        strategy.configure_train(server_round, arrays, ConfigRecord(dict(train_config)), grid)
    )
    if screen is not None:
        messages = screen.active(messages)
    folding = _folding(strategy, server_round, messages, screen)
    if folding is not None:
        new_arrays, train_metrics, valid = _folded_round(
            grid, folding, config, server_round, arrays, messages, screen, phase, log
        )
        return in_sent_dtypes(new_arrays, arrays), train_metrics, valid
    label = round_label(phase, server_round)
    replies = collect_replies(grid, messages, timeout=config.reply_timeout, label=label, log=log)
    failed = [r for r in replies if r.has_error()]
    valid = [r for r in replies if not r.has_error()]
    if screen is not None:
        valid = screen.training(phase, server_round, arrays, valid)
    _check_enough(config, phase, server_round, arrays, len(messages), len(valid), failed, screen)
    _check_dp_sample(strategy, phase, server_round, len(valid))
    new_arrays, train_metrics = strategy.aggregate_train(server_round, valid)
    if new_arrays is None:
        raise TooFewReplies(f"{phase} round {server_round}: no client returned an update")
    return in_sent_dtypes(new_arrays, arrays), train_metrics, len(valid)


def in_sent_dtypes(new: ArrayRecord, sent: ArrayRecord) -> ArrayRecord:
    """``new`` with each integer array in the dtype of the model sent. A weighted mean multiplies
    every array by a float (Flower's ``aggregate_arrayrecords``, the folded sum, the robust rules),
    so an integer buffer, BatchNorm's ``num_batches_tracked``, comes back float64 and the next
    round's replies (int64) would no longer match the model sent; it is rounded back, as
    :class:`fedunlearn.training.model_state.RunningAverage` does."""
    changed = {}
    for name, array in new.items():
        dtype = np.dtype(sent[name].dtype) if name in sent else None
        if dtype is not None and dtype.kind in "iu" and np.dtype(array.dtype) != dtype:
            changed[name] = Array(np.asarray(np.rint(array.numpy()), dtype=dtype))
    if not changed:
        return new
    return ArrayRecord({name: changed.get(name, array) for name, array in new.items()})


def _folding(strategy, server_round: int, messages: list[Message], screen):
    """The round's :class:`~strategies.streaming.StreamingRound`, or None to aggregate it whole
    (a strategy that cannot fold, no screen to map nodes to clients); gated when the screen
    compares each update with the round's others (``max-update-ratio``)."""
    if not isinstance(strategy, Retaining) or screen is None:
        return None
    expected = {}
    for message in messages:
        partition = screen.members.partition_of(message.metadata.dst_node_id)
        if partition is None or partition in expected:
            return None
        expected[partition] = screen.members.num_examples[partition]
    gated = not screen.screens_each_reply_alone  # max-update-ratio refuses at the end
    return strategy.stream_train(server_round, expected, gated=gated)


def _folded_round(grid, folding, config, server_round, arrays, messages, screen, phase, log):
    """:func:`train_round`, each reply screened and folded as it arrives (sent in partition order,
    so that the reorder buffer stays short)."""
    messages = sorted(messages, key=lambda m: screen.members.partition_of(m.metadata.dst_node_id))
    screening = screen.training_screening(phase, server_round, arrays)
    failed: list[Message] = []
    try:

        def on_reply(reply: Message) -> None:
            if reply.has_error():
                failed.append(reply)
                return
            node = reply.metadata.src_node_id
            if not folding.waits_for(screen.members.partition_of(node)):
                screening.refuse(node, "no reply of this node is expected (not asked, or twice)")
                return
            partition = screening.accept(reply)
            if partition is not None:
                folding.add(partition, reply, screening.decoded)
            else:
                folding.absent(screen.members.partition_of(node))

        label = round_label(phase, server_round)
        collect_replies(
            grid, messages, timeout=config.reply_timeout, label=label, log=log, on_reply=on_reply
        )
        for node in screening.close() & screening.accepted:  # refused at the end: outliers
            folding.withdraw(screen.members.partition_of(node))
        valid = len(screening.accepted - screening.refused)
        _check_enough(config, phase, server_round, arrays, len(messages), valid, failed, screen)
        new_arrays, train_metrics = folding.finish()
    except BaseException:
        folding.abort()
        raise
    if new_arrays is None:
        raise TooFewReplies(f"{phase} round {server_round}: no client returned an update")
    return new_arrays, train_metrics, valid


def _check_enough(config, phase, server_round, arrays, asked, valid, failed, screen) -> None:
    """Refuse a round with fewer than ``min-reply-fraction`` of ``asked`` valid replies: as
    :class:`DivergedRound` when every refusal was a non-finite value and nothing failed."""
    needed = max(1, math.ceil(config.min_reply_fraction * asked - 1e-9))
    if valid >= needed:
        return
    if _diverged(screen, failed):
        raise DivergedRound(
            f"{phase} round {server_round}: {len(screen.last_refused)} of {asked} "
            "replies refused, every one for a value that is not finite: the model sent diverged "
            "in the clients' training",
            state={k: v.detach().cpu().clone() for k, v in arrays.to_torch_state_dict().items()},
        )
    reasons = failure_reasons(failed) or "no error replies"
    raise TooFewReplies(
        f"{phase} round {server_round}: {valid} valid replies of {asked} asked, "
        f"fewer than min-reply-fraction={config.min_reply_fraction:g} requires ({needed}); "
        f"failures: {reasons}; refused replies are listed above"
    )


def _check_dp_sample(strategy, phase: str, server_round: int, valid: int) -> None:
    """DP-FedAvg's noise, z C / K, and its accountant assume K replies every round: with fewer,
    each one's share of the average is larger than the noise covers, and the reported epsilon
    would be wrong. Flower's wrapper only warns; such a round stops the run (resume it once the
    clients are back)."""
    expected = getattr(strategy, "num_sampled_clients", None)
    if expected is not None and valid != expected:
        raise TooFewReplies(
            f"{phase} round {server_round}: {valid} valid replies, but DP-FedAvg's noise "
            f"(z C / K) and its (epsilon, delta) assume all {expected} clients in every round; "
            "restart the missing SuperNodes and resume the run (resume = true)"
        )


def _diverged(screen, failed) -> bool:
    return (
        screen is not None
        and not failed
        and bool(screen.last_refused)
        and screen.last_refused == screen.last_non_finite
    )
