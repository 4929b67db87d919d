"""Synthetic judge populations: N models' logits on the forget, retained and population sets, with
the true class's logit drawn per (model, example) around an example-specific level."""

from __future__ import annotations

import numpy as np

from fedunlearn.judge import JudgeData, Outputs

CLASSES = 3


def logits_from_margins(margins: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(N, n, C) logits whose true class leads the others (all 0) by ``margins`` (N, n)."""
    logits = np.zeros((*margins.shape, CLASSES))
    logits[:, np.arange(len(labels)), labels] = margins
    return logits


def outputs(
    rng,
    levels: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    models: int,
    *,
    member_boost: float = 0.0,
    backdoor: float | None = None,
    accuracy: float = 0.9,
) -> Outputs:
    """One population: margins = level + noise (+ ``member_boost`` on the forget set)."""

    def draw(name, boost=0.0):
        margins = levels[name] + boost + rng.normal(0.0, 1.0, (models, len(levels[name])))
        return logits_from_margins(margins, labels[name])

    return Outputs(
        forget_logits=draw("forget", member_boost),
        forget_labels=labels["forget"],
        retained_logits=draw("retained"),
        retained_labels=labels["retained"],
        population_logits=draw("population"),
        population_labels=labels["population"],
        test_accuracy=np.full(models, accuracy) + rng.normal(0, 0.01, models),
        retain_accuracy=np.full(models, accuracy) + rng.normal(0, 0.01, models),
        seconds=np.full(models, 2.0),
        backdoor_success=None
        if backdoor is None
        else np.clip(backdoor + rng.normal(0, 0.03, models), 0, 1),
    )


def judge_world(
    seed: int = 0, *, models: int = 8, examples: int = 40, boost: float = 6.0, backdoor: bool = True
) -> JudgeData:
    """original (forget set memorised: +``boost``), ``leaky`` (half the boost), ``exact`` (as
    retrained), fedretrain and retrain-independent."""
    rng = np.random.default_rng(seed)
    sizes = {"forget": examples, "retained": examples, "population": 2 * examples}
    levels = {name: rng.normal(1.0, 1.5, n) for name, n in sizes.items()}
    labels = {name: rng.integers(0, CLASSES, n) for name, n in sizes.items()}

    def make(boost_, rate):
        return outputs(
            rng, levels, labels, models, member_boost=boost_, backdoor=rate if backdoor else None
        )

    return JudgeData(
        populations={
            "original": make(boost, 0.95),
            "leaky": make(boost / 2, 0.5),
            "exact": make(0.0, 0.05),
            "fedretrain": make(0.0, 0.05),
            "retrain-independent": make(0.0, 0.05),
        }
    )
