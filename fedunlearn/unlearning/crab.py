"""Crab: recovery from poisoning with selective storage and adaptive rollback.

Jiang, Shen, Liu, Tan, Lam, *Towards Efficient and Certified Recovery from Poisoning Attacks in
Federated Learning* (IEEE TIFS 2025, arXiv 2401.08216). Of the paper only the abstract and Fig. 1
(``figs/workflow1.png`` of the authors' repository) were reachable; the procedure below is that of
the authors' released code (shenjiyuan123/Adaptive_Recovery, ``serverCrab.py``), and where the two
differ we follow Fig. 1. Rounds are 1-based: M^t is the global model sent in round t (M^1 the
initial model), U_k^t = M_k^t − M^t client k's update, M^{t+1} = M^t + Σ_k N_k U_k^t / Σ_k N_k, and
L^t the training loss of M^t on the round's clients' data (weighted by N_k; the clients report it
before they train, ``start-loss``).

Selective storage (:class:`CrabSelector`; ``train_with_select``, ``select_round`` and
``select_client_in_round`` of ``serverCrab.py``), with the authors' P, X and α:

* time windows (lines 246-266): a window opens at round S with L^S; at the first round C with
  L^C < (1 − α) L^S it closes with its rounds S .. C − 1, and the next opens at C with L^C; after
  the final round the open window closes. ``crab-window`` > 0 also closes a window that many rounds
  long (ours: a bound on the rounds kept in full until their window closes; the code has none).
* round selection (lines 163-180): of a window's n rounds, the ⌊P·n⌋ (at least one: the code keeps
  the single round of a one-round window) with the largest KL divergence between consecutive
  global models, d_t = Σ_tensors Σ_rows KL(softmax(M^t) ‖ softmax(M^{t+1})), each tensor's last
  dimension a distribution, 0-d tensors adding nothing; ties go to the earlier round.
* client selection (lines 194-211): in a kept round, the ⌊X·m⌋ of its m clients (at least one)
  whose model M_k^t = M^t + U_k^t is most aligned with the global model it produced, M^{t+1}: the
  mean, over the tensors of two or more dimensions (weights; biases are skipped), of the mean
  cosine similarity along dimension 1 (a matrix's rows); ties go to the smaller client id.

One index differs from the code: its window list starts at M^{S+1}, not at M^S as its comment on
line 198 says, so round t is scored by the KL of round t + 1's step (and round C − 1 is never a
candidate). We score each round by its own step, the comment's reading and the round whose model
and updates are kept. The scores of round t are known when round t is aggregated, so they are
computed then; the choice waits for the window to close, and until then the window's rounds are
kept whole (every client's update): :meth:`CrabSelector.settle` hands over what each closed
window finally keeps, the retaining strategy deletes the rest. The state (the open window's
scores, the kept selection) is JSON and saved after every round, so a resumed run decides as an
uninterrupted one.

The recovery, Fig. 1 of the paper and our sensitivity rollback, is in
:mod:`fedunlearn.unlearning.crab_recovery`.

Stacks (a judge run's N models, ``members.<i>.`` keys): the selection scores are taken over all
tensors (the members' KL divergences add up, their alignments average), so the members share one
selection; the contribution norms, the calibration and the sensitivity rollback are per member.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import torch
import torch.nn.functional as F

from fedunlearn.config.table import validated_parameters
from fedunlearn.errors import ConfigError
from fedunlearn.store.retention import RetentionPolicy, Selection
from fedunlearn.training.model_state import State, parameter_groups, state_sum
from fedunlearn.training.stacked import member_groups
from fedunlearn.unlearning.federaser import aggregate_updates

#: The defaults of the authors' code (``-Prounds 0.6 -Xclients 0.7``, ``alpha = 0.1``).
DEFAULT_ROUND_RATIO = 0.6
DEFAULT_CLIENT_RATIO = 0.7
DEFAULT_LOSS_DROP = 0.1
#: The selector's state format: 2 decides at the end of each window (format 1 decided online).
STATE_FORMAT = 2


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


# ------------------------------------------------------------------ the selection's scores


def parameter_divergence(before: State, after: State, keys: Iterable[str]) -> float:
    """d = Σ over tensors and rows of KL(softmax(before) ‖ softmax(after)), the last dimension of
    each tensor a distribution (``select_round``; 0-d tensors count 0)."""
    total = 0.0
    for key in keys:
        p = before[key].detach().double()
        if p.dim() == 0:
            continue
        log_p = torch.log_softmax(p, dim=-1)
        log_q = torch.log_softmax(after[key].detach().double(), dim=-1)
        total += float((log_p.exp() * (log_p - log_q)).sum())
    return total


def model_alignment(client_model: State, global_model: State, keys: Iterable[str]) -> float:
    """The mean, over tensors of two or more dimensions, of the mean cosine similarity of the
    client's and the global model along dimension 1 (``select_client_in_round``); 0 when the
    model has no such tensor."""
    cosines = [
        float(
            F.cosine_similarity(
                global_model[k].detach().double(), client_model[k].detach().double(), dim=1
            ).mean()
        )
        for k in keys
        if global_model[k].dim() >= 2
    ]
    return sum(cosines) / len(cosines) if cosines else 0.0


def contribution_norms(
    updates: Mapping[int, State],
    num_examples: Mapping[int, int],
    groups: Sequence[Sequence[str]],
    step: State | None = None,
) -> dict:
    """What the sensitivity rollback needs of one round, per group: ‖ΔM^t‖ (``"step"``) and each
    client's ‖N_k U_k^t‖ / Σ N (``"clients"``), JSON-able. ``step``: ΔM^t when already known."""
    step = aggregate_updates(updates, num_examples) if step is None else step
    total = float(sum(num_examples[k] for k in updates))
    return {
        "step": [_norm(step[k] for k in keys) for keys in groups],
        "clients": {
            int(c): [
                num_examples[c] / total * _norm(updates[c][k] for k in keys) for keys in groups
            ]
            for c in sorted(updates)
        },
    }


