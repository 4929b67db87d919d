"""Method registries: one per kind (unlearning methods, scrubbing methods, audited models, the
judge's metrics), each mapping a name to its implementation and to what it needs. What an entry
holds and what a registry does (:class:`MethodSpec`, :class:`Registry`) is
:mod:`fedunlearn.method_spec`; this module holds the entries.

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

from collections.abc import Iterable

from fedunlearn.errors import ConfigError
from fedunlearn.messages import PRUNE_QUERY, SCRUB_QUERY, TRAIN
from fedunlearn.method_spec import (  # noqa: F401 (re-exported: what a registry entry is)
    AGGREGATIONS,
    METHOD_NAME,
    NEEDS,
    STATISTICS,
    STORE_CONTENTS,
    TRAJECTORY_KEEPS,
    WEIGHTED_MEAN,
    MethodSpec,
    Registry,
)
from fedunlearn.store.retention import RetentionPolicy

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


def trajectory_serves(spec: MethodSpec) -> tuple[str, ...]:
    """The policies whose history ``spec``'s adopted trajectory keeps
    (:attr:`MethodSpec.trajectory_keeps`): every registered one, its own, or none."""
    if spec.trajectory_keeps == "every":
        return tuple(retention_policies())
    own = spec.policy()
    return (own.name,) if spec.trajectory_keeps == "own" and own is not None else ()


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

UNLEARNING.register(
    "keep-training",
    "server.unlearning.keep_training:keep_training",
    needs=("trained-model",),
    messages=_TRAIN,
    default=False,
    sampling_note="its budget is spent over every remaining client each round",
    offline=True,
    offline_note="trains the remaining clients there",
    description="no unlearning: the remaining clients go on training the original model for another method's client-epochs (Mora & Bellavista 2025)",
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
