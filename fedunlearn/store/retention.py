"""What the server retains during training, and the view of it each unlearning method reads.

Every unlearning method needs something different from the training run: FedEraser the clients'
updates every Δt rounds (Liu et al., *FedEraser*, IWQoS 2021, Section IV-B: t_1 = 1,
t_{j+1} = t_j + Δt), FedRecover every round's global model and updates (Cao et al., S&P 2023,
Section 4), Crab only the rounds and clients its selective storage picks (Jiang et al., TIFS 2025),
SIFU every round's global model and a per-client sensitivity bound (Fraboni et al., AISTATS 2024).
A :class:`RetentionPolicy` says, round by round, what one of them keeps; the retaining strategy
asks every policy the run's methods need, stores the union once, and records each policy's own
selection (:class:`RetentionRecord`), so that each method reads exactly what its policy kept
(:class:`HistoryView`) and reports the bytes it alone would have needed.

``retain-mode = norms`` (:data:`RETAIN_MODES`): FedEraser's calibration (eq. 2) reads of an update
U_k^{t_j}, j > 1, only ‖U_k^{t_j}‖ per tensor, so its policy keeps round t_1 whole and afterwards
only those norms (:attr:`Selection.norms`); policies that keep whole updates later have no place in
such a run (:func:`fedunlearn.registry.norms_problem`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fedunlearn.errors import ConfigError, StoreCorruptionError

if TYPE_CHECKING:  # annotations only: validating a run config imports RETAIN_MODES, not PyTorch
    import torch

State = Mapping[str, "torch.Tensor"]
#: The store metadata keys of the policies' selections and of their states.
RECORD_KEY, STATE_KEY = "retention", "retention-state"
#: The store metadata key of who took part in each round when clients are sampled (``fraction-train``
#: < 1): round -> the partitions whose replies were aggregated.
PARTICIPANTS_KEY = "participants"
#: The policy FedEraser's schedule is kept under (a need of :data:`fedunlearn.registry.NEEDS`).
INTERVAL = "retained-updates"
#: ``retain-mode``: keep whole updates at every retained round, or whole at t_1 and norms after.
RETAIN_MODES = ("full", "norms")


#: The config key asking a client for an auxiliary head after its training (its value: the
#: auxiliary epochs), and the metric carrying the head back as a flat list of floats.
AUXILIARY_REQUEST, AUXILIARY_KEY = "report-auxiliary-head", "auxiliary-head"


@dataclass(frozen=True)
class Selection:
    """What a policy keeps of one round: the global model M^t, these clients' updates, and of
    the clients in ``norms`` only ‖U_k^t‖ per tensor with N_k."""

    keep_global: bool
    clients: frozenset[int]
    norms: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        clients = frozenset(int(c) for c in self.clients)
        object.__setattr__(self, "clients", clients)
        object.__setattr__(self, "norms", frozenset(int(c) for c in self.norms))
        # An update means nothing without the model it was computed from (norms alone need none).
        object.__setattr__(self, "keep_global", bool(self.keep_global) or bool(clients))

    @property
    def kept(self) -> frozenset[int]:
        """Every client kept in some form."""
        return self.clients | self.norms

    def keeps_anything(self) -> bool:
        return self.keep_global or bool(self.kept)

    @classmethod
    def merge(cls, selections: Iterable[Selection]) -> Selection | None:
        """What the store keeps of a round for all policies at once (None: nothing): the model if
        any wants it, a whole update where any wants one, the norms where only norms are wanted."""
        chosen = [s for s in selections if s.keeps_anything()]
        if not chosen:
            return None
        clients = frozenset().union(*(s.clients for s in chosen))
        norms = frozenset().union(*(s.norms for s in chosen)) - clients
        return cls(any(s.keep_global for s in chosen), clients, norms)


@dataclass(frozen=True)
class Plan:
    """A selection decided before a round's updates: the global model, and of every client that
    took part its whole update (``updates``) or only its norms (``norms``)."""

    keep_global: bool = False
    updates: bool = False
    norms: bool = False

    def selection(self, clients: Iterable[int]) -> Selection:
        """The :class:`Selection` this plan makes of a round with ``clients``."""
        clients = frozenset(clients)
        kept = clients if self.updates else frozenset()
        return Selection(self.keep_global, kept, clients if self.norms else frozenset())

    @classmethod
    def merge(cls, plans: Iterable[Plan]) -> Plan:
        """What the store keeps for all plans at once (a whole update wins over norms)."""
        plans = list(plans)
        updates = any(p.updates for p in plans)
        return cls(
            any(p.keep_global for p in plans) or updates,
            updates,
            any(p.norms for p in plans) and not updates,
        )

    def keeps_anything(self) -> bool:
        return self.keep_global or self.updates or self.norms


class RetentionPolicy(ABC):
    """Decides, after each training round, what one method needs kept of it (a method's
    retention: :attr:`fedunlearn.registry.MethodSpec.retention`).

    A subclass names the need it serves (:attr:`name`, the key of its selection and its state in
    the store's metadata), builds itself from the run config (:meth:`from_config`) and answers
    :meth:`select` after every round. A policy with state saves it with every round
    (:meth:`state_dict`, so a resumed run continues it: :meth:`load_state_dict`), restores it from
    the store (:meth:`from_state`, which refuses a malformed state) and drops forgotten clients
    from it (:meth:`forget`). A policy that chooses rounds after they happened (Crab chooses when
    a window closes) keeps them whole meanwhile and hands over its final choice in :meth:`settle`.
    """

    #: The need it serves: the key of its selection (``retention``) and state (``retention-state``).
    name: ClassVar[str]
    #: Whether it keeps clients' whole updates after round t_1 (a ``retain-mode = norms`` store,
    #: which keeps only their norms, cannot serve it).
    keeps_updates: ClassVar[bool] = True
    #: Whether the clients report L^t, the loss of the model they received, passed to
    #: :meth:`select` as ``loss`` (Crab's time windows).
    wants_start_loss: ClassVar[bool] = False
    #: Whether it keeps rounds of the store (a selection); False for a policy whose whole
    #: history is its state (FedAU's auxiliary heads): it is checked and read by its state.
    keeps_rounds: ClassVar[bool] = True

    def state_bytes(self) -> int:
        """Bytes of history its state holds beyond the store's rounds (what ``kept MB`` adds)."""
        return 0

    def wants_auxiliary(self, server_round: int) -> bool:
        """Whether the clients train and report an auxiliary head after ``server_round``'s
        training (:data:`AUXILIARY_REQUEST`), passed to :meth:`observe` (FedAU's W_a)."""
        return False

    def observe(self, server_round: int, auxiliary: Mapping[int, Any]) -> None:
        """The auxiliary heads the clients reported after ``server_round`` (partition id -> flat
        tensor), when :meth:`wants_auxiliary` asked for them; called before :meth:`select`."""
        return None

    @classmethod
    @abstractmethod
    def from_config(cls, config) -> RetentionPolicy:
        """The policy of a run (an :class:`fedunlearn.config.ExperimentConfig`)."""

    @abstractmethod
    def select(
        self,
        server_round: int,
        global_state: State,
        updates: Mapping[int, State],
        num_examples: Mapping[int, int],
        *,
        loss: float | None = None,
    ) -> Selection:
        """What to keep of ``server_round``: M^t and which clients' U_k^t (``loss``: L^t when
        :attr:`wants_start_loss`, else None)."""

    def plan(self, server_round: int) -> Plan | None:
        """What it keeps of ``server_round``, known before the round's updates arrive (None: it
        must see them, :meth:`select`). A plan lets the server write each update or norms row as
        its reply arrives (:mod:`strategies.streaming`); :meth:`select` over the round's updates
        must then return ``plan.selection(clients)``."""
        return None

    def settle(self) -> Mapping[int, Collection[int] | None]:
        """The final choice of earlier rounds decided since the last call (``{round: clients}``,
        None for nothing of the round); a policy that decides at once returns ``{}``."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """The JSON-able state saved with each round; None: the policy keeps none."""
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a resumed run)."""
        raise StoreCorruptionError(
            f"retention policy {self.name} keeps no state, but one was saved"
        )

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RetentionPolicy:
        """The policy a saved :meth:`state_dict` describes; a malformed state is refused."""
        raise StoreCorruptionError(f"retention policy {cls.name} keeps no state, but one was saved")

    def forget(self, clients: Collection[int]) -> None:
        """Drop ``clients`` from the state (their updates are deleted; numbers about them go
        too, or they would keep their information). A stateless policy has nothing to drop."""
        return None

    @classmethod
    def forget_in_state(cls, state: Mapping[str, Any], clients: Collection[int]) -> dict[str, Any]:
        """A saved state without ``clients``: restored (:meth:`from_state`), :meth:`forget`, saved."""
        policy = cls.from_state(state)
        policy.forget(clients)
        return policy.state_dict()


@dataclass
class RetentionRecord:
    """Per policy, what it selected: ``{policy: {round: clients}}`` (a round listed with no
    clients keeps only its global model). JSON-able through :meth:`to_json`."""

    selections: dict[str, dict[int, tuple[int, ...]]]

    @classmethod
    def empty(cls, policies: Iterable[str]) -> RetentionRecord:
        return cls({name: {} for name in policies})

    def add(self, policy: str, server_round: int, selection: Selection) -> None:
        """Record what ``policy`` kept of ``server_round``: the clients it kept in any form (the
        store says which: a whole update or its norms)."""
        if selection.keeps_anything():
            self.selections[policy][server_round] = tuple(sorted(selection.kept))

    def settle(self, policy: str, server_round: int, clients: Collection[int] | None) -> None:
        """Replace what ``policy`` kept of ``server_round`` by its final choice: ``clients`` with
        the round's model, or (None) nothing of the round."""
        if clients is None:
            self.selections[policy].pop(server_round, None)
        else:
            self.selections[policy][server_round] = tuple(sorted(int(c) for c in clients))

    def union(self, server_round: int) -> Selection | None:
        """Every client some policy kept of ``server_round``, in any form (None: nothing kept)."""
        chosen = [s[server_round] for s in self.selections.values() if server_round in s]
        if not chosen:
            return None
        return Selection(True, frozenset(c for clients in chosen for c in clients))

    def policies(self) -> list[str]:
        return list(self.selections)

    def forget(self, clients: Collection[int]) -> None:
        """Drop ``clients`` from every selection (after their updates were deleted)."""
        for selection in self.selections.values():
            for server_round, kept in selection.items():
                selection[server_round] = tuple(c for c in kept if c not in clients)

    def truncate(self, last_round: int) -> None:
        """Forget the rounds after ``last_round`` (a resumed run redoes them)."""
        for name, selection in self.selections.items():
            self.selections[name] = {r: c for r, c in selection.items() if r <= last_round}

    def unknown(self, store) -> list[str]:
        """One line per round, or client of a round, this record names that ``store`` does not
        hold (empty: the record describes the store)."""
        kept = set(store.rounds())
        problems = []
        for name, selection in self.selections.items():
            for server_round, clients in sorted(selection.items()):
                if server_round not in kept:
                    problems.append(f"retention record {name}: round {server_round} is not stored")
                    continue
                missing = sorted(set(clients) - set(store.clients(server_round)))
                if missing:
                    problems.append(
                        f"retention record {name}: round {server_round} names clients {missing} "
                        "the store does not hold"
                    )
        return problems

    def to_json(self) -> dict[str, Any]:
        return {
            name: {str(r): list(c) for r, c in selection.items()}
            for name, selection in self.selections.items()
        }

    @classmethod
    def from_json(cls, value: object) -> RetentionRecord:
        """The record a store's metadata holds; anything malformed is refused."""
        if not isinstance(value, dict):
            raise ConfigError("retention", type(value).__name__, "a JSON object of policies")
        selections: dict[str, dict[int, tuple[int, ...]]] = {}
        for name, selection in value.items():
            if not isinstance(selection, dict):
                raise ConfigError(f"retention.{name}", selection, "a JSON object of rounds")
            try:
                selections[str(name)] = {
                    int(r): tuple(int(c) for c in clients) for r, clients in selection.items()
                }
            except (TypeError, ValueError):
                raise ConfigError(
                    f"retention.{name}", selection, "round -> list of client ids"
                ) from None
        return cls(selections)
