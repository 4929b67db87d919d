"""Retention around any Flower strategy: what the run's unlearning methods need of each round, on disk.

Liu et al., *FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning Models*
(IWQoS 2021), Section IV: at rounds t_1 = 1, t_{j+1} = t_j + Δt the server keeps each client's update
U_k^{t_j} = M_k^{t_j} - M^{t_j} with its sample count N_k, and the global model M^{t_j}. These are all
the server needs later to reconstruct the model without a client (Algorithm 1). Other methods need
other rounds (:mod:`fedunlearn.store.retention`): each is a retention policy asked after every
round; the store keeps the union once, and its metadata records each policy's own selection
(``retention``) and state (``retention-state``, e.g. SIFU's sensitivity bounds).

:class:`Retaining` wraps a Flower Message API strategy the way Flower's DP wrappers do
(``DifferentialPrivacyServerSideFixedClipping(strategy)``): the wrapped strategy samples, configures
and aggregates (FedAvg, FedProx, FedMedian, FedTrimmedAvg, Krum: :mod:`strategies.aggregation`); the
wrapper remembers the model it sent, keeps what the policies select of the replies and hands the
replies on in partition order. :class:`RetainingFedAvg` is the wrapper around Flower's own FedAvg.
What the wrapper reads of the training replies (their metrics, L^t, the auxiliary heads, the
updates they carry, their partition order) is :mod:`strategies.train_replies`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Strategy

from fedunlearn.errors import ConfigError
from fedunlearn.store.retention import (
    AUXILIARY_REQUEST,
    PARTICIPANTS_KEY,
    RECORD_KEY,
    STATE_KEY,
    RetentionPolicy,
    RetentionRecord,
    Selection,
)
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.streaming import DEFAULT_WINDOW
from strategies.streaming import StreamingRound, folds_replies
from strategies.train_replies import (
    PARTITION_ID_KEY,
    START_LOSS_REQUEST,
    ReplyUpdates,
    aggregate_train_metrics,
    auxiliary_heads,
    partition_order,
    shallow_arrays,
    start_loss,
)

logger = logging.getLogger(__name__)


class _ParticipantGrid:
    """A view of a grid whose connected nodes are the participants among the grid's: what FedAvg's
    sampling reads (``get_node_ids``); it sends nothing."""

    def __init__(self, grid: Grid, participants: frozenset[int]) -> None:
        self._grid, self._participants = grid, participants

    def get_node_ids(self) -> list[int]:
        return [node for node in self._grid.get_node_ids() if node in self._participants]


class Retaining(Strategy):
    """A Flower strategy that also retains client updates for unlearning.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy that samples, configures and aggregates (a FedAvg subclass: it must have
        ``weighted_by_key`` and ``arrayrecord_key``, as every Flower strategy in
        :mod:`strategies.aggregation` has).
    store : UpdateStore or None
        Where retained rounds go; ``None`` turns retention off (the wrapped strategy alone).
    policies : iterable of RetentionPolicy
        What to keep (``[IntervalRetention(2), ...]``, :func:`fedunlearn.registry.run_retention`
        for a run's); at least one when ``store`` is given, each under its own ``name``.
    participants : collection of int, optional
        Node ids taking part: the strategy samples and configures these nodes only, as if the
        others were not connected (FedRetrain trains without the forgotten clients this way, and no
        line says they were sampled). Default: every node.
    on_retained : callable, optional
        Called with ``(server_round, partition_ids)`` after a round was committed to the store.
    sampler : callable, optional
        ``sampler(server_round, nodes)``: the nodes of ``nodes`` (the participants connected) that
        the round trains, when clients are sampled per round
        (:func:`server.federation.members.round_sampler`); the wrapped strategy then trains every
        node it is shown, and the store records who took part in each round (``participants``).
        Default: every participant, every round.
    available : callable, optional
        ``available(server_round, grid)``: the participants' nodes connected now, once enough of them
        are (:class:`server.federation.availability.RoundAvailability`, which waits and refuses
        by the run's rule); sampling then draws from these. Default: whatever the grid says is
        connected, with the wrapped strategy's own wait (``min_available_nodes``).

    Notes
    -----
    Every training reply must carry ``partition-id`` in its metrics: Flower's node ids are random
    and change between runs, but the client's data partition does not, and the store is keyed by it.
    A round is committed to the store atomically after aggregation; a client whose reply failed is
    simply absent from that retained round.
    """

    def __init__(
        self,
        strategy: Strategy,
        store: UpdateStore | None,
        policies: Iterable[RetentionPolicy] = (),
        participants: Collection[int] | None = None,
        on_retained: Callable[[int, list[int]], None] | None = None,
        sampler: Callable[[int, list[int]], Collection[int]] | None = None,
        available: Callable[[int, Grid], Collection[int]] | None = None,
    ) -> None:
        for key in ("weighted_by_key", "arrayrecord_key"):
            if not hasattr(strategy, key):
                raise ConfigError("strategy", type(strategy).__name__, f"a strategy with {key}")
        self.strategy = strategy
        self.weighted_by_key = strategy.weighted_by_key
        self.arrayrecord_key = strategy.arrayrecord_key
        self.store = store
        self.on_retained = on_retained
        self.participants = None if participants is None else frozenset(participants)
        self.sampler = sampler
        self.available = available
        self.policies = _by_name(policies, store)
        self.record = RetentionRecord.empty(self.policies)
        self._sent_arrays: dict[int, ArrayRecord] = {}

    def summary(self) -> None:
        self.strategy.summary()
        if self.store is None:
            logger.info("Retention: off")
        else:
            logger.info("Retention: %s into %s", ", ".join(self.policies), self.store.root)

    def retained(self, server_round: int) -> bool:
        """Whether anything of ``server_round`` was kept (asked after its aggregation)."""
        return self.store is not None and self.record.union(server_round) is not None

    def resume(self, last_round: int) -> None:
        """Continue the policies' record and states of a run resumed after ``last_round``."""
        if self.store is None:
            return
        metadata = self.store.metadata
        if RECORD_KEY in metadata:
            self.record = RetentionRecord.from_json(metadata[RECORD_KEY])
            self.record.truncate(last_round)
            # a crash after a settlement was saved but before its deletions: finish them
            self._delete_unkept([r for r in self.store.rounds() if r <= last_round])
        states = metadata.get(STATE_KEY, {}).get(str(last_round), {})
        if PARTICIPANTS_KEY in metadata:
            recorded = metadata[PARTICIPANTS_KEY]
            kept = {r: p for r, p in recorded.items() if int(r) <= last_round}
            self.store.set_metadata(**{PARTICIPANTS_KEY: kept})
        for name, policy in self.policies.items():
            if name in states:
                policy.load_state_dict(states[name])

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's configuration; remembers M^t, the model sent this round, for the updates, and
        asks the clients for its loss when a policy wants it."""
        if self.store is not None:
            self._sent_arrays = {server_round: arrays}
            if any(p.wants_start_loss for p in self.policies.values()):
                config = ConfigRecord({**dict(config), START_LOSS_REQUEST: 1})
            if any(p.wants_auxiliary(server_round) for p in self.policies.values()):
                epochs = int(config.get("local-epochs", 1))
                config = ConfigRecord({**dict(config), AUXILIARY_REQUEST: epochs})
        offered = self._sampled_from(grid)
        if self.available is not None:
            connected = frozenset(self.available(server_round, grid))
            if self.participants is not None:
                connected &= self.participants  # a set: no second read of the grid
            offered = _ParticipantGrid(grid, connected)
        if self.sampler is not None:
            chosen = self.sampler(server_round, list(offered.get_node_ids()))
            offered = _ParticipantGrid(grid, frozenset(chosen))
        return self.strategy.configure_train(server_round, arrays, config, offered)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(
            server_round, arrays, config, self._sampled_from(grid)
        )

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        return self.strategy.aggregate_evaluate(server_round, replies)

    def _sampled_from(self, grid: Grid) -> Grid:
        """The grid FedAvg samples from: ``grid`` itself, or its participating nodes only."""
        return grid if self.participants is None else _ParticipantGrid(grid, self.participants)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregation, then (in a retained round) U_k^t = M_k^t - M^t for
        every client."""
        # Sum in partition order, not arrival order: floating-point addition is not associative,
        # and a rerun with the same seed must give the same model bit for bit.
        replies = sorted(replies, key=partition_order)
        valid = [m for m in replies if not m.has_error()]
        # What each client sent, held apart: a robust aggregation (FedMedian) pops the arrays it
        # has read from the replies. The copies share the arrays themselves (no extra memory).
        retaining = self.store is not None
        sent = [shallow_arrays(m, self.arrayrecord_key) for m in valid] if retaining else []
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if self.store is not None and arrays is not None:
            if self.sampler is not None:
                self._record_participants(server_round, valid)
            self._retain(server_round, valid, sent)
        return arrays, metrics

    def stream_train(
        self,
        server_round: int,
        expected: Mapping[int, int],
        *,
        window: int = DEFAULT_WINDOW,
        gated: bool = False,
    ) -> StreamingRound | None:
        """Round ``server_round`` folded reply by reply (:class:`strategies.streaming.StreamingRound`;
        ``expected``: partition id -> declared N_k of each client asked; ``gated``: nothing folded
        before the round's end, see :class:`~fedunlearn.training.streaming.ReorderBuffer`), or
        None where the round
        must be aggregated whole: an aggregation other than the weighted mean, or a policy that
        must see the round's updates before it chooses (no :meth:`RetentionPolicy.plan`)."""
        if not folds_replies(self.strategy) or not expected:
            return None
        plans = {name: policy.plan(server_round) for name, policy in self.policies.items()}
        if self.store is not None and (
            any(plan is None for plan in plans.values())
            or any(p.wants_auxiliary(server_round) for p in self.policies.values())
        ):
            return None
        return StreamingRound(self, server_round, expected, plans, window=window, gated=gated)

    def started_from(self, server_round: int) -> dict[str, torch.Tensor]:
        """M^t, the model ``configure_train`` sent in ``server_round`` (read once)."""
        started_from = self._sent_arrays.pop(server_round, None)
        if started_from is None:
            raise RuntimeError(
                f"round {server_round} is a retained round but configure_train was not called for it; "
                "the global model M^t it started from is unknown"
            )
        return started_from.to_torch_state_dict()

    def record_round(self, server_round: int, clients: list[int], plans: Mapping) -> None:
        """After a folded round: who took part, each policy's planned selection over ``clients``
        (the partitions aggregated), the record and states saved."""
        if self.store is None:
            return
        if self.sampler is not None:
            self._save_participants(server_round, clients)
        chosen, settled = self._choose(server_round, lambda name, _: plans[name].selection(clients))
        self._after_round(server_round, Selection.merge(chosen.values()), settled)

    def _record_participants(self, server_round: int, replies: list[Message]) -> None:
        """Who took part in ``server_round`` (the partitions whose replies were aggregated), in
        the store's metadata; a resumed run drops the rounds after its checkpoint."""
        took_part = sorted(p for error, p in map(partition_order, replies) if not error)
        self._save_participants(server_round, took_part)

    def _save_participants(self, server_round: int, took_part: list[int]) -> None:
        assert self.store is not None
        recorded = dict(self.store.metadata.get(PARTICIPANTS_KEY, {}))
        self.store.set_metadata(**{PARTICIPANTS_KEY: {**recorded, str(server_round): took_part}})

    def _retain(self, server_round: int, replies: list[Message], sent: list) -> None:
        """Ask every policy what it keeps of this round (and, of one that settles, what it finally
        keeps of earlier ones); write the union and the record, then delete what is left unkept."""
        global_state = self.started_from(server_round)
        updates, counts = self._updates(server_round, replies, sent, global_state)
        loss = start_loss(replies, self.weighted_by_key)
        for policy in self.policies.values():
            if policy.wants_auxiliary(server_round):
                policy.observe(server_round, auxiliary_heads(replies))

        def select(name: str, policy: RetentionPolicy) -> Selection:
            selection = policy.select(
                server_round,
                global_state,
                updates,
                counts,
                loss=loss if policy.wants_start_loss else None,
            )
            if not isinstance(selection, Selection):
                raise TypeError(f"policy {name}'s select returned {selection!r}, not a Selection")
            return selection

        chosen, settled = self._choose(server_round, select)
        kept = Selection.merge(chosen.values())
        if kept is not None:
            assert self.store is not None
            model = global_state if kept.keep_global else None
            with self.store.begin_round(server_round, model) as writer:
                for partition_id in sorted(kept.clients):
                    writer.add_update(partition_id, updates[partition_id], counts[partition_id])
                for partition_id in sorted(kept.norms):
                    writer.add_norms(partition_id, updates[partition_id], counts[partition_id])
        self._after_round(server_round, kept, settled)

    def _choose(self, server_round: int, select) -> tuple[dict[str, Selection], set[int]]:
        """Each policy's selection of ``server_round`` (``select(name, policy)``), recorded, and
        the earlier rounds some policy settled meanwhile."""
        chosen, settled = {}, set()
        for name, policy in self.policies.items():
            selection = select(name, policy)
            self.record.add(name, server_round, selection)
            chosen[name] = selection
            for decided, clients in policy.settle().items():
                self.record.settle(name, decided, clients)
                if decided == server_round:
                    chosen[name] = Selection(clients is not None, frozenset(clients or ()))
                else:
                    settled.add(decided)
        return chosen, settled

    def _after_round(self, server_round: int, kept: Selection | None, settled: set[int]) -> None:
        """The record and states saved, settled rounds' unkept blobs deleted, ``on_retained``."""
        # A round no policy kept, with no policy state to carry, leaves the record as it was:
        # the header is rewritten only when something changed (not every round).
        states = self._states()
        if kept is not None or settled or states:
            self._save_record(server_round, states)
        # after the record: a crash in between leaves blobs the record no longer names, which
        # resume() deletes, never a record naming deleted blobs
        self._delete_unkept(sorted(settled))
        if kept is not None and self.on_retained is not None:
            self.on_retained(server_round, sorted(kept.kept))

    def _delete_unkept(self, rounds: Iterable[int]) -> None:
        """Delete, of each of ``rounds`` still in the store, what no policy's record keeps."""
        assert self.store is not None
        stored = set(self.store.rounds())
        for server_round in rounds:
            if server_round not in stored:
                continue
            wanted = self.record.union(server_round)
            if wanted is None:
                self.store.delete_from_round(server_round)
                continue
            unkept = set(self.store.clients(server_round)) - wanted.clients
            if unkept:
                self.store.delete_from_round(server_round, unkept)

    def _updates(self, server_round: int, replies: list[Message], sent: list, global_state):
        """U_k^t = M_k^t - M^t (computed when read, never all held at once) and N_k of every
        reply (``sent``: the arrays of each), by partition id."""
        arrays, counts = {}, {}
        for reply, record in zip(replies, sent, strict=True):
            metrics = next(iter(reply.content.metric_records.values()))
            if PARTITION_ID_KEY not in metrics:
                raise ValueError(
                    f"reply from node {reply.metadata.src_node_id} in round {server_round} has no "
                    f"'{PARTITION_ID_KEY}' metric; retention keys updates by partition id, so the "
                    "ClientApp must report it"
                )
            partition_id = int(metrics[PARTITION_ID_KEY])
            arrays[partition_id] = record
            counts[partition_id] = int(metrics[self.weighted_by_key])
        return ReplyUpdates(arrays, global_state), counts

    def _save_record(self, server_round: int, states: dict) -> None:
        """The record and the policies' states after this round (and the round before, which a
        run resumed from the previous checkpoint continues)."""
        assert self.store is not None
        kept = self.store.metadata.get(STATE_KEY, {})
        kept = {r: v for r, v in kept.items() if int(r) == server_round - 1}
        self.store.set_metadata(
            **{RECORD_KEY: self.record.to_json(), STATE_KEY: {**kept, str(server_round): states}}
        )

    def _states(self) -> dict:
        """Every stateful policy's :meth:`~RetentionPolicy.state_dict`, by name."""
        states = {name: policy.state_dict() for name, policy in self.policies.items()}
        return {name: state for name, state in states.items() if state is not None}


def _by_name(policies: Iterable[RetentionPolicy], store) -> dict[str, RetentionPolicy]:
    """``policies`` by name; a store without a policy, a non-policy or a name twice is refused."""
    by_name: dict[str, RetentionPolicy] = {}
    for policy in policies:
        if not isinstance(policy, RetentionPolicy):
            raise ConfigError("policies", repr(policy), "RetentionPolicy instances")
        if by_name.setdefault(policy.name, policy) is not policy:
            raise ConfigError("policies", policy.name, "one policy per name")
    if store is not None and not by_name:
        raise ConfigError("policies", "none", "at least one policy when a store is given")
    return by_name


class RetainingFedAvg(Retaining):
    """:class:`Retaining` around Flower's FedAvg (weighted by ``num-examples``).

    ``**fedavg_kwargs`` go to :class:`flwr.serverapp.strategy.FedAvg` (``fraction_train``,
    ``min_train_nodes`` ...); with ``participants``, ``min_train_nodes`` and ``min_available_nodes``
    default to their number and may not exceed it.
    """

    def __init__(
        self,
        store: UpdateStore | None,
        policies: Iterable[RetentionPolicy] = (),
        participants: Collection[int] | None = None,
        on_retained: Callable[[int, list[int]], None] | None = None,
        **fedavg_kwargs,
    ) -> None:
        fedavg_kwargs.setdefault("train_metrics_aggr_fn", aggregate_train_metrics)
        if participants is not None:
            fedavg_kwargs = participant_minimums(fedavg_kwargs, len(frozenset(participants)))
        super().__init__(FedAvg(**fedavg_kwargs), store, policies, participants, on_retained)


def participant_minimums(kwargs: dict, participants: int) -> dict:
    """``kwargs`` with ``min_train_nodes`` and ``min_available_nodes`` defaulting to the number of
    participants; a larger one is refused (only they are sampled)."""
    kwargs = dict(kwargs)
    for key in ("min_train_nodes", "min_available_nodes"):
        kwargs.setdefault(key, participants)
        if kwargs[key] > participants:
            raise ValueError(
                f"{key}={kwargs[key]} exceeds the {participants} participants; "
                "only they are sampled, so at most that many can be"
            )
    return kwargs
