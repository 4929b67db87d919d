"""Method registries: one per kind (unlearning methods, scrubbing methods, audited models, the
judge's metrics), each mapping a name to its implementation and to what it needs.

The core never imports the server layer (nor Flower): an entry names its implementation as a
``"module:function"`` string, imported when the method runs (:meth:`MethodSpec.resolve`), or holds
the callable itself (a test's toy method). The run config's method lists and their validation,
the unlearning/scrubbing runner and the membership audit all read these registries, so adding a
method is one module plus one :meth:`Registry.register` line (``docs/adding-a-method.md``; a method
that keeps its own history during training names its retention policy class, ``retention=``)::

    from fedunlearn.registry import SCRUBBING
    SCRUBBING.register("zero-head", "my_methods:zero_head", needs=("trained-model",))

An implementation is called as ``implementation(context, name)`` with the phase's context (on the
server: :class:`server.unlearning.request.UnlearningContext` or :class:`server.scrubbing.methods.ScrubContext`)
and returns the new model's state dict, or ``(state dict, details)`` with a JSON-able ``details``
dict that the phase's log records.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fedunlearn.errors import ConfigError, did_you_mean
from fedunlearn.messages import PRUNE_QUERY, SCRUB_QUERY, TRAIN
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
    description : str
        One line for listings and docs.
    """

    name: str
    implementation: str | Callable[..., Any] | None = None
    needs: tuple[str, ...] = ()
    retention: type | str | None = None
    messages: tuple[str, ...] = ()
    certifies: bool = False
    adoptable: bool = False
    trajectory_keeps: str | None = None
    norms_suffice: bool = False
    aggregations: tuple[str, ...] | None = None
    sampling: bool = False
    sampling_note: str = "not verified with clients sampled per round"
    offline: bool = False
    offline_note: str = "it has no rule for a remaining client that cannot be asked"
    target_participates: bool = False
    default: bool = True
    model_file: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", tuple(self.needs))
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
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
        policy = _imported(self.retention)
        if not (isinstance(policy, type) and issubclass(policy, RetentionPolicy)):
            raise ConfigError("retention", self.retention, "a RetentionPolicy subclass")
        return policy

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

    def trajectory_serves(self) -> tuple[str, ...]:
        """The policies whose history its adopted trajectory keeps (:attr:`trajectory_keeps`)."""
        if self.trajectory_keeps == "every":
            return tuple(retention_policies())
        own = self.policy()
        return (own.name,) if self.trajectory_keeps == "own" and own is not None else ()


def _imported(value):
    """A callable or class, or ``"module:name"`` imported now."""
    if not isinstance(value, str):
        return value
    module, _, name = value.partition(":")
    return getattr(importlib.import_module(module), name)


class Registry:
    """Name -> :class:`MethodSpec`, in registration order, for one kind of method.

    ``parameter`` is the run-config key that selects from it (errors name it); ``model_prefix``
    gives a registered method its default ``model_file`` (``model_prefix + name``).
    """

    def __init__(self, kind: str, parameter: str, *, model_prefix: str | None = None) -> None:
        self.kind = kind
        self.parameter = parameter
        self.model_prefix = model_prefix
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
        self._specs[name] = spec
        return spec

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


#: Unlearning methods (Liu et al., FedEraser, Section V), run by ``server.unlearning.request``; their
#: models are saved as ``model_<name>`` (``-<request>`` after the first request).
UNLEARNING = Registry("unlearning method", "unlearn-methods", model_prefix="model_")
#: Scrubbing methods (Golatkar et al.) and their baselines, run by ``server.scrubbing.phase``; saved as
#: ``model_scrub_<name>``. ``original`` and ``retrain`` always run and are not registered.
SCRUBBING = Registry("scrubbing method", "scrub-methods", model_prefix="model_scrub_")


