"""A round's weighted average folded one reply at a time, in partition order, Flower-free.

FedAvg's aggregate (McMahan et al. 2017, Algorithm 1: M^{t+1} = Σ_k (N_k / N) M_k^{t+1}) needs no
reply once it is added: the server can fold each into the sum as it arrives and let it go, so its
memory within a round is O(window × model), not O(K × model). Two things keep the result the model
Flower's ``aggregate_arrayrecords`` gives over the same replies, bit for bit:

* the order: floating-point addition is not associative, so the clients are added in ascending
  partition id whatever order they answer in (:class:`ReorderBuffer` holds an early reply until
  the ones before it arrived or are known absent; past ``window`` held replies it spills them to
  disk, so a deployed federation answering in any order stays bounded too);
* the factors: Flower multiplies each client's arrays by N_k / N with N summed over the round's
  replies, known only at the end. :class:`WeightedSum` takes N from the counts the clients
  declared at discovery; when every sampled client replies with its declared count the operations
  are Flower's own. A client that drops out or reports fewer samples changes N: the sum is then
  rescaled by N_expected / N_folded at the end (the same average up to rounding, not bit for bit).
"""

from __future__ import annotations

import numbers
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.errors import ConfigError

#: Replies the reorder buffer holds in memory before it spills the next to disk.
DEFAULT_WINDOW = 64


@dataclass
class Contribution:
    """One client's reply, decoded: its arrays (in the reply's order), its N_k, and what the caller
    needs back when the reply's turn comes (``extra``: its metrics)."""

    key: int
    arrays: list[tuple[str, np.ndarray]]
    weight: int | float
    extra: Any = None


@dataclass
class _Spilled:
    """A contribution whose arrays wait on disk: at ``offsets`` of the buffer's spill file."""

    key: int
    names: list[str]
    file: Any
    offsets: list[int]
    weight: int | float
    extra: Any = None

    def load(self) -> Contribution:
        arrays = []
        for name, offset in zip(self.names, self.offsets, strict=True):
            self.file.seek(offset)
            arrays.append((name, np.load(self.file, allow_pickle=False)))
        return Contribution(self.key, arrays, self.weight, self.extra)


