"""The judge's registered metrics: each reads a :class:`~fedunlearn.judge.populations.JudgeData`
and a population's name and returns ``{column: Estimate}`` (a value and its 95% bootstrap interval).

Every metric compares population P with a *comparison* population (:func:`comparison_population`):
the retrained models R = ``fedretrain``; for R itself the independent retrained set, and for that
set R again (retrain against retrain: the ceiling); ``original`` against R is the floor. Metrics are
listed in :data:`fedunlearn.registry.JUDGE_METRICS` (``"fedunlearn.judge.metrics:<function>"``), so
an attack is one module plus one ``register`` line; :func:`fedunlearn.judge.report.judge_table`
calls every registered one.
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax

from fedunlearn.errors import ConfigError
from fedunlearn.judge.bootstrap import (
    Estimate,
    bootstrap_interval,
    mean_interval,
    roc_bootstrap,
)
from fedunlearn.judge.forgetting_score import challenge_confidence, final_score, forgetting_score
from fedunlearn.judge.populations import INDEPENDENT, REFERENCE, JudgeData, Outputs
from fedunlearn.judge.rmia import attack_summary, rmia_member_scores, true_label_probability
from fedunlearn.judge.ulira import ulira_scores, ulira_summary
from fedunlearn.membership.lira import lira_offline, logit_confidence

#: Bootstrap resamples of every interval.
RESAMPLES = 1000


def comparison_population(population: str) -> str:
    """The population P is judged against: R (``fedretrain``), or for R the independent set, and
    for the independent set R (the ceiling)."""
    return INDEPENDENT if population == REFERENCE else REFERENCE


def _pair(data: JudgeData, population: str) -> tuple[Outputs, Outputs]:
    if population not in data.populations:
        raise ConfigError("population", population, f"one of {', '.join(data.populations)}")
    return data[population], data[comparison_population(population)]


def lira_confidences(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """LiRA's logit-scaled confidences (models, n) of (models, n, C) logits (Carlini et al. 2022;
    :func:`fedunlearn.membership.lira.logit_confidence` on the softmax)."""
    probs = softmax(np.asarray(logits, dtype=np.float64), axis=-1)
    return np.array([logit_confidence(p, np.asarray(labels)) for p in probs])


def _score_and_interval(unlearned: np.ndarray, retrained: np.ndarray, rng) -> Estimate:
    """F (challenge confidences (N, n) of both) with its interval over examples."""
    score = forgetting_score(unlearned, retrained)
    if len(score.scores) < 2:
        return Estimate(score.f, np.nan, np.nan)
    return mean_interval(score.scores, resamples=RESAMPLES, rng=rng)


def forgetting_score_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """``f`` and ``final-score`` of the challenge (:mod:`fedunlearn.judge.forgetting_score`) on the
    forget set; the final score's interval is F's scaled by the fixed utility ratios."""
    p, c = _pair(data, population)
    unlearned = challenge_confidence(p.forget_logits, p.forget_labels)
    retrained = challenge_confidence(c.forget_logits, c.forget_labels)
    f = _score_and_interval(unlearned, retrained, rng)
    ratio = final_score(1.0, p.retain_accuracy, c.retain_accuracy, p.test_accuracy, c.test_accuracy)
    return {"f": f, "final-score": f.scaled(ratio)}


def _ulira_estimates(
    unlearned: np.ndarray, retrained: np.ndarray, rng, *, tprs: bool = True
) -> list[Estimate]:
    """U-LiRA's accuracy, and (``tprs``) TPR at 1% and at 0.1% FPR, intervals over examples."""
    scores, labels = ulira_scores(unlearned, retrained)
    # The balanced accuracy is a mean over examples of each example's balanced accuracy, so its
    # resamples are means (fast); the TPRs rank the pooled scores again per resample.
    per_example = 0.5 * ((scores[labels] > 0).mean(axis=0) + (scores[~labels] <= 0).mean(axis=0))
    by_example = scores.T  # examples first: the bootstrap resamples examples
    accuracy = mean_interval(per_example, resamples=RESAMPLES, rng=rng)
    if not tprs:
        return [accuracy]
    return [accuracy] + [
        bootstrap_interval(
            by_example,
            lambda s, k=k: ulira_summary(s.T, labels)[k],
            resamples=RESAMPLES,
            rng=rng,
        )
        for k in (1, 2)
    ]


def ulira_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """U-LiRA (:mod:`fedunlearn.judge.ulira`) on the forget set: accuracy (0.5 = forgotten) and
    TPR at 1% and 0.1% FPR, intervals over forget examples."""
    p, c = _pair(data, population)
    estimates = _ulira_estimates(
        lira_confidences(p.forget_logits, p.forget_labels),
        lira_confidences(c.forget_logits, c.forget_labels),
        rng,
    )
    return dict(zip(("ulira-accuracy", "ulira-tpr-1pct", "ulira-tpr-0.1pct"), estimates))


