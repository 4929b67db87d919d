"""Client work for the unlearning methods that ask more of the clients than FedAvg rounds: the
leaving client's own unlearning step (PGA, FedOSD, FedQUIT: ``target_participates`` in the
registry, allowed only with ``allow-target-participation``), and the remaining clients' work under an
objective other than plain training (FedOSD's gradients, rapid retraining's Fisher steps).

A request is a ``train`` message carrying the model and ``objective`` (and the objective's settings)
in its config; the client runs that objective on its data (:mod:`clients.objectives`) and replies
with its model M̂_k, read as the update M̂_k − M̃. Clients unlearned by earlier requests are never
addressed; this request's targets only by :func:`target_requests`, which a method not registered as
participating cannot use.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.messages import TRAIN
from fedunlearn.registry import UNLEARNING
from fedunlearn.training.model_state import state_sum, weighted_average
from server.federation.queries import collect_replies
from server.training.rounds import train_config_record
from strategies.client_updates import ClientUpdates


def client_requests(
    context,
    phase: str,
    *,
    epochs: int | None = None,
    extra: Mapping[str, int | float | str] | None = None,
    forbidden: list[int] | None = None,
) -> ClientUpdates:
    """Requests of ``epochs`` (default E_loc) under the run's SGD settings plus ``extra`` (an
    ``objective`` and its settings), forbidden to address ``forbidden`` (default: every client the
    context excludes)."""
    outcome, config = context.outcome, context.outcome.config
    settings = {k: v for k, v in train_config_record(config).items() if k != "local-epochs"}
    requests = ClientUpdates(
        partial(collect_replies, context.grid, timeout=config.reply_timeout, log=context.log),
        outcome.members.node_of_partition,
        message_type=TRAIN,
        epochs=config.local_epochs if epochs is None else epochs,
        train_config={**settings, **dict(extra or {})},
        phase=phase,
        screen=outcome.screen.training if outcome.screen is not None else None,
        is_dropped=lambda partition: partition in outcome.members.dropped,
    )
    requests.forbid(context.excluded if forbidden is None else forbidden)
    return requests


def target_requests(context, name: str, *, epochs: int, extra: Mapping) -> ClientUpdates:
    """Requests to this request's targets (``context.targets``) for method ``name``, which must be
    registered with ``target_participates`` and allowed by the config; clients unlearned by earlier
    requests stay forbidden."""
    if not UNLEARNING[name].target_participates:
        raise ConfigError("unlearn-methods", name, "a method registered with target_participates")
    if not context.outcome.config.allow_target_participation:
        raise ConfigError("allow-target-participation", False, f"true to run {name}")
    earlier = sorted(set(context.excluded) - set(context.targets))
    return client_requests(context, name, epochs=epochs, extra=extra, forbidden=earlier)


def sizes(context, clients) -> list[int]:
    """N_k of each of ``clients`` (the sample counts they declared at discovery)."""
    return [context.outcome.members.num_examples[k] for k in clients]


def target_updates(
    context,
    requests: ClientUpdates,
    start: Mapping[str, torch.Tensor],
    server_round: int = 0,
    *,
    anchors: Mapping[int, Mapping[str, torch.Tensor]] | None = None,
    shared: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> dict[int, dict[str, torch.Tensor]]:
    """Each replying target's update from ``start`` (its step of the method). ``anchors``: a state
    attached to each target's own message (then one message each); ``shared``: states attached to
    every target's message, by name (PGA's validation samples). No reply at all is refused: the
    method did nothing."""
    shared = dict(shared or {})
    if anchors:
        updates = {}
        for k in context.targets:
            attached = {**shared, **({"anchor": anchors[k]} if k in anchors else {})}
            updates.update(requests(server_round, dict(start), [k], attached or None))
    else:
        updates = requests(server_round, dict(start), list(context.targets), shared or None)
    if not updates:
        raise RuntimeError(
            f"{requests.phase}: no leaving client replied; nothing was unlearned by it"
        )
    return updates


def mean_model(context, start: Mapping[str, torch.Tensor], updates) -> dict[str, torch.Tensor]:
    """``start`` plus the sample-weighted mean of the targets' ``updates`` (ours for several
    targets: each ran the method's step from ``start``)."""
    clients = sorted(updates)
    step = weighted_average([updates[k] for k in clients], sizes(context, clients))
    return state_sum(dict(start), step)


def targets_model(
    context,
    requests: ClientUpdates,
    start: Mapping[str, torch.Tensor],
    server_round: int = 0,
    *,
    anchors: Mapping[int, Mapping[str, torch.Tensor]] | None = None,
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """:func:`mean_model` of the :func:`target_updates`; the model and the targets that replied."""
    updates = target_updates(context, requests, start, server_round, anchors=anchors)
    return mean_model(context, start, updates), sorted(updates)
