"""The timed method loop shared by the unlearning and scrubbing phases: run whatever the registries
(:mod:`fedunlearn.registry`) hold for this run, time each method, save its model, log it and
publish the phase's table.

A method is called as ``implementation(context, name)`` and returns the new model's state dict,
``(state dict, details)``, or None when it does not apply to this run (it logs why; it then has no
model, no time and no row). Statistics several methods need (``MethodSpec.needs``, e.g. the head's
sums) are gathered once through :class:`SharedStatistics`; a method's time is its own work plus the
gathering of every statistic it needs, whichever method happened to gather it first. A method
whose rounds diverged in the clients' training gets, in the unlearning request, a row flagged
"diverged" (its model: the one the diverged round sent), not a crash that would take the other
methods' rows with it. Given a ``refusal`` rule (:meth:`MethodRunner.run_all`), a method is
refused before it starts when the rule says why (clients missing, a budget refused), and a method
that cannot go on with the replies it got (:data:`CANNOT_GO_ON`) is refused when it stops; either
way it has no row, ``refused`` says why, and the other methods run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import pandas as pd

from fedunlearn.errors import TooFewReplies
from fedunlearn.progress import Progress
from fedunlearn.registry import MethodSpec
from fedunlearn.store.run_directory import RunDirectory
from fedunlearn.training.model_state import State
from server.federation.availability import OfflineClients
from server.federation.metering import Cost, MeteredGrid
from server.progress import Log
from server.training.rounds import DivergedRound

#: What a method raises when it cannot go on with the replies it got: too few usable replies (a
#: round under ``min-reply-fraction``, FedRecover's ``NotEnoughReplies``, a calibration nobody
#: answered), or too few of its clients connected.
CANNOT_GO_ON = (TooFewReplies, OfflineClients)


def non_finite_tensors(state: State) -> list[str]:
    """The names of ``state``'s floating tensors holding NaN or inf (a model that is no result)."""
    return [
        key
        for key, value in state.items()
        if hasattr(value, "is_floating_point")
        and value.is_floating_point()
        and not bool(value.isfinite().all())
    ]


def diverged_methods(details: Mapping[str, Mapping]) -> dict[str, str]:
    """Why each method whose rounds diverged did (its ``details["diverged"]``), by method."""
    return {m: str(d["diverged"]) for m, d in details.items() if d.get("diverged")}