def rmia_population_scores(
    data: JudgeData, population: str, reference_models: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """RMIA scores with each of P's models as target and the comparison population's first
    ``reference_models`` models (all by default) as OUT reference models: forget set (members of
    the original) ``(n_f, N)`` and population data (non-members) ``(n_p, N)``."""
    p, c = _pair(data, population)
    count = c.num_models if reference_models is None else reference_models
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise ConfigError(
            "reference_models", reference_models, f"an integer in [1, {c.num_models}]"
        )
    if not 1 <= count <= c.num_models:
        raise ConfigError(
            "reference_models", reference_models, f"an integer in [1, {c.num_models}]"
        )
    return rmia_member_scores(
        true_label_probability(p.forget_logits, p.forget_labels),
        true_label_probability(p.population_logits, p.population_labels),
        true_label_probability(c.forget_logits[:count], c.forget_labels),
        true_label_probability(c.population_logits[:count], c.population_labels),
    )


def _auc_and_tpr(
    members: np.ndarray, nonmembers: np.ndarray, rng, which: tuple[int, ...] = (0, 1)
) -> list[Estimate]:
    """AUC (0) and TPR at 0.1% FPR (1) of pooled scores, intervals over examples of each set."""
    both = roc_bootstrap(members, nonmembers, fpr=0.001, resamples=RESAMPLES, rng=rng)
    return [both[k] for k in which]


def rmia_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """Offline RMIA (:mod:`fedunlearn.judge.rmia`): AUC and TPR at 0.1% FPR of the forget set
    against population data, pooled over P's models, intervals over examples."""
    auc, tpr = _auc_and_tpr(*rmia_population_scores(data, population), rng)
    return {"rmia-auc": auc, "rmia-tpr-0.1pct": tpr}


def lira_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """Offline LiRA (:func:`fedunlearn.membership.lira.lira_offline`, global variance) in RMIA's
    setting: AUC of the forget set against population data, pooled over P's models."""
    p, c = _pair(data, population)
    n_f = len(p.forget_labels)
    target = np.concatenate(
        [
            lira_confidences(p.forget_logits, p.forget_labels),
            lira_confidences(p.population_logits, p.population_labels),
        ],
        axis=1,
    )
    reference = np.concatenate(
        [
            lira_confidences(c.forget_logits, c.forget_labels),
            lira_confidences(c.population_logits, c.population_labels),
        ],
        axis=1,
    )
    scores = np.array([lira_offline(row, reference) for row in target])
    (auc,) = _auc_and_tpr(scores[:, :n_f].T, scores[:, n_f:].T, rng, which=(0,))
    return {"lira-auc": auc}


def backdoor_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """Mean backdoor attack success over P's models, interval over models; missing when the run
    planted no trigger."""
    success = _pair(data, population)[0].backdoor_success
    if success is None:
        return {"backdoor-success": Estimate.missing()}
    return {"backdoor-success": mean_interval(success, resamples=RESAMPLES, rng=rng)}


def exposure_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """The retained client's exposure (Hayes et al. 2025, Sec. 6): F and U-LiRA accuracy of P
    against the comparison population on a retained client's samples (members of both); the
    ``original`` row is the exposure before unlearning."""
    p, c = _pair(data, population)
    f = _score_and_interval(
        challenge_confidence(p.retained_logits, p.retained_labels),
        challenge_confidence(c.retained_logits, c.retained_labels),
        rng,
    )
    accuracy = _ulira_estimates(
        lira_confidences(p.retained_logits, p.retained_labels),
        lira_confidences(c.retained_logits, c.retained_labels),
        rng,
        tprs=False,
    )[0]
    return {"exposure-f": f, "exposure-ulira-accuracy": accuracy}


def utility_metric(data: JudgeData, population: str, rng) -> dict[str, Estimate]:
    """Test and retain accuracy and seconds per model, means with intervals over models."""
    p = _pair(data, population)[0]
    return {
        column: mean_interval(values, resamples=RESAMPLES, rng=rng)
        for column, values in (
            ("test-accuracy", p.test_accuracy),
            ("retain-accuracy", p.retain_accuracy),
            ("seconds", p.seconds),
        )
    }


def reference_counts(num_models: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``num_models`` (which closes the sweep even when not a power of 2)."""
    counts = [1 << k for k in range(max(num_models, 1).bit_length()) if 1 << k < num_models]
    return (*counts, num_models)


def rmia_reference_sweep(
    data: JudgeData, population: str, counts: tuple[int, ...] | None = None
) -> list[dict[str, object]]:
    """RMIA's AUC and TPR at 0.1% FPR on P with 1, 2, 4, ... N reference models (the comparison
    population's first ones): how many retrained models the attack needs. One row per count."""
    available = _pair(data, population)[1].num_models
    rows = []
    for count in counts or reference_counts(available):
        auc, tpr = attack_summary(*rmia_population_scores(data, population, count))
        rows.append(
            {
                "population": population,
                "reference-models": count,
                "rmia-auc": auc,
                "rmia-tpr-0.1pct": tpr,
            }
        )
    return rows