def retention_policies(methods: Iterable[str] | None = None) -> dict[str, type[RetentionPolicy]]:
    """The policy class of each retention need, by its name, in registration order: of
    ``methods`` (registered unlearning methods), or of every registered one. Two policy classes
    under one name are refused (their selections would share one record)."""
    wanted = None if methods is None else {UNLEARNING[name].name for name in methods}
    found: dict[str, type[RetentionPolicy]] = {}
    for spec in UNLEARNING:
        policy = spec.policy() if wanted is None or spec.name in wanted else None
        if policy is None:
            continue
        if found.setdefault(policy.name, policy) is not policy:
            raise ConfigError(
                "retention", policy.__qualname__, f"a policy name other than {policy.name!r}"
            )
    return found


def run_retention(config) -> list[RetentionPolicy]:
    """The policies a training run keeps, each built from the config: those of its
    ``unlearn-methods``; those of the default methods when none of its methods reads a history
    (so that a later request can run them); none when ``retain`` is false."""
    if not config.retain:
        return []
    policies = retention_policies(config.methods) or retention_policies(
        UNLEARNING.names(default=True)
    )
    return [policy.from_config(config) for policy in policies.values()]


def norms_problem(spec: MethodSpec) -> str | None:
    """Why ``spec`` cannot run on a ``retain-mode = norms`` history (None when it can): the whole
    updates its policy keeps after round t_1 are not kept."""
    policy = spec.policy()
    if policy is None or not policy.keeps_updates or spec.norms_suffice:
        return None
    return f"{spec.name} needs {policy.name} as whole updates"


#: Models the membership audit attacks beside every unlearning and scrubbing method
#: (:func:`audited_models`): the original, and the certified heads.
AUDITED = Registry("audited model", "mia")

_TRAIN = (TRAIN,)
_SCRUB_QUERY = (SCRUB_QUERY,)
_UNLEARNING = "server.unlearning.request"
_INTERVAL = "fedunlearn.unlearning.federaser:IntervalRetention"
_SCRUB = "server.scrubbing.methods"

UNLEARNING.register(
    "federaser",
    f"{_UNLEARNING}:federaser",
    retention=_INTERVAL,
    messages=_TRAIN,
    adoptable=True,
    trajectory_keeps="own",  # M̃^{t_j} and each applied Ũ_k, at Δt
    norms_suffice=True,
    aggregations=WEIGHTED_MEAN,  # eq. 2-3 rebuild a weighted mean of the calibrated updates
    sampling=True,
    sampling_note="eq. 2 over each retained round's remaining participants",
    offline=True,
    offline_note="calibrates each retained round with the remaining participants there",
    description="calibrated reconstruction from retained updates (Algorithm 1)",
)
UNLEARNING.register(
    "fedaccum",
    f"{_UNLEARNING}:fedaccum",
    retention=_INTERVAL,
    aggregations=WEIGHTED_MEAN,  # eq. 5 sums the weighted mean's terms
    sampling=True,
    sampling_note="each retained round adds its remaining participants' updates",
    description="the remaining clients' retained updates, accumulated uncalibrated (eq. 5)",
)
UNLEARNING.register(
    "fedretrain",
    f"{_UNLEARNING}:fedretrain",
    needs=("initial-model",),
    messages=_TRAIN,
    adoptable=True,
    trajectory_keeps="every",  # it retrains under every policy of the run
    sampling=True,
    sampling_note="retrains sampling the same fraction from the remaining clients",
    offline=True,
    offline_note="retrains the remaining clients there",
    description="FedAvg from the same initial model without the targets (the reference)",
)
UNLEARNING.register(
    "fedrecover",
    "server.unlearning.recovery:fedrecover",
    retention="fedunlearn.unlearning.fedrecover:EveryRound",
    messages=_TRAIN,
    default=False,
    aggregations=WEIGHTED_MEAN,  # Algorithm 2 aggregates estimated updates by their mean
    sampling=True,
    sampling_note="estimates each round's remaining participants; one without an L-BFGS pair yet computes exactly",
    description="retraining with L-BFGS-estimated client updates (Cao et al. 2023, Algorithm 2)",
)
UNLEARNING.register(
    "crab",
    "server.unlearning.recovery:crab",
    retention="fedunlearn.unlearning.crab:CrabSelector",
    messages=_TRAIN,
    default=False,
    aggregations=WEIGHTED_MEAN,  # renewal calibrates to the weighted mean's step sizes
    sampling=True,
    sampling_note="selects, bounds and renews over each round's participants",
    description="selective storage, adaptive rollback, calibrated renewal (Jiang et al. 2025)",
)
UNLEARNING.register(
    "sifu",
    "server.unlearning.recovery:sifu",
    retention="fedunlearn.unlearning.sifu:SensitivityRetention",
    messages=_TRAIN,
    certifies=True,
    default=False,
    aggregations=WEIGHTED_MEAN,  # the sensitivity bound is a client's share of the mean
    sampling=True,
    sampling_note="bounds over each round's participants S_n; retrains sampling the remaining",
    description="rollback within a sensitivity budget, noise, retraining (Fraboni et al. 2024)",
)

