"""The built-in scrubbing methods (Golatkar et al.) and their baselines: :data:`SCRUBBING`, one
:meth:`Registry.register` entry each. :mod:`fedunlearn.registry` re-exports it with the other
registries, and a method a user adds goes at the end of that module (``docs/adding-a-method.md``)."""

from __future__ import annotations

from fedunlearn.messages import PRUNE_QUERY, SCRUB_QUERY, TRAIN
from fedunlearn.method_spec import Registry

#: Scrubbing methods (Golatkar et al.) and their baselines, run by ``server.scrubbing.phase``; saved as
#: ``model_scrub_<name>``. ``original`` and ``retrain`` always run and are not registered.
SCRUBBING = Registry(
    "scrubbing method", "scrub-methods", model_prefix="model_scrub_", group="scrubbing"
)

_TRAIN = (TRAIN,)
_SCRUB_QUERY = (SCRUB_QUERY,)
_SCRUB = "server.scrubbing.methods"
_CLIENT_STEPS = "clients.objectives"  # the client objectives, imported on the client when asked

for _name, _colour, _gradient, _description in (
    ("newton", "#17becf", "retained", "eq. 7 on the linear head with the exact Hessian of D_r"),
    (
        "newton-forget-only",
        "#0b6e78",
        "forgotten",
        "Section 3.2: eq. 7 from D_f's gradient, cached H_D",
    ),
):
    SCRUBBING.register(
        _name,
        f"{_SCRUB}:newton",
        needs=("trained-model", "head-statistics"),
        messages=_SCRUB_QUERY,
        options={"lambda": "scrub-newton-lambda", "gradient": _gradient},
        colour=_colour,
        description=_description,
    )
SCRUBBING.register(
    "newton-finite",
    f"{_SCRUB}:newton_finite",
    needs=("trained-model", "head-statistics"),
    messages=_SCRUB_QUERY,
    options={"lambda": "scrub-newton-lambda"},
    colour="#7fd3dc",
    description="eq. 6: the finite-time scrub of the head, plus eq. 7's noise",
)
for _name, _colour, _options, _description in (
    ("fisher", "#e377c2", {"power": -0.25}, "eq. 8: Fisher forgetting, std F^(-1/4)"),
    ("fisher-sqrt", "#9c2f7f", {"power": -0.5}, "the appendix's Fisher forgetting, std F^(-1/2)"),
    ("fisher-reference", "#9400d3", {"reference": True}, "the authors' released Fisher recipe"),
):
    SCRUBBING.register(
        _name,
        f"{_SCRUB}:fisher",
        needs=("trained-model", "fisher-statistics"),
        messages=_SCRUB_QUERY,
        options={"lambda": f"scrub-{_name}-lambda", **_options},
        colour=_colour,
        description=_description,
    )
# Each baseline's clients run its objective (finetune: plain training) on the data ``clients`` says.
for _name, _colour, _objectives, _clients, _description in (
    ("finetune", "#bcbd22", {}, "retained", "Section 5.2's baseline: fine-tune on D_r"),
    (
        "negative-gradient",
        "#d9a400",
        {"negative-gradient": f"{_CLIENT_STEPS}:negative_gradient_step"},
        "forgotten",
        "gradient ascent on D_f",
    ),
    (
        "random-labels",
        "#6b6ecf",
        {"random-labels": f"{_CLIENT_STEPS}:random_labels_step"},
        "forgotten",
        "train D_f with random labels",
    ),
):
    SCRUBBING.register(
        _name,
        f"{_SCRUB}:baseline_rounds",
        needs=("trained-model",),
        messages=_TRAIN,
        objectives=_objectives,
        options={"clients": _clients},
        colour=_colour,
        description=_description,
    )
SCRUBBING.register(
    "hiding",
    f"{_SCRUB}:hiding",
    needs=("trained-model",),
    colour="#5fb85f",
    description="server only: the forgotten class's head row re-initialised (class cohorts)",
)
SCRUBBING.register(
    "class-pruning",
    "server.scrubbing.class_pruning:class_pruning",
    needs=("trained-model",),
    messages=(PRUNE_QUERY, TRAIN),
    colour="#c49c94",
    description="Wang et al. 2022: prune the class's top TF-IDF channels, fine-tune on D_r",
)
