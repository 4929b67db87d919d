"""The registries of what the audits measure besides the methods: the models the membership audit
attacks beside every unlearning and scrubbing method (:data:`AUDITED`: the original, the certified
heads) and the judge's metrics (:data:`JUDGE_METRICS`). The methods' own registries, and
:func:`fedunlearn.registry.audited_models` (every model the audit compares, in order), are
:mod:`fedunlearn.registry`, which re-exports these two."""

from __future__ import annotations

from fedunlearn.method_spec import Registry

#: Models the membership audit attacks beside every unlearning and scrubbing method
#: (:func:`fedunlearn.registry.audited_models`): the original, and the certified heads.
AUDITED = Registry("audited model", "mia")

AUDITED.register(
    "original", model_file="model_final", colour="#7f7f7f", description="the trained model"
)
# The trained certified head is never written: with the data it determines b (the certificate's
# secret); server.certified.head.CertifiedHeadRun hands it over in memory. Its shadow is itself:
# a linear head's normalised sigmoids are not the original network's softmax.
AUDITED.register(
    "certified-head-trained",
    certifies=True,
    options={"shadow": "certified-head-trained"},
    colour="#aec7e8",
    description="the certified head before any removal (in memory only)",
)
AUDITED.register(
    "certified-head",
    model_file="certified_head",
    certifies=True,
    options={"shadow": "certified-head-trained"},
    colour="#393b79",
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