_BASELINES = "server.unlearning.baselines"
UNLEARNING.register(
    "rapid-retraining",
    f"{_BASELINES}:rapid_retraining",
    needs=("initial-model",),
    messages=_TRAIN,
    default=False,
    description="retraining with diagonal-Fisher quasi-Newton client steps (Liu et al. 2022)",
)
UNLEARNING.register(
    "pga",
    f"{_BASELINES}:pga",
    retention="fedunlearn.unlearning.pga:LastRoundRetention",
    messages=_TRAIN,
    target_participates=True,
    default=False,
    sampling_note="a sampled target may lack the last round's anchor",
    description="the leaving client's projected gradient ascent, then post-training (Halimi et al. 2022)",
)
UNLEARNING.register(
    "fedosd",
    "server.unlearning.fedosd:fedosd",
    messages=_TRAIN,
    target_participates=True,
    aggregations=WEIGHTED_MEAN,  # its post-training averages the projected gradients itself
    default=False,
    description="unlearning descent orthogonal to the others' gradients, non-reverting post-training (Pan et al. 2025)",
)
UNLEARNING.register(
    "fedquit",
    f"{_BASELINES}:fedquit",
    messages=_TRAIN,
    target_participates=True,
    default=False,
    description="the leaving client distils from a virtual teacher, then post-training (Mora et al. 2024)",
)
UNLEARNING.register(
    "fedau",
    f"{_BASELINES}:fedau",
    retention="fedunlearn.unlearning.fedau:AuxiliaryHeads",
    default=False,
    sampling_note="a sampled target may lack the last round's auxiliary head",
    description="the head combined with the target's auxiliary head, no client work (Gu et al. 2024)",
)

for _name, _gradient, _description in (
    ("newton", "retained", "eq. 7 on the linear head with the exact Hessian of D_r"),
    ("newton-forget-only", "forgotten", "Section 3.2: eq. 7 from D_f's gradient, cached H_D"),
):
    SCRUBBING.register(
        _name,
        f"{_SCRUB}:newton",
        needs=("trained-model", "head-statistics"),
        messages=_SCRUB_QUERY,
        options={"lambda": "scrub-newton-lambda", "gradient": _gradient},
        description=_description,
    )
SCRUBBING.register(
    "newton-finite",
    f"{_SCRUB}:newton_finite",
    needs=("trained-model", "head-statistics"),
    messages=_SCRUB_QUERY,
    options={"lambda": "scrub-newton-lambda"},
    description="eq. 6: the finite-time scrub of the head, plus eq. 7's noise",
)
for _name, _options, _description in (
    ("fisher", {"power": -0.25}, "eq. 8: Fisher forgetting, std F^(-1/4)"),
    ("fisher-sqrt", {"power": -0.5}, "the appendix's Fisher forgetting, std F^(-1/2)"),
    ("fisher-reference", {"reference": True}, "the authors' released Fisher recipe"),
):
    SCRUBBING.register(
        _name,
        f"{_SCRUB}:fisher",
        needs=("trained-model", "fisher-statistics"),
        messages=_SCRUB_QUERY,
        options={"lambda": f"scrub-{_name}-lambda", **_options},
        description=_description,
    )
