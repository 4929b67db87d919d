"""Method registries: one per kind (unlearning methods, scrubbing methods, audited models, the
judge's metrics), each mapping a name to its implementation and to what it needs. What an entry
holds and what a registry does (:class:`MethodSpec`, :class:`Registry`) is
:mod:`fedunlearn.method_spec`. The built-in entries are :mod:`fedunlearn.unlearning_registry` and
:mod:`fedunlearn.scrubbing_registry` (and :mod:`fedunlearn.audit_registry`); this module gathers
the registries, answers the questions asked of several of them, and ends with the entries a user
adds (one line each, at its end, registered after the built-in ones).

The core never imports the server layer (nor Flower): an entry names its implementation as a
``"module:function"`` string, imported when the method runs (:meth:`MethodSpec.resolve`), or holds
the callable itself (a test's toy method). The run config's method lists and their validation,
the unlearning/scrubbing runner and the membership audit all read these registries, so adding a
method is one module plus one :meth:`Registry.register` line (``docs/adding-a-method.md``; a method
that keeps its own history during training names its retention policy class, ``retention=``, and
one with settings of its own declares its run-config keys, ``keys=(MethodKey(...), ...)``, which
the configuration then accepts, checks, documents and reads as ``config.<key>``)::

    from fedunlearn.registry import SCRUBBING
    SCRUBBING.register("zero-head", "my_methods:zero_head", needs=("trained-model",))

An implementation is called as ``implementation(context, name)`` with the phase's context (on the
server: :class:`server.unlearning.request.UnlearningContext` or :class:`server.scrubbing.methods.ScrubContext`)
and returns the new model's state dict, or ``(state dict, details)`` with a JSON-able ``details``
dict that the phase's log records.
"""

from __future__ import annotations

# The noqa: F401 names are for the entries appended at the end, as the built-in entries use them
# (docs/adding-a-method.md).
from fedunlearn.audit_registry import AUDITED, JUDGE_METRICS  # noqa: F401 (re-exported)
from fedunlearn.config.constraints import Flag, Interval, Options  # noqa: F401
from fedunlearn.config.fields import (  # noqa: F401
    AT_LEAST_1,
    NON_NEGATIVE,
    NUMBER,
    POSITIVE,
    WHOLE,
    MethodKey,
    lazy_names,
)
from fedunlearn.errors import ConfigError
from fedunlearn.messages import PRUNE_QUERY, SCRUB_QUERY, TRAIN  # noqa: F401
from fedunlearn.method_spec import (  # noqa: F401 (re-exported: what a registry entry is)
    AGGREGATIONS,
    DEFAULT_OBJECTIVE,
    METHOD_NAME,
    NEEDS,
    STATISTICS,
    STORE_CONTENTS,
    TRAJECTORY_KEEPS,
    WEIGHTED_MEAN,
    MethodSpec,
    Registry,
)
from fedunlearn.scrubbing_registry import SCRUBBING
from fedunlearn.unlearning_registry import UNLEARNING

#: What the run's unlearning methods keep during training (:class:`Registry`'s and
#: :class:`MethodSpec`'s methods, over :data:`UNLEARNING`).
retention_policies = UNLEARNING.retention_policies
trajectory_serves = UNLEARNING.trajectory_serves
run_retention = UNLEARNING.run_retention
norms_problem = MethodSpec.norms_problem

#: The method every other is judged against (the audit, the comparison tables).
REFERENCE = "fedretrain"


def audited_models() -> list[tuple[str, MethodSpec]]:
    """Every model the membership audit compares, in its table's order: the original, the
    reference (:data:`REFERENCE`), the other unlearning methods, the scrubbing methods, then the
    rest of :data:`AUDITED` (the certified heads)."""
    unlearning = sorted(UNLEARNING, key=lambda spec: spec.name != REFERENCE)
    rest = [spec for spec in AUDITED if spec.name != "original"]
    return [(spec.name, spec) for spec in [AUDITED["original"], *unlearning, *SCRUBBING, *rest]]


def client_objectives() -> dict[str, MethodSpec]:
    """Every client objective a registered method declares -> its entry
    (:attr:`MethodSpec.objectives`): the unlearning methods', then the scrubbing methods'. Read
    on each call, so that an entry registered at run time counts; an objective that entries of
    both registries declare is refused (a message could not say whose it is)."""
    unlearning, scrubbing = UNLEARNING.objectives(), SCRUBBING.objectives()
    for name in unlearning.keys() & scrubbing.keys():
        owners = f"{unlearning[name].name} or {scrubbing[name].name}"
        raise ConfigError("objectives", name, f"an objective of one entry, not of {owners}")
    return {**unlearning, **scrubbing}


# ---------------------------------------------------------------------- entries a user adds
# One line each (docs/adding-a-method.md), e.g.
# SCRUBBING.register("zero-head", "server.zero_head:zero_head", needs=("trained-model",))