@dataclass
class ReorderBuffer:
    """Hands contributions over in ascending key order of ``expected``, whatever order they
    arrive in; a key may be declared :meth:`absent` (no reply, or a refused one).

    Parameters
    ----------
    expected : iterable of int
        The keys (partition ids) the round asked.
    window : int
        Contributions held in memory at most; the next early ones are spilled to ``spill_dir``.
    spill_dir : path, optional
        Where the spill file is made, on first use (the system's temporary folder by default).
        It has no name from the start (``tempfile.TemporaryFile``): nothing of it outlives the
        buffer, a crash included, and no other process can open it.
    gated : bool (default: False)
        Hand nothing over before :meth:`close`: a round whose screening compares each reply with
        the others (``max-update-ratio``) learns only at its end which replies to
        :meth:`withdraw`; they all wait meanwhile (``window`` in memory, the rest on disk).
    """

    expected: Iterable[int]
    window: int = DEFAULT_WINDOW
    spill_dir: str | Path | None = None
    gated: bool = False
    held: dict[int, Contribution | _Spilled | None] = field(default_factory=dict, init=False)
    #: The most replies held in memory at once while they waited (at most ``window``).
    peak_in_memory: int = field(default=0, init=False)
    spilled: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.window, numbers.Integral) and self.window >= 1):
            raise ConfigError("window", self.window, "a whole number >= 1")
        self._order = sorted({int(k) for k in self.expected})
        self._next = 0  # index into _order of the next key to hand over
        self._unresolved = set(self._order)  # neither put nor declared absent yet
        self._waiting: set[int] = set()  # keys held in memory, waiting for their turn
        # one file with no name (unlinked when made): a crash leaves no client's update on disk
        self._spill_file = None

    @property
    def pending(self) -> list[int]:
        """The keys neither put nor declared absent yet, ascending."""
        return sorted(self._unresolved)

    def waits_for(self, key: int) -> bool:
        """Whether ``key`` was expected and was neither put nor declared absent yet."""
        return key in self._unresolved

    def put(self, contribution: Contribution) -> Iterator[Contribution]:
        """Add ``contribution``; returns the contributions now ready, in key order, each loaded
        from disk only when the iteration reaches it (iterate it to the end)."""
        key = self._check_new(contribution.key)
        ready_now = not self.gated and self._order[self._next] == key
        if ready_now:  # handed straight over: it never waits
            self.held[key] = contribution
        elif len(self._waiting) >= self.window:
            self.held[key] = self._spill(contribution)
        else:
            self.held[key] = contribution
            self._waiting.add(key)
            self.peak_in_memory = max(self.peak_in_memory, len(self._waiting))
        return self._drain()

    def absent(self, key: int) -> Iterator[Contribution]:
        """Declare ``key`` without a contribution; returns the contributions now ready."""
        self.held[self._check_new(key)] = None
        return self._drain()

    def withdraw(self, key: int) -> None:
        """Take back ``key``'s contribution, held and not handed over yet (a gated buffer's reply
        refused at the round's end): it is treated as absent, its spilled files removed."""
        item = self.held.get(key)
        if item is None:
            raise ValueError(f"client {key} has no contribution held to withdraw")
        self.held[key] = None
        self._waiting.discard(key)

    def close(self) -> Iterator[Contribution]:
        """Declare every pending key absent (the round's wait is over); the rest, in order, one
        at a time (the spilled files go once the iteration ends)."""
        for key in self.pending:
            self.held[key] = None
        self._unresolved.clear()
        self.gated = False
        return self._closing()

    def _closing(self) -> Iterator[Contribution]:
        try:
            yield from self._drain()
        finally:
            self.discard()

    def discard(self) -> None:
        """Forget what is held and remove the spilled files (a round that failed)."""
        self.held.clear()
        self._unresolved.clear()
        self._waiting.clear()
        if self._spill_file is not None:
            self._spill_file.close()
            self._spill_file = None

    def _check_new(self, key: int) -> int:
        key = int(key)
        if key not in self._unresolved:
            raise ValueError(f"client {key} was not asked in this round, or answered twice")
        self._unresolved.discard(key)
        return key

    def _drain(self) -> Iterator[Contribution]:
        """The contributions ready, in key order, lazily: one in memory at a time."""
        while (
            not self.gated
            and self._next < len(self._order)
            and self._order[self._next] in self.held
        ):
            item = self.held.pop(self._order[self._next])
            self._next += 1
            self._waiting.discard(self._order[self._next - 1])
            if isinstance(item, _Spilled):
                yield item.load()
            elif item is not None:
                yield item

    def _spill(self, contribution: Contribution) -> _Spilled:
        if self._spill_file is None:
            self._spill_file = tempfile.TemporaryFile(
                prefix="fedunlearn-reorder-", dir=self.spill_dir
            )
        file, offsets = self._spill_file, []
        file.seek(0, 2)
        for _, array in contribution.arrays:
            offsets.append(file.tell())
            np.save(file, array, allow_pickle=False)
        self.spilled += 1
        names = [name for name, _ in contribution.arrays]
        return _Spilled(
            contribution.key, names, file, offsets, contribution.weight, contribution.extra
        )


class WeightedSum:
    """Σ_k (N_k / N) x_k over the contributions folded, in the order they are folded.

    ``expected_weights`` (key -> N_k declared) gives N; each :meth:`fold` adds
    ``x_k * (N_k / N)`` array by array exactly as Flower's ``aggregate_arrayrecords`` does (the
    first client's product starts each sum, the next are added in place). :meth:`result` rescales
    by N / N_folded when the folded clients' counts do not sum to N (a dropout).
    """

    def __init__(self, expected_weights: Mapping[int, int | float]) -> None:
        if not expected_weights:
            raise ConfigError("expected_weights", "{}", "at least one client")
        for key, weight in expected_weights.items():
            if not (isinstance(weight, numbers.Real) and weight > 0):
                raise ConfigError("expected_weights", f"{key}: {weight!r}", "counts > 0")
        self.expected = dict(expected_weights)
        self.total = sum(self.expected.values())
        self.folded: list[int] = []
        self.folded_weight: int | float = 0
        self._sum: dict[str, np.ndarray] = {}

    def fold(self, contribution: Contribution) -> None:
        """Add one client's arrays, weighted by its reported N_k over the expected N."""
        factor = contribution.weight / self.total
        for name, value in contribution.arrays:
            if name not in self._sum:
                self._sum[name] = value * factor
            else:
                self._sum[name] += value * factor
        self.folded.append(contribution.key)
        self.folded_weight += contribution.weight

    def result(self) -> dict[str, np.ndarray] | None:
        """The weighted average of the folded clients (None when none was folded)."""
        if not self.folded:
            return None
        if self.folded_weight != self.total:
            scale = self.total / self.folded_weight
            return {name: value * scale for name, value in self._sum.items()}
        return self._sum
