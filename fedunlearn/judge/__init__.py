"""The judge: per-example forgetting tests over populations of models (Flower-free)."""

from fedunlearn.judge.bootstrap import (
    Estimate,
    bootstrap_interval,
    bootstrap_two_samples,
    mean_interval,
    roc_bootstrap,
)
from fedunlearn.judge.forgetting_score import (
    ForgettingScore,
    bucket_scores,
    challenge_confidence,
    final_score,
    forgetting_score,
    per_example_epsilons,
)
from fedunlearn.judge.metrics import (
    comparison_population,
    lira_confidences,
    rmia_population_scores,
    rmia_reference_sweep,
)
from fedunlearn.judge.populations import INDEPENDENT, ORIGINAL, REFERENCE, JudgeData, Outputs
from fedunlearn.judge.report import (
    DISTINGUISHABLE,
    INDISTINGUISHABLE,
    NO_SIGNAL,
    judge_figure,
    judge_markdown,
    judge_table,
    judge_verdicts,
    population_order,
    separated,
    write_judge_report,
)
from fedunlearn.judge.rmia import (
    attack_summary,
    rmia_member_scores,
    rmia_scores,
    true_label_probability,
)
from fedunlearn.judge.ulira import ULiraResult, ulira, ulira_scores, ulira_summary

__all__ = [
    "DISTINGUISHABLE",
    "INDEPENDENT",
    "INDISTINGUISHABLE",
    "NO_SIGNAL",
    "ORIGINAL",
    "REFERENCE",
    "Estimate",
    "ForgettingScore",
    "JudgeData",
    "Outputs",
    "ULiraResult",
    "attack_summary",
    "bootstrap_interval",
    "bootstrap_two_samples",
    "bucket_scores",
    "challenge_confidence",
    "comparison_population",
    "final_score",
    "forgetting_score",
    "judge_figure",
    "judge_markdown",
    "judge_table",
    "judge_verdicts",
    "lira_confidences",
    "mean_interval",
    "roc_bootstrap",
    "per_example_epsilons",
    "population_order",
    "rmia_member_scores",
    "rmia_population_scores",
    "rmia_reference_sweep",
    "rmia_scores",
    "separated",
    "true_label_probability",
    "ulira",
    "ulira_scores",
    "ulira_summary",
    "write_judge_report",
]
