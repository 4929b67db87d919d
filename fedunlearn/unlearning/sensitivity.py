"""SIFU's sensitivity accumulator: the bound Psi(n, I) on how far FedAvg's model is from the one
trained without the clients I, accumulated round by round during training (Fraboni et al.,
AISTATS 2024; the derivation, the expansion factor and the assumptions are in
:mod:`fedunlearn.unlearning.sifu`, which issues the certificates from it)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fedunlearn.config import Interval, coerce, validate_parameter_constraints
from fedunlearn.errors import ConfigError

State = Mapping[str, torch.Tensor]
FORMAT = 1

#: Hyper-parameters of the accumulator, named as run-config keys (checked by one validator).
_CONSTRAINTS = {
    "sifu-learning-rate": Interval(float, 0, closed="neither"),
    "sifu-smoothness": Interval(float, 0),
    "sifu-momentum": Interval(float, 0, 1, closed="left"),
    "sifu-weight-decay": Interval(float, 0),
    "sifu-local-steps": Interval(int, 1),
    "sifu-local-epochs": Interval(int, 1),
    "sifu-batch-size": Interval(int, 1),
}
_DOUBLE_ROUNDING = 2.0**-52
#: How rho_n is obtained: from L, momentum and weight decay (a bound), or assumed non-expansive
#: (the authors' code: |1 - eta lambda|^K).
EXPANSIONS = ("smoothness", "non-expansive")


# ------------------------------------------------------------------ local work's Lipschitz constant
def local_lipschitz(
    learning_rate: float,
    smoothness: float,
    steps: int,
    *,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    strong_convexity: float | None = None,
) -> float:
    """Lipschitz constant of ``steps`` SGD steps (the paper's expansion factor B(f, eta)^K).

    Non-convex: first entry of A^K e_1, A = [[1 + eta L', eta beta], [L', beta]], L' = L + lambda
    (module docstring); strongly convex (beta = 0): max(|1 - eta mu'|, |1 - eta L'|)^K.
    """
    smooth = smoothness + weight_decay
    if strong_convexity is not None:
        convex = strong_convexity + weight_decay
        factor = max(abs(1 - learning_rate * convex), abs(1 - learning_rate * smooth))
        return factor**steps
    distance, buffer = 1.0, 0.0  # bounds on ||d theta_k|| and ||d buf_{k-1}||
    for _ in range(steps):
        buffer = momentum * buffer + smooth * distance
        distance = distance + learning_rate * buffer
        if math.isinf(distance):
            break
    return distance


# ------------------------------------------------------------------ per-round records
@dataclass
class _Round:
    """What one observed round keeps: participants, their weights p_k and local steps K_k, the
    forgotten cohort's weight, and per group the Gram matrix of the deviations (cohort last) and
    ||Ubar||^2."""

    round: int
    clients: list[int]
    weights: list[float]
    steps: list[int]
    cohort_weight: float
    grams: list[list[list[float]]]
    global_step_sq: list[float]
    dimensions: list[int]

    def columns(self, removed: set[int]) -> list[int]:
        """Gram columns of the removed set: its participants, and the cohort (always removed)."""
        chosen = [j for j, client in enumerate(self.clients) if client in removed]
        return chosen + ([len(self.clients)] if self.cohort_weight > 0 else [])

    def all_weights(self) -> list[float]:
        return self.weights + ([self.cohort_weight] if self.cohort_weight > 0 else [])


def _contribution(record: _Round, group: int, removed: set[int]) -> tuple[float, bool]:
    """(||omega(I, theta^n)|| for one group, whether no participant is kept) with a rounding
    allowance: Q + gamma T^2 under the root, T the triangle bound (module docstring)."""
    columns, weights, gram = record.columns(removed), record.all_weights(), record.grams[group]
    kept = sum(w for j, w in enumerate(weights) if j not in columns)
    if kept <= 0:  # no participant kept (or none at all): the reference stands still
        return math.sqrt(max(record.global_step_sq[group], 0.0)), True
    if not columns:
        return 0.0, False
    quadratic = sum(weights[a] * weights[b] * gram[a][b] for a in columns for b in columns)
    triangle = sum(weights[a] * math.sqrt(max(gram[a][a], 0.0)) for a in columns)
    gamma = (record.dimensions[group] + 4 * len(weights) + 8) * _DOUBLE_ROUNDING
    norm = math.sqrt(max(quadratic, 0.0) + gamma * triangle**2)
    return min(norm, triangle * (1 + gamma)) / kept, False


def _deviation_gram(vectors: torch.Tensor, weights: torch.Tensor) -> tuple[list, float]:
    """Gram matrix of D_i = U_i - Ubar and ||Ubar||^2, in float64."""
    step = weights @ vectors
    deviations = vectors - step
    return (deviations @ deviations.T).tolist(), float(step @ step)


def _is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def client_set(clients: int | Iterable[int]) -> set[int]:
    values = [clients] if _is_whole(clients) else clients
    try:
        chosen = list(values)
    except TypeError:
        raise ConfigError("clients", clients, "a client id or a collection of ids") from None
    if not chosen or not all(map(_is_whole, chosen)):
        raise ConfigError("clients", clients, "one or more integer client ids")
    return {int(c) for c in chosen}


def _resolve_groups(state: State, groups: Sequence[Sequence[str]] | None) -> list[list[str]]:
    """The groups (independent models) as key lists; they must cover every floating tensor once,
    since the noise goes to every floating tensor and the bound must cover all of them."""
    floating = [key for key, tensor in state.items() if tensor.dtype.is_floating_point]
    if groups is None:
        if not floating:
            raise ConfigError("global_state", "no floating tensor", "a model with parameters")
        return [floating]
    resolved = [list(group) for group in groups]
    flat = [key for group in resolved for key in group]
    if any(not group for group in resolved) or len(flat) != len(set(flat)):
        raise ConfigError("groups", groups, "non-empty, disjoint lists of state keys")
    if set(flat) != set(floating):
        raise ConfigError(
            "groups",
            groups,
            f"lists covering exactly the floating tensors {sorted(floating)} "
            f"(missing {sorted(set(floating) - set(flat))}, extra {sorted(set(flat) - set(floating))})",
        )
    return resolved


def _flatten(update: State, keys: Sequence[str], reference: State, client: int) -> torch.Tensor:
    parts = []
    for key in keys:
        if key not in update or update[key].shape != reference[key].shape:
            raise ConfigError(
                "updates", f"client {client}'s {key!r}", "every model tensor, of its shape"
            )
        parts.append(update[key].detach().reshape(-1).to(torch.float64))
    return torch.cat(parts)


class SensitivityAccumulator:
    """The per-client sensitivity bounds Psi(n, I) of one FedAvg training, kept online.

    Parameters
    ----------
    learning_rate : float
        eta, the clients' SGD learning rate.
    smoothness : float
        L: every mini-batch loss has an L-Lipschitz gradient (per model of a stack).
    local_steps : int, optional
        K, SGD steps per client and round; or give ``local_epochs`` and ``batch_size`` and each
        client's K_k = local_epochs * ceil(N_k / batch_size) (the last batch may be partial).
    momentum, weight_decay : float, default 0
        beta and lambda of PyTorch's SGD.
    strong_convexity : float, optional
        mu in [0, L] for strongly convex, twice differentiable losses (no momentum); None: the
        non-convex bound.
    expansion : {"smoothness", "non-expansive"}, default "smoothness"
        rho_n from L (a bound under L), or |1 - eta lambda|^K, the authors' code's factor, which
        assumes non-expansive local work (module docstring).
    groups : list of lists of state keys, optional
        Independent models (a judge stack's members); None: one model of every floating tensor.
    """

    def __init__(
        self,
        *,
        learning_rate: float,
        smoothness: float,
        local_steps: int | None = None,
        local_epochs: int | None = None,
        batch_size: int | None = None,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        strong_convexity: float | None = None,
        expansion: str = "smoothness",
        groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self.parameters = _validated_parameters(
            learning_rate=learning_rate,
            smoothness=smoothness,
            local_steps=local_steps,
            local_epochs=local_epochs,
            batch_size=batch_size,
            momentum=momentum,
            weight_decay=weight_decay,
            strong_convexity=strong_convexity,
            expansion=expansion,
        )
        self.groups = None if groups is None else [list(group) for group in groups]
        self.forgotten = 0
        self._rounds: list[_Round] = []
        self._lipschitz: dict[int, float] = {}

    # -------------------------------------------------------------- training side
    def observe(
        self,
        round: int,
        global_state: State,
        updates: Mapping[int, State],
        num_examples: Mapping[int, int],
    ) -> None:
        """Record round ``round``: theta^round = ``global_state`` and the participants' updates
        U_k = M_k - theta^round, weighted by ``num_examples`` as FedAvg weighs them."""
        expected = self.last_round + 1
        if isinstance(round, bool) or round != expected:
            raise ConfigError("round", round, f"the next round, {expected} (rounds start at 1)")
        weights, steps = self._weights_and_steps(updates, num_examples)
        groups = _resolve_groups(global_state, self.groups)
        clients = list(updates)
        grams, step_squares, dimensions = [], [], []
        for keys in groups:
            dimension = sum(global_state[key].numel() for key in keys)
            rows = [_flatten(updates[c], keys, global_state, c) for c in clients]
            vectors = torch.stack(rows) if rows else torch.zeros(0, dimension, dtype=torch.float64)
            if not bool(torch.isfinite(vectors).all()):
                raise ConfigError("updates", f"round {round}", "finite values (no NaN or Inf)")
            p = torch.tensor(weights, dtype=torch.float64, device=vectors.device)
            gram, step_sq = _deviation_gram(vectors, p)
            grams.append(gram)
            step_squares.append(step_sq)
            dimensions.append(dimension)
        self.groups = groups
        ids = [int(c) for c in clients]
        self._rounds.append(
            _Round(round, ids, weights, steps, 0.0, grams, step_squares, dimensions)
        )

    def _weights_and_steps(
        self, updates: Mapping[int, State], num_examples: Mapping[int, int]
    ) -> tuple[list[float], list[int]]:
        if set(updates) != set(num_examples):
            raise ConfigError("num_examples", dict(num_examples), "one count per update")
        for client, count in num_examples.items():
            client_set(client)
            if not _is_whole(count) or count < 1:
                raise ConfigError("num_examples", {client: count}, "a whole number >= 1")
        total = sum(num_examples[c] for c in updates)  # a round without replies: no weights
        weights = [int(num_examples[c]) / total for c in updates]
        return weights, [self._steps(int(num_examples[c])) for c in updates]

    def _steps(self, count: int) -> int:
        if self.parameters["local_steps"] is not None:
            return self.parameters["local_steps"]
        batches = -(-count // self.parameters["batch_size"])
        return self.parameters["local_epochs"] * batches

    def _rho(self, record: _Round) -> float:
        """rho_n: the largest local-work Lipschitz constant over the round's participants (a
        superset of those the reference keeps, so the largest is an upper bound)."""
        rho = 0.0
        for steps in set(record.steps):
            p = self.parameters
            if steps not in self._lipschitz and p["expansion"] == "non-expansive":
                self._lipschitz[steps] = abs(1 - p["learning_rate"] * p["weight_decay"]) ** steps
            if steps not in self._lipschitz:
                self._lipschitz[steps] = local_lipschitz(
                    p["learning_rate"],
                    p["smoothness"],
                    steps,
                    momentum=p["momentum"],
                    weight_decay=p["weight_decay"],
                    strong_convexity=p["strong_convexity"],
                )
            rho = max(rho, self._lipschitz[steps])
        return rho

    # -------------------------------------------------------------- bounds
    @property
    def last_round(self) -> int:
        """The last observed round (0 before the first)."""
        return self._rounds[-1].round if self._rounds else 0

    def rounds(self) -> list[int]:
        return [record.round for record in self._rounds]

    def clients(self) -> list[int]:
        """Every client id with an entry (forgotten clients have none)."""
        return sorted({c for record in self._rounds for c in record.clients})

    def bounds(self, clients: int | Iterable[int]) -> list[list[float]]:
        """Psi(n, I) for n = 1 .. last round + 1, one list per round with one bound per group."""
        removed = client_set(clients)
        current = [0.0] * len(self.groups or [[]])
        history = [list(current)]
        for record in self._rounds:
            rho = self._rho(record)
            for group in range(len(current)):
                norm, identity = _contribution(record, group, removed)
                factor = 1.0 if identity else rho
                # rho * 0 = 0 even if rho overflowed: equal models stay equal.
                current[group] = (factor * current[group] if current[group] > 0 else 0.0) + norm
            history.append(list(current))
        return history

    def member_bounds(self, clients: int | Iterable[int], round: int) -> list[float]:
        """Psi(round, I) of each group (a stack's members), I = ``clients`` with the cohort."""
        last = self.last_round + 1
        if isinstance(round, bool) or not isinstance(round, int) or not 1 <= round <= last:
            raise ConfigError("round", round, f"a round in [1, {last}]")
        return self.bounds(clients)[round - 1]

    def bound(self, clients: int | Iterable[int], round: int) -> float:
        """Psi(round, I): the largest of the groups' bounds on ||theta^round - theta^round_{-I}||."""
        return max(self.member_bounds(clients, round))

    def assumptions(self) -> dict[str, Any]:
        regime = "non-convex" if self.parameters["strong_convexity"] is None else "strongly-convex"
        if self.parameters["expansion"] == "non-expansive":
            regime = "non-expansive (assumed)"
        return {**self.parameters, "regime": regime, "server_learning_rate": 1.0}

    # -------------------------------------------------------------- after an unlearning request
    def delete_rounds_after(self, round: int) -> list[int]:
        """Drop the rounds after ``round`` (retraining replaces them: call with T - 1)."""
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise ConfigError("round", round, "a whole number >= 0")
        dropped = [r.round for r in self._rounds if r.round > round]
        self._rounds = [r for r in self._rounds if r.round <= round]
        return dropped

    def forget(self, clients: int | Iterable[int]) -> None:
        """Fold ``clients`` into the anonymous forgotten cohort: their ids, weights and per-client
        numbers go; only the cohort's summed weighted deviation stays (module docstring)."""
        removed = client_set(clients)
        seen = set(self.clients()) & removed
        for record in self._rounds:
            _fold_into_cohort(record, removed)
        self.forgotten += len(seen)

    # -------------------------------------------------------------- persistence
    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict from which :meth:`from_json` continues the accumulation."""
        return {
            "format": FORMAT,
            "method": "sifu",
            "parameters": dict(self.parameters),
            "groups": self.groups,
            "forgotten": self.forgotten,
            "rounds": [asdict(record) for record in self._rounds],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SensitivityAccumulator:
        """The accumulator :meth:`to_json` saved; a malformed dict raises ConfigError."""
        try:
            if data["format"] != FORMAT or data["method"] != "sifu":
                raise ValueError("format or method")
            accumulator = cls(**data["parameters"], groups=data["groups"])
            accumulator.forgotten = int(data["forgotten"])
            for index, raw in enumerate(data["rounds"], start=1):
                record = _Round(**raw)
                _check_record(record, index, len(accumulator.groups or []))
                accumulator._rounds.append(record)
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                "sifu-state", type(data).__name__, f"a dict saved by to_json ({error!r})"
            ) from None
        return accumulator


def _validated_parameters(**values: Any) -> dict[str, Any]:
    """The accumulator's hyper-parameters, checked; errors name the run-config keys."""
    floats = ("learning_rate", "smoothness", "momentum", "weight_decay")
    out = {name: coerce(f"sifu-{name.replace('_', '-')}", values[name], float) for name in floats}
    for name in ("local_steps", "local_epochs", "batch_size"):
        value = values[name]
        out[name] = None if value is None else coerce(f"sifu-{name.replace('_', '-')}", value, int)
    validate_parameter_constraints(
        {f"sifu-{k.replace('_', '-')}": v for k, v in out.items() if v is not None}, _CONSTRAINTS
    )
    by_epochs = out["local_epochs"] is not None and out["batch_size"] is not None
    partial = out["local_epochs"] is not None or out["batch_size"] is not None
    if (out["local_steps"] is None) != by_epochs or (out["local_steps"] is not None and partial):
        raise ConfigError(
            "sifu-local-steps",
            out["local_steps"],
            "either sifu-local-steps, or both sifu-local-epochs and sifu-batch-size",
        )
    mu = values["strong_convexity"]
    if mu is not None:
        mu = coerce("sifu-strong-convexity", mu, float)
        if not 0 <= mu <= out["smoothness"] or out["momentum"] > 0:
            raise ConfigError(
                "sifu-strong-convexity",
                mu,
                "a number in [0, sifu-smoothness] with sifu-momentum = 0 (or unset: non-convex)",
            )
    out["strong_convexity"] = mu
    if values["expansion"] not in EXPANSIONS:
        raise ConfigError("sifu-expansion", values["expansion"], f"one of {', '.join(EXPANSIONS)}")
    out["expansion"] = values["expansion"]
    return out


def _fold_into_cohort(record: _Round, removed: set[int]) -> None:
    """Replace the removed participants (and the old cohort) by one pseudo-participant of weight
    w = sum p_a and deviation sum p_a D_a / w: every later combined norm stays exact."""
    merged = record.columns(removed)
    if not merged or merged == [len(record.clients)]:
        return
    weights, kept = record.all_weights(), [j for j in range(len(record.clients)) if j not in merged]
    total = sum(weights[a] for a in merged)
    grams = []
    for gram in record.grams:
        cross = [sum(weights[a] * gram[a][b] for a in merged) / total for b in kept]
        own = sum(weights[a] * weights[b] * gram[a][b] for a in merged for b in merged) / total**2
        rows = [[gram[a][b] for b in kept] + [cross[i]] for i, a in enumerate(kept)]
        grams.append(rows + [cross + [own]])
    record.clients = [record.clients[j] for j in kept]
    record.weights = [record.weights[j] for j in kept]
    record.steps = [record.steps[j] for j in kept]
    record.cohort_weight, record.grams = total, grams


def _check_record(record: _Round, expected_round: int, groups: int) -> None:
    size = len(record.clients) + (1 if record.cohort_weight > 0 else 0)
    shapes_ok = (
        record.round == expected_round
        and len(record.weights) == len(record.steps) == len(record.clients)
        and all(map(_is_whole, record.clients))
        and len(set(record.clients)) == len(record.clients)
        and all(_is_whole(k) and k >= 1 for k in record.steps)
        and all(w > 0 for w in record.weights)
        and record.cohort_weight >= 0
        and len(record.grams) == len(record.global_step_sq) == len(record.dimensions) == groups
        and all(len(g) == size and all(len(row) == size for row in g) for g in record.grams)
    )
    values = [*record.weights, record.cohort_weight, *record.global_step_sq]
    values += [x for g in record.grams for row in g for x in row]
    if not shapes_ok or not all(math.isfinite(float(x)) for x in values):
        raise ConfigError("sifu-state", f"round {record.round}", f"round {expected_round}, intact")
    problem = _gram_problem(record)
    if problem:
        raise ConfigError(
            "sifu-state",
            f"round {record.round}",
            f"Gram matrices that are symmetric and positive semidefinite and squared norms >= 0 "
            f"({problem}: the store's record was edited or damaged)",
        )


def _gram_problem(record: _Round) -> str:
    """What is outside the domain of a round's Gram matrices and ||Ubar||^2, or ``""``."""
    if any(x < 0 for x in record.global_step_sq):
        return "a negative ||Ubar||^2"
    for group, gram in enumerate(record.grams):
        matrix = np.asarray(gram, dtype=np.float64)
        if matrix.size == 0:
            continue
        scale = max(1.0, float(np.abs(matrix).max()))
        if not np.allclose(matrix, matrix.T, rtol=0, atol=1e-9 * scale):
            return f"group {group}'s Gram matrix is not symmetric"
        lowest = float(np.linalg.eigvalsh(matrix).min())
        if lowest < -1e-8 * scale:
            return f"group {group}'s Gram matrix has eigenvalue {lowest:.3g}"
    return ""