for _name, _objective, _clients, _description in (
    ("finetune", "train", "retained", "Section 5.2's baseline: fine-tune on D_r"),
    ("negative-gradient", "negative-gradient", "forgotten", "gradient ascent on D_f"),
    ("random-labels", "random-labels", "forgotten", "train D_f with random labels"),
):
    SCRUBBING.register(
        _name,
        f"{_SCRUB}:baseline_rounds",
        needs=("trained-model",),
        messages=_TRAIN,
        options={"objective": _objective, "clients": _clients},
        description=_description,
    )
SCRUBBING.register(
    "hiding",
    f"{_SCRUB}:hiding",
    needs=("trained-model",),
    description="server only: the forgotten class's head row re-initialised (class cohorts)",
)
SCRUBBING.register(
    "class-pruning",
    "server.scrubbing.class_pruning:class_pruning",
    needs=("trained-model",),
    messages=(PRUNE_QUERY, TRAIN),
    description="Wang et al. 2022: prune the class's top TF-IDF channels, fine-tune on D_r",
)

AUDITED.register("original", model_file="model_final", description="the trained model")
# The trained certified head is never written: with the data it determines b (the certificate's
# secret); server.certified.head.CertifiedHeadRun hands it over in memory. Its shadow is itself:
# a linear head's normalised sigmoids are not the original network's softmax.
AUDITED.register(
    "certified-head-trained",
    certifies=True,
    options={"shadow": "certified-head-trained"},
    description="the certified head before any removal (in memory only)",
)
AUDITED.register(
    "certified-head",
    model_file="certified_head",
    certifies=True,
    options={"shadow": "certified-head-trained"},
    description="the certified head after its removals",
)

#: The judge's metrics (:mod:`fedunlearn.judge.metrics`): each is called as
#: ``implementation(data, population, rng)`` on a :class:`fedunlearn.judge.JudgeData` and returns
#: ``{column: Estimate}``; ``options["columns"]`` lists its columns, in the table's order.
JUDGE_METRICS = Registry("judge metric", "judge-metrics")

for _name, _function, _columns, _description in (
    (
        "forgetting-score",
        "forgetting_score_metric",
        ("f", "final-score"),
        "the NeurIPS 2023 unlearning challenge's F and final score",
    ),
    (
        "ulira",
        "ulira_metric",
        ("ulira-accuracy", "ulira-tpr-1pct", "ulira-tpr-0.1pct"),
        "U-LiRA, Hayes et al. 2025: per-example Gaussians, leave one model out",
    ),
    (
        "rmia",
        "rmia_metric",
        ("rmia-auc", "rmia-tpr-0.1pct"),
        "offline RMIA, Zarifzadeh et al. 2024, retrained models as reference",
    ),
    ("lira", "lira_metric", ("lira-auc",), "offline LiRA, Carlini et al. 2022, same setting"),
    ("backdoor", "backdoor_metric", ("backdoor-success",), "planted trigger's attack success"),
    (
        "exposure",
        "exposure_metric",
        ("exposure-f", "exposure-ulira-accuracy"),
        "a retained client's exposure: F and U-LiRA on its samples",
    ),
    (
        "utility",
        "utility_metric",
        ("test-accuracy", "retain-accuracy", "seconds"),
        "accuracy on test and retained data, seconds per model",
    ),
):
    JUDGE_METRICS.register(
        _name,
        f"fedunlearn.judge.metrics:{_function}",
        options={"columns": _columns},
        description=_description,
    )

#: The method every other is judged against (the audit, the comparison tables).
REFERENCE = "fedretrain"


def audited_models() -> list[tuple[str, MethodSpec]]:
    """Every model the membership audit compares, in its table's order: the original, the
    reference (:data:`REFERENCE`), the other unlearning methods, the scrubbing methods, then the
    rest of :data:`AUDITED` (the certified heads)."""
    unlearning = sorted(UNLEARNING, key=lambda spec: spec.name != REFERENCE)
    rest = [spec for spec in AUDITED if spec.name != "original"]
    return [(spec.name, spec) for spec in [AUDITED["original"], *unlearning, *SCRUBBING, *rest]]