class SharedStatistics:
    """Statistics computed once per phase and reused by every method that needs them."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self.seconds: dict[str, float] = {}

    def get(self, key: str, compute: Callable[[], object]) -> object:
        """``compute()`` the first time ``key`` is asked for (timed), the cached value after."""
        if key not in self.values:
            started = time.perf_counter()
            self.values[key] = compute()
            self.seconds[key] = time.perf_counter() - started
        return self.values[key]


class MethodRunner:
    """Times, saves and logs the models of one phase; ``models``, ``seconds`` and ``details`` hold
    them in the order they ran.

    ``label`` prefixes each method's log line (``"scrub "``); ``suffix`` ends each model file's
    name (``-<request>`` for a later unlearning request); ``shared``: the statistics the phase's
    methods share (their context holds the same object); ``flag_divergence``: a method whose
    rounds diverged gets a row (the model the diverged round sent, ``details["diverged"]``) for a
    phase whose table flags it (the unlearning request's); elsewhere the phase ends, loudly.
    """

    def __init__(
        self,
        run: RunDirectory,
        *,
        log: Log,
        label: str = "",
        suffix: str = "",
        shared: SharedStatistics | None = None,
        flag_divergence: bool = False,
    ) -> None:
        self.run = run
        self.flag_divergence = flag_divergence
        self.log = log
        self.label = label
        self.suffix = suffix
        self.shared = shared if shared is not None else SharedStatistics()
        self.models: dict[str, State] = {}
        self.seconds: dict[str, float] = {}
        self.details: dict[str, dict] = {}
        self.costs: dict[str, Cost] = {}
        #: the methods refused in this phase (method -> why), by the ``refusal`` rule of
        #: :meth:`run_all` or because they could not go on
        self.refused: dict[str, str] = {}

    def add(self, name: str, state: State) -> None:
        """A model the phase compares but does not build (the trained model)."""
        self.models[name] = state

    def time(
        self,
        name: str,
        build: Callable[[], State | tuple[State, dict] | None],
        *,
        model_file: str,
        needs: Iterable[str] = (),
    ) -> State | None:
        """Run ``build``, charge it its time and that of the statistics it ``needs``, save the
        model as ``model_file`` (plus the suffix) and log it; returns the state (None: skipped)."""
        gathered = set(self.shared.seconds)
        started = time.perf_counter()
        result = build()
        elapsed = time.perf_counter() - started
        if result is None:
            return None
        state, details = result if isinstance(result, tuple) else (result, None)
        fresh = sum(s for key, s in self.shared.seconds.items() if key not in gathered)
        shared = sum(self.shared.seconds.get(key, 0.0) for key in needs)
        self.models[name] = state
        self.seconds[name] = elapsed - fresh + shared
        broken = non_finite_tensors(state) if self.flag_divergence else []
        if broken and not (details or {}).get("diverged"):
            # e.g. FedAccum's uncalibrated sum on BatchNorm: a negative running variance, NaN loss
            why = f"its model holds non-finite values (NaN or inf) in {', '.join(broken[:3])}"
            details = {**(details or {}), "diverged": why}
            self.log(f"{self.label}{name}: {why}; its row is flagged")
        if details is not None:
            self.details[name] = details
        self.run.save_model(f"{model_file}{self.suffix}", state)
        self.log(f"{self.label}{name}: {self.seconds[name]:.1f}s")
        return state

    def run_all(
        self,
        specs: Iterable[MethodSpec],
        context,
        *,
        refusal: Callable[[MethodSpec], str | None] | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Run every registered method of ``specs`` on ``context``, in order; a context with a
        ``grid`` gives each method a metered one (its clients' work and traffic: ``costs``).

        ``refusal(spec)``: why ``spec`` is refused now (None: it runs), asked before each method;
        with it, a method that raises one of :data:`CANNOT_GO_ON` is refused too. A refused
        method has no model and no row; :attr:`refused` says why. ``progress`` counts each
        method done or refused."""
        grid = getattr(context, "grid", None)
        try:
            for spec in specs:
                why = refusal(spec) if refusal is not None else None
                if why is not None:
                    self._refuse(spec.name, why)
                    if progress is not None:
                        progress.advance()
                    continue
                implementation = spec.resolve()
                if grid is not None:
                    context.grid = MeteredGrid(grid)
                    self.costs[spec.name] = context.grid.cost
                self.time(
                    spec.name,
                    lambda implementation=implementation, name=spec.name: self._guarded(
                        implementation, context, name, refusing=refusal is not None
                    ),
                    model_file=spec.model_file or f"model_{spec.name}",
                    needs=spec.needs,
                )
                if progress is not None:
                    progress.advance()
        finally:
            if grid is not None:
                context.grid = grid

    def _guarded(self, implementation, context, name: str, *, refusing: bool = False):
        """``implementation(context, name)``; when one of its rounds diverged in the clients'
        training (:class:`DivergedRound`), the model that round sent, with ``details["diverged"]``
        (a flagged row, never adopted) instead of a crash that would end every other row;
        ``refusing``: None (no row, :attr:`refused`) when it cannot go on with the replies it got."""
        try:
            return implementation(context, name)
        except DivergedRound as diverged:
            if diverged.state is None or not self.flag_divergence:
                raise
            self.log(f"{self.label}{name}: {diverged}; its row is the model that round sent")
            return diverged.state, {"did": f"{name} diverged", "diverged": str(diverged)}
        except CANNOT_GO_ON as stopped:
            if not refusing:
                raise
            self._refuse(name, f"it could not go on with the replies it got: {stopped}")
            return None

    def _refuse(self, name: str, why: str) -> None:
        self.refused[name] = why
        self.costs.pop(name, None)
        self.log(f"{self.label}{name} refused: {why}")

    def publish(
        self,
        name: str,
        table: pd.DataFrame,
        *,
        title: str,
        floatfmt: str,
        console: Callable[[pd.DataFrame], str] | None = None,
    ) -> None:
        """Write the phase's table (``<name><suffix>.csv/.md``, every column) and log it, as
        ``console`` shows it when given (else the whole table)."""
        self.run.write_table(f"{name}{self.suffix}", table, floatfmt=floatfmt)
        shown = console(table) if console else table.to_markdown(index=False, floatfmt=floatfmt)
        self.log(f"{title}:\n{shown}")