def top_rounds(divergences: Mapping[int, float], round_ratio: float) -> list[int]:
    """The max(1, ⌊P·n⌋) of a window's n rounds with the largest divergence (earlier on ties)."""
    count = max(1, math.floor(round_ratio * len(divergences) + 1e-9))
    return sorted(sorted(divergences, key=lambda t: (-divergences[t], t))[:count])


def top_clients(alignments: Mapping[int, float], client_ratio: float) -> list[int]:
    """The max(1, ⌊X·m⌋) of a round's m clients most aligned (smaller id on ties)."""
    count = max(1, math.floor(client_ratio * len(alignments) + 1e-9))
    return sorted(sorted(alignments, key=lambda k: (-alignments[k], k))[:count])


# ------------------------------------------------------------------ selective storage


class CrabSelector(RetentionPolicy):
    """Crab's selective storage: scores every round when it is aggregated, chooses when its window
    closes (see the module docstring). A retention policy (:mod:`fedunlearn.store.retention`).

    Parameters
    ----------
    round_ratio : float, default 0.6
        P (``crab-round-ratio``, the code's ``select_round_ratio``), in (0, 1].
    client_ratio : float, default 0.7
        X (``crab-client-ratio``, ``select_client_ratio``), in (0, 1].
    loss_drop : float, default 0.1
        α (``crab-loss-drop``), in (0, 1): a window closes at the first round whose start loss is
        below (1 − α) times the loss at the window's start.
    window : int, default 0
        ``crab-window``: a window closes anyway once it holds this many rounds; 0: never (the
        authors').
    final_round : int, optional
        The run's last round (``rounds``): its aggregation closes the open window. Without it the
        last window stays open until :meth:`close`.
    keep_first_round : bool, default False
        Keep round 1 whatever its window chooses (``crab-rollback = sensitivity``, ours).
    groups : sequence of sequences of str, optional
        The state keys of each independent model (a stack's members) for the contribution norms;
        default: found from the keys (``members.<i>.``), else one group.

    ``select`` keeps every round whole until its window closes; :meth:`settle` returns the final
    choice of the rounds closed since it was last called. :meth:`state_dict` is JSON, no tensor.
    """

    name = "selected-history"
    #: The retaining strategy asks the clients for L^t and passes it as ``loss``.
    wants_start_loss = True

    def __init__(
        self,
        round_ratio: float = DEFAULT_ROUND_RATIO,
        client_ratio: float = DEFAULT_CLIENT_RATIO,
        loss_drop: float = DEFAULT_LOSS_DROP,
        window: int = 0,
        *,
        final_round: int | None = None,
        keep_first_round: bool = False,
        groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        checked = validated_parameters(
            {
                "crab-round-ratio": round_ratio,
                "crab-client-ratio": client_ratio,
                "crab-loss-drop": loss_drop,
                "crab-window": window,
            }
        )
        self.round_ratio = float(checked["crab-round-ratio"])
        self.client_ratio = float(checked["crab-client-ratio"])
        self.loss_drop = float(checked["crab-loss-drop"])
        self.window = int(checked["crab-window"])
        if final_round is not None and (isinstance(final_round, bool) or final_round < 1):
            raise ConfigError("rounds", final_round, "a whole number >= 1")
        self.final_round = final_round
        self.keep_first_round = bool(keep_first_round)
        self.groups = None if groups is None else [list(g) for g in groups]
        self._last_round: int | None = None
        self._open = _empty_window()
        self._kept: dict[int, list[int]] = {}
        self._influence: dict[int, dict] = {}
        self._unsettled: dict[int, list[int] | None] = {}

    @classmethod
    def from_config(cls, config) -> CrabSelector:
        """The run's P, X, α and window bound, closing the last window at the run's last round
        (and keeping round 1 for the sensitivity rollback, ours)."""
        return cls(
            round_ratio=config.crab_round_ratio,
            client_ratio=config.crab_client_ratio,
            loss_drop=config.crab_loss_drop,
            window=config.crab_window,
            final_round=config.rounds,
            keep_first_round=config.crab_rollback == "sensitivity",
        )

    @classmethod
    def from_state(cls, state: Mapping) -> CrabSelector:
        """The selector a saved :meth:`state_dict` describes (its hyper-parameters included)."""
        check_state_format(state)
        p = state["parameters"]
        selector = cls(
            p["crab-round-ratio"],
            p["crab-client-ratio"],
            p["crab-loss-drop"],
            p["crab-window"],
            final_round=p["rounds"],
            keep_first_round=p["keep-first-round"],
        )
        selector.load_state_dict(state)
        return selector

    @property
    def kept(self) -> dict[int, list[int]]:
        """The rounds kept by the windows closed so far, and the clients kept in each."""
        return {t: list(c) for t, c in sorted(self._kept.items())}

    @property
    def open_rounds(self) -> list[int]:
        """The rounds of the open window (kept whole until it closes)."""
        return [int(t) for t in self._open["rounds"]]

    @property
    def influence(self) -> dict[int, dict]:
        """Per observed round, :func:`contribution_norms` (the sensitivity rollback reads them)."""
        return {t: copy_influence_record(r) for t, r in self._influence.items()}

    def select(
        self,
        round: int,
        global_state: State,
        updates: Mapping[int, State],
        num_examples: Mapping[int, int],
        *,
        loss: float | None = None,
    ) -> Selection:
        """Score round ``round`` (M^t, the U_k^t, L^t as ``loss``), closing the open window first
        when L^t fell by α; keeps the round whole for now. Rounds come in increasing order."""
        if isinstance(round, bool) or not isinstance(round, int) or round < 1:
            raise ConfigError("round", round, "a whole number >= 1")
        if self._last_round is not None and round <= self._last_round:
            raise ValueError(f"CrabSelector: round {round} after round {self._last_round}")
        if loss is not None and not (math.isfinite(loss) and loss >= 0):
            raise ConfigError("loss", loss, "a finite number >= 0 or None")
        self._last_round = round
        if not updates:
            return Selection(False, frozenset())
        if self.groups is None:  # a judge run's stack: its members are independent models
            self.groups = member_groups(global_state)
        groups = parameter_groups(global_state, self.groups)
        keys = [k for g in groups for k in g]
        step = aggregate_updates(updates, num_examples)
        self._influence[round] = contribution_norms(updates, num_examples, groups, step)
        if self._closes_before(loss):
            self.close()
        if not self._open["rounds"]:
            self._open["start"], self._open["loss"] = round, loss
        elif self._open["loss"] is None:
            self._open["loss"] = loss  # the window's start loss was not reported: this one
        after = state_sum(global_state, step)
        self._open["rounds"].append(round)
        self._open["divergences"].append(parameter_divergence(global_state, after, keys))
        self._open["alignments"].append(
            {
                int(k): model_alignment(state_sum(global_state, updates[k]), after, keys)
                for k in sorted(updates)
            }
        )
        if self.final_round is not None and round >= self.final_round:
            self.close()
        return Selection(True, frozenset(int(k) for k in updates))

    def _closes_before(self, loss: float | None) -> bool:
        """Whether the open window closes before this round joins it: L^t fell by α below its
        start loss, or it already holds ``window`` rounds."""
        w = self._open
        if not w["rounds"]:
            return False
        reference = w["loss"]
        dropped = loss is not None and reference is not None
        dropped = dropped and loss < (1 - self.loss_drop) * reference
        return dropped or (self.window > 0 and len(w["rounds"]) >= self.window)

    def close(self) -> dict[int, list[int] | None]:
        """Close the open window: choose its rounds and their clients; returns its decisions
        (round: kept clients, or None for a round not kept), also handed over by :meth:`settle`."""
        w, decisions = self._open, {}
        rounds = [int(t) for t in w["rounds"]]
        divergences = dict(zip(rounds, w["divergences"]))
        alignments = {
            t: {int(k): float(v) for k, v in a.items()} for t, a in zip(rounds, w["alignments"])
        }
        chosen = set(top_rounds(divergences, self.round_ratio)) if rounds else set()
        if self.keep_first_round and 1 in divergences:
            chosen.add(1)
        for t in rounds:
            decisions[t] = top_clients(alignments[t], self.client_ratio) if t in chosen else None
            if decisions[t] is not None:
                self._kept[t] = decisions[t]
        self._open = _empty_window()
        self._unsettled.update(decisions)
        return decisions

    def settle(self) -> dict[int, tuple[int, ...] | None]:
        """The final selection of every round decided since the last call: round -> the clients
        kept (the round's model with them), or None (nothing of the round is kept)."""
        out = {t: None if c is None else tuple(c) for t, c in sorted(self._unsettled.items())}
        self._unsettled = {}
        return out

    def _parameters(self) -> dict:
        return {
            "crab-round-ratio": self.round_ratio,
            "crab-client-ratio": self.client_ratio,
            "crab-loss-drop": self.loss_drop,
            "crab-window": self.window,
            "rounds": self.final_round,
            "keep-first-round": self.keep_first_round,
        }

    def state_dict(self) -> dict:
        """Everything :meth:`load_state_dict` needs to continue, as JSON-able values. Decisions
        not yet settled are not part of it: the strategy settles before it saves."""
        w = self._open
        return {
            "format": STATE_FORMAT,
            "parameters": self._parameters(),
            "last_round": self._last_round,
            "window": {
                "start": w["start"],
                "loss": w["loss"],
                "rounds": list(w["rounds"]),
                "divergences": list(w["divergences"]),
                "alignments": [{str(k): v for k, v in a.items()} for a in w["alignments"]],
            },
            "kept": {str(t): list(c) for t, c in sorted(self._kept.items())},
            "influence": {str(t): _record_to_json(r) for t, r in self._influence.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Continue from :meth:`state_dict`; refused when its format or hyper-parameters differ."""
        check_state_format(state)
        for key, value in self._parameters().items():
            if state["parameters"].get(key) != value:
                raise ConfigError(key, value, f"the run's value {state['parameters'].get(key)!r}")
        window = state["window"]
        self._last_round = state["last_round"]
        self._open = {
            "start": window["start"],
            "loss": window["loss"],
            "rounds": [int(t) for t in window["rounds"]],
            "divergences": [float(d) for d in window["divergences"]],
            "alignments": [{int(k): float(v) for k, v in a.items()} for a in window["alignments"]],
        }
        self._kept = {int(t): [int(c) for c in clients] for t, clients in state["kept"].items()}
        self._influence = {int(t): copy_influence_record(r) for t, r in state["influence"].items()}
        self._unsettled = {}

    def forget(self, clients: Collection[int]) -> None:
        """Drop ``clients``' contribution norms, alignment scores and places in the kept
        selection (after their updates were deleted)."""
        gone = {int(c) for c in clients}
        for record in self._influence.values():
            record["clients"] = {c: v for c, v in record["clients"].items() if c not in gone}
        self._kept = {t: [c for c in kept if c not in gone] for t, kept in self._kept.items()}
        self._open["alignments"] = [
            {k: v for k, v in a.items() if k not in gone} for a in self._open["alignments"]
        ]

    @classmethod
    def forget_in_state(cls, state: Mapping, clients: Collection[int]) -> dict:
        """A saved selection without ``clients``; of a format-1 state, the parts it has (it can
        no longer be restored, but what it says of the clients goes)."""
        if isinstance(state, Mapping) and state.get("format", 1) == 1:
            return _forget_in_format_1(state, clients)
        return super().forget_in_state(state, clients)


def check_state_format(state: object) -> None:
    """Refuse a saved selection of another format than :data:`STATE_FORMAT`, saying why."""
    found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
    if found != STATE_FORMAT:
        raise ConfigError(
            "crab-state",
            found,
            f"a Crab selection of format {STATE_FORMAT}; format 1 was written before Crab chose "
            "rounds at the end of each window as the authors' code does, and its rounds cannot "
            "be chosen again: train the run again",
        )


def _empty_window() -> dict:
    return {"start": None, "loss": None, "rounds": [], "divergences": [], "alignments": []}


def copy_influence_record(record: Mapping) -> dict:
    """One round of :attr:`CrabSelector.influence` (or its JSON form) as floats, client ids int;
    norms outside their domain (negative, not finite) or a negative client id are refused: they
    decide where Crab rolls back."""
    copy = {
        "step": [float(x) for x in record["step"]],
        "clients": {int(c): [float(x) for x in v] for c, v in record["clients"].items()},
    }
    norms = copy["step"] + [x for v in copy["clients"].values() for x in v]
    bad = [x for x in norms if not (math.isfinite(x) and x >= 0)]
    if bad or any(c < 0 for c in copy["clients"]):
        raise ConfigError(
            "crab-state",
            f"norms {bad[:3]}" if bad else f"clients {sorted(copy['clients'])}",
            "norms that are finite and >= 0, for client ids >= 0 (the store's record was "
            "edited or damaged)",
        )
    return copy


def _record_to_json(record: Mapping) -> dict:
    copy = copy_influence_record(record)
    return {"step": copy["step"], "clients": {str(c): v for c, v in copy["clients"].items()}}


def _forget_in_format_1(state: Mapping, clients: Collection[int]) -> dict:
    """A format-1 saved selection without ``clients``: their contribution norms, their alignment
    scores and their place in the kept selection, of the parts it has."""
    clients = {int(c) for c in clients}
    state = dict(state)
    state["influence"] = {
        t: {**r, "clients": {c: v for c, v in r["clients"].items() if int(c) not in clients}}
        for t, r in state.get("influence", {}).items()
    }
    state["kept"] = {
        t: [c for c in kept if c not in clients] for t, kept in state.get("kept", {}).items()
    }
    window = dict(state.get("window", {}))
    if "alignments" in window:
        window["alignments"] = [
            {k: v for k, v in a.items() if int(k) not in clients} for a in window["alignments"]
        ]
    state["window"] = window
    return state
