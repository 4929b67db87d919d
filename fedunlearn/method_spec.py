"""What a registry entry is and what a registry does: :class:`MethodSpec`, one registered method
(its implementation, what it needs from the run, the settings and promises it keeps), and
:class:`Registry`, name -> spec for one kind of method. The registries the rest of the code reads
are :mod:`fedunlearn.registry`; their built-in entries, :mod:`fedunlearn.unlearning_registry`,
:mod:`fedunlearn.scrubbing_registry` and :mod:`fedunlearn.audit_registry`.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fedunlearn.config.fields import MethodKey
from fedunlearn.errors import ConfigError, did_you_mean

if TYPE_CHECKING:  # imported where used: it imports PyTorch, which validating a config needs not
    from fedunlearn.store.retention import RetentionPolicy

#: A method's name: it selects the method in the run config (a comma-separated list) and names its
#: model file in the run directory, so nothing that could split a list or leave the directory.
METHOD_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")
#: What an adoptable method's trajectory keeps (``MethodSpec.trajectory_keeps``).
TRAJECTORY_KEEPS = (None, "own", "every")
#: What a method may need from the run besides its retention (its policy,
#: ``MethodSpec.retention``): the trained or initial model, or statistics the clients compute at
#: the server's request (the head's sums, the diagonal Fisher of D_r). Shared statistics are
#: collected once per run and their cost is added to every method that needs them.
STORE_CONTENTS = ("trained-model", "initial-model")
#: The Flower strategies a run may aggregate with (the config's ``strategy``,
#: ``strategies.aggregation``), and those whose result is the sample-weighted mean of the updates
#: (FedProx changes the clients' objective, not the server's mean): what FedEraser's eq. 2,
#: FedRecover's estimates, Crab's calibration and SIFU's bound assume.
AGGREGATIONS = ("fedavg", "fedprox", "fedmedian", "fedtrimmedavg", "krum")
WEIGHTED_MEAN = ("fedavg", "fedprox")
STATISTICS = ("head-statistics", "fisher-statistics")
NEEDS = STORE_CONTENTS + STATISTICS
#: The objective a client's training message runs when it names none (:mod:`clients.objectives`):
#: plain SGD. Every other objective is declared by the registry entry whose method asks for it
#: (``MethodSpec.objectives``), so no entry declares this one.
DEFAULT_OBJECTIVE = "train"
#: A method's colour in every figure (``MethodSpec.colour``): ``#rrggbb``.
COLOUR = re.compile(r"#[0-9a-fA-F]{6}")


@dataclass(frozen=True)
class MethodSpec:
    """One registered method (or audited model).

    Parameters
    ----------
    name : str
        The name the run config uses (``unlearn-methods``, ``scrub-methods``).
    implementation : str or callable or None
        ``"module:function"`` (imported on use) or the function itself; None for an audited model
        that no code of the audit builds (it reads the file the method saved).
    needs : tuple of str
        What else it reads from the run (:data:`NEEDS`): the trained or initial model, client
        statistics.
    retention : RetentionPolicy subclass or str or None
        Unlearning only: the policy that keeps, during training, the history it reads
        (:class:`fedunlearn.store.retention.RetentionPolicy`; ``"module:Class"`` is imported on
        use); None for a method that reads no history. Methods may share one policy.
    messages : tuple of str
        Flower message types it sends to clients (``"train"``, ``"query.scrub_stats"``, ...);
        empty for a server-only method.
    objectives : mapping
        The client objectives it asks clients to run, by the name its ``train`` messages send as
        ``objective``: name -> ``"module:function"`` (imported on use, on the client) or the
        function, called as ``function(model, x, y, config, setup, settings, attached)``
        (:mod:`clients.objectives`); the ClientApp runs every objective a registered entry
        declares, and the server reads the name here (:meth:`objective`), so it is written once.
        Empty: its clients run :data:`DEFAULT_OBJECTIVE`. With ``options["clients"] =
        "forgotten"`` they run on the forgotten data D_f of a message that names a cohort.
    certifies : bool
        Whether its removal comes with a certificate (a provable bound), not only a measurement.
    adoptable : bool
        Unlearning only: its trajectory can become the retained history after a request
        (``unlearn-adopt``).
    trajectory_keeps : str or None
        Unlearning, adoptable only: what its trajectory keeps once adopted (what a later
        request's methods may read): ``"own"``, its own policy's history, or ``"every"``, every
        policy's (it retrains under all of them); ``unlearn-adopt = auto`` passes over a method
        whose trajectory would not serve the request's methods when another candidate's does.
    norms_suffice : bool
        Unlearning only: of the updates retained after round t_1 it reads only their norms per
        tensor, so it runs on a ``retain-mode = norms`` history (FedEraser's eq. 2).
    aggregations : tuple of str or None
        Unlearning only: the aggregations (:data:`AGGREGATIONS`) its math assumes; a run with
        another ``strategy`` is refused before training, naming both. None: any (a method that only
        retrains, with the run's own aggregation).
    sampling, sampling_note : bool, str
        Unlearning only: whether it holds when clients are sampled per round (``fraction-train``
        < 1; else such a run is refused before training), and how, or why not (the refusal's text).
    offline, offline_note : bool, str
        Unlearning only: whether it goes on when remaining clients are offline at the request,
        with the clients there, and how (else, for a method that messages clients, the request
        refuses it, naming the offline clients, with ``offline_note``).
    stacks, stacks_note : bool, str
        Unlearning only: whether it runs over a stack of N federations (``stack-models``) giving
        each member the model a single run with that member's ``model-seed`` gives (tested member
        by member), and how, or why not (the refusal's text); a method that does not stack runs one
        federation per run.
    target_participates : bool
        Unlearning only: the leaving client works for it during the request (PGA, FedOSD, FedQUIT),
        a different promise from the others' (the target receives no message after the request):
        the run config must opt in (``allow-target-participation``).
    default : bool
        Whether the config's method list includes it by default (``unlearn-methods``,
        ``scrub-methods``); a method that needs more retained than the default run keeps is
        chosen explicitly.
    model_file : str or None
        The stem of the model file it saves in the run directory (``model_<name>``,
        ``model_scrub_<name>``): what the membership audit reads; None for a model never written.
    options : mapping
        Kind-specific settings read by its implementation (e.g. the config key of its lambda).
    keys : tuple of MethodKey
        The run-config keys that belong to this method alone (name, default, constraint,
        description: :class:`fedunlearn.config.fields.MethodKey`): the configuration accepts,
        validates and documents them in its registry's group, and ``config.<key>`` reads them.
    colour : str or None
        ``#rrggbb``, its colour in every figure; None: one picked from the name
        (:func:`fedunlearn.plots.style.method_colour`).
    description : str
        One line for listings and docs.
    """

    name: str
    implementation: str | Callable[..., Any] | None = None
    needs: tuple[str, ...] = ()
    retention: type | str | None = None
    messages: tuple[str, ...] = ()
    objectives: Mapping[str, str | Callable[..., Any]] = field(default_factory=dict)
    certifies: bool = False
    adoptable: bool = False
    trajectory_keeps: str | None = None
    norms_suffice: bool = False
    aggregations: tuple[str, ...] | None = None
    sampling: bool = False
    sampling_note: str = "not verified with clients sampled per round"
    offline: bool = False
    offline_note: str = "it has no rule for a remaining client that cannot be asked"
    stacks: bool = False
    stacks_note: str = "not verified to equal single runs member by member"
    target_participates: bool = False
    default: bool = True
    model_file: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[MethodKey, ...] = ()
    colour: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", tuple(self.needs))
        object.__setattr__(self, "keys", tuple(self.keys))
        _check_keys(self.keys)
        if self.colour is not None and not COLOUR.fullmatch(str(self.colour)):
            raise ConfigError("colour", self.colour, "'#rrggbb' or None")
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "objectives", MappingProxyType(dict(self.objectives)))
        _check_objectives(self.objectives)
        unknown = [need for need in self.needs if need not in NEEDS]
        if unknown:
            raise ConfigError("needs", unknown, f"entries of {', '.join(NEEDS)}")
        for key in ("implementation", "retention"):
            value = getattr(self, key)
            if isinstance(value, str) and ":" not in value:
                raise ConfigError(key, value, "'module:name'")
        if self.aggregations is not None:
            object.__setattr__(self, "aggregations", tuple(self.aggregations))
            wrong = [a for a in self.aggregations if a not in AGGREGATIONS]
            if wrong or not self.aggregations:
                raise ConfigError("aggregations", wrong, f"entries of {', '.join(AGGREGATIONS)}")
        if self.trajectory_keeps not in TRAJECTORY_KEEPS:
            raise ConfigError("trajectory_keeps", self.trajectory_keeps, "None, 'own' or 'every'")

    def resolve(self) -> Callable[..., Any]:
        """The implementation as a callable (importing ``module`` of ``"module:function"``)."""
        if self.implementation is None:
            raise ConfigError("implementation", None, f"a callable for {self.name!r}")
        return _imported(self.implementation)

    def policy(self) -> type[RetentionPolicy] | None:
        """Its retention policy class (imported on first use), or None."""
        if self.retention is None:
            return None
        from fedunlearn.store.retention import RetentionPolicy

        policy = _imported(self.retention)
        if not (isinstance(policy, type) and issubclass(policy, RetentionPolicy)):
            raise ConfigError("retention", self.retention, "a RetentionPolicy subclass")
        return policy

    def objective(self, which: str | None = None) -> str:
        """The name of the client objective it asks for (:attr:`objectives`), what its messages
        send as ``objective``: its only one (:data:`DEFAULT_OBJECTIVE` when it declares none),
        or, with ``which``, the one named ``which`` or ending in ``-<which>`` (FedOSD's
        ``"unlearning"`` and ``"gradient"``)."""
        names = list(self.objectives)
        if which is not None:
            names = [n for n in names if n == which or n.endswith(f"-{which}")]
        elif not names:
            return DEFAULT_OBJECTIVE
        if len(names) != 1:
            declared = ", ".join(self.objectives) or "none"
            raise ConfigError("objective", which, f"one objective of {self.name} ({declared})")
        return names[0]

    def client_step(self, objective: str) -> Callable[..., Any]:
        """The client function of one of its :attr:`objectives` (imported on first use)."""
        if objective not in self.objectives:
            declared = ", ".join(self.objectives) or "none"
            raise ConfigError("objective", objective, f"one of {self.name}'s: {declared}")
        return _imported(self.objectives[objective])

    def on_forgotten(self) -> bool:
        """Whether its clients' objectives run on the forgotten data D_f when a message names a
        cohort (``options["clients"] = "forgotten"``; else on the data they keep)."""
        return self.options.get("clients") == "forgotten"

    def aggregation_problem(self, strategy: str) -> str | None:
        """Why it cannot run on a run aggregated by ``strategy`` (None when it can)."""
        if self.aggregations is None or strategy in self.aggregations:
            return None
        return f"{self.name} assumes {' or '.join(self.aggregations)}, not {strategy}"

    def sampling_problem(self, fraction_train: float) -> str | None:
        """Why it cannot run with ``fraction_train`` of the clients per round (None: it can)."""
        if fraction_train >= 1 or self.sampling:
            return None
        return f"{self.name}: {self.sampling_note}"

    def norms_problem(self) -> str | None:
        """Why it cannot run on a ``retain-mode = norms`` history (None when it can): the whole
        updates its policy keeps after round t_1 are not kept."""
        policy = self.policy()
        if policy is None or not policy.keeps_updates or self.norms_suffice:
            return None
        return f"{self.name} needs {policy.name} as whole updates"


def _check_keys(keys: tuple[MethodKey, ...]) -> None:
    """Refuse a key that is not a :class:`MethodKey`, or one spelled twice."""
    for item in keys:
        if not isinstance(item, MethodKey):
            raise ConfigError("keys", item, "a tuple of fedunlearn.config.fields.MethodKey")
    spelled = [item.key for item in keys]
    twice = sorted({key for key in spelled if spelled.count(key) > 1})
    if twice:
        raise ConfigError("keys", twice[0], "each key declared once")


def _check_objectives(objectives: Mapping[str, Any]) -> None:
    """Refuse an objective named as no method may be (or :data:`DEFAULT_OBJECTIVE`, which the
    client always has), or one that is neither ``"module:function"`` nor a callable."""
    for name, function in objectives.items():
        if not isinstance(name, str) or not METHOD_NAME.fullmatch(name):
            raise ConfigError("objectives", name, "names of lower-case letters, digits and '-'")
        if name == DEFAULT_OBJECTIVE:
            raise ConfigError("objectives", name, f"a name other than {DEFAULT_OBJECTIVE!r}")
        if not (callable(function) or (isinstance(function, str) and ":" in function)):
            raise ConfigError(f"objectives[{name!r}]", function, "'module:function' or a callable")


def _imported(value):
    """A callable or class, or ``"module:name"`` imported now."""
    if not isinstance(value, str):
        return value
    module, _, name = value.partition(":")
    return getattr(importlib.import_module(module), name)


class Registry:
    """Name -> :class:`MethodSpec`, in registration order, for one kind of method.

    ``parameter`` is the run-config key that selects from it (errors name it); ``model_prefix``
    gives a registered method its default ``model_file`` (``model_prefix + name``); ``group`` is
    the configuration group its methods' own keys join (``MethodSpec.keys``; None: its entries
    declare none).
    """

    def __init__(
        self,
        kind: str,
        parameter: str,
        *,
        model_prefix: str | None = None,
        group: str | None = None,
    ) -> None:
        self.kind = kind
        self.parameter = parameter
        self.model_prefix = model_prefix
        self.group = group
        self._specs: dict[str, MethodSpec] = {}

    def register(
        self, name: str, implementation: str | Callable[..., Any] | None = None, **fields: Any
    ) -> MethodSpec:
        """Add a method; returns its spec. A name already registered is refused."""
        if not isinstance(name, str) or not METHOD_NAME.fullmatch(name):
            raise ConfigError(
                "name", name, "lower-case letters, digits and '-', starting with a letter"
            )
        if name in self._specs:
            raise ConfigError(
                "name", name, f"a {self.kind} name not registered yet ({', '.join(self.names())})"
            )
        if self.model_prefix is not None:
            fields.setdefault("model_file", f"{self.model_prefix}{name}")
        spec = MethodSpec(name, implementation, **fields)
        self._check_keys_free(spec)
        self._check_objectives_free(spec)
        self._specs[name] = spec
        return spec

    def _check_keys_free(self, spec: MethodSpec) -> None:
        """Refuse keys on a registry without a group, or a key another entry declares."""
        if spec.keys and self.group is None:
            raise ConfigError("keys", spec.keys[0].key, f"no keys: a {self.kind} has none")
        taken = {item.key: name for name, item in self.keys()}
        for item in spec.keys:
            if item.key in taken:
                raise ConfigError("keys", item.key, f"a key {taken[item.key]} does not declare")

    def _check_objectives_free(self, spec: MethodSpec) -> None:
        """Refuse an objective another entry declares (a message could not say whose it is)."""
        taken = self.objectives()
        for objective in spec.objectives:
            if objective in taken:
                raise ConfigError(
                    "objectives",
                    objective,
                    f"an objective {taken[objective].name} does not declare",
                )

    def objectives(self) -> dict[str, MethodSpec]:
        """Client objective -> the entry declaring it (:attr:`MethodSpec.objectives`), in
        registration order."""
        return {name: spec for spec in self._specs.values() for name in spec.objectives}

    def keys(self) -> tuple[tuple[str, MethodKey], ...]:
        """``(method, key)`` for every key its entries declare, in registration order."""
        return tuple((spec.name, item) for spec in self._specs.values() for item in spec.keys)

    def unregister(self, name: str) -> MethodSpec:
        """Remove a method (a test's toy); returns its spec."""
        spec = self[name]
        del self._specs[name]
        return spec

    @contextlib.contextmanager
    def registered(self, name: str, implementation=None, **fields: Any) -> Iterator[MethodSpec]:
        """Register a method for the duration of a ``with`` block (tests)."""
        spec = self.register(name, implementation, **fields)
        try:
            yield spec
        finally:
            self._specs.pop(name, None)

    def names(self, **where: Any) -> tuple[str, ...]:
        """The registered names, in order; ``where`` keeps those whose fields equal the values
        given (``names(adoptable=True)``)."""
        return tuple(
            name
            for name, spec in self._specs.items()
            if all(getattr(spec, key) == value for key, value in where.items())
        )

    def parse(self, value: str, *, allow_empty: bool = True) -> list[str]:
        """The names in a comma-separated config value, in the order given, each registered."""
        names = [m for m in str(value).replace(" ", "").lower().split(",") if m]
        wrong = [m for m in names if m not in self._specs]
        if wrong or not (names or allow_empty):
            hint = did_you_mean(wrong[0], self.names()) if wrong else ""
            raise ConfigError(
                self.parameter,
                value,
                f"a comma-separated subset of {', '.join(self.names())}{hint}",
            )
        return list(dict.fromkeys(names))

    # ------------------------------------------------------------------ retention (unlearning)
    def retention_policies(
        self, methods: Iterable[str] | None = None
    ) -> dict[str, type[RetentionPolicy]]:
        """The policy class of each retention need, by its name, in registration order: of
        ``methods`` (registered names), or of every registered one. Two policy classes under one
        name are refused (their selections would share one record)."""
        wanted = None if methods is None else {self[name].name for name in methods}
        found: dict[str, type[RetentionPolicy]] = {}
        for spec in self:
            policy = spec.policy() if wanted is None or spec.name in wanted else None
            if policy is None:
                continue
            if found.setdefault(policy.name, policy) is not policy:
                raise ConfigError(
                    "retention", policy.__qualname__, f"a policy name other than {policy.name!r}"
                )
        return found

    def trajectory_serves(self, spec: MethodSpec) -> tuple[str, ...]:
        """The policies whose history ``spec``'s adopted trajectory keeps
        (:attr:`MethodSpec.trajectory_keeps`): every registered one, its own, or none."""
        if spec.trajectory_keeps == "every":
            return tuple(self.retention_policies())
        own = spec.policy()
        return (own.name,) if spec.trajectory_keeps == "own" and own is not None else ()

    def run_retention(self, config) -> list[RetentionPolicy]:
        """The policies a training run keeps, each built from the config: those of its
        ``unlearn-methods``; those of the default methods when none of its methods reads a
        history (so that a later request can run them); none when ``retain`` is false."""
        if not config.retain:
            return []
        policies = self.retention_policies(config.methods) or self.retention_policies(
            self.names(default=True)
        )
        return [policy.from_config(config) for policy in policies.values()]

    # ------------------------------------------------------------------ lookup
    def __getitem__(self, name: str) -> MethodSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise ConfigError(self.parameter, name, f"one of {', '.join(self.names())}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[MethodSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)
