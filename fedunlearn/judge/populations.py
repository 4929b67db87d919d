"""What the judge measures: populations of N models each, seen on the same example sets.

A *population* is the N models one procedure produced from N independent federations (same
partitions, different initial weights and batch orders): ``original`` (the trained models),
every unlearning method's models, ``fedretrain`` (retrained without the target: the reference R),
and ``retrain-independent`` (a second, independent retrained set: the ceiling). Every array is
NumPy, models first. The judge's metrics (:mod:`fedunlearn.judge.metrics`) read only these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedunlearn.errors import ConfigError

#: Population names the judge always has (see the module docstring).
ORIGINAL = "original"
REFERENCE = "fedretrain"
INDEPENDENT = "retrain-independent"


@dataclass(frozen=True)
class Outputs:
    """One population's N models on the judge's example sets.

    Attributes
    ----------
    forget_logits : array (N, n_f, C)
        Logits on the target client's samples D_f (members of the original models only).
    retained_logits : array (N, n_k, C)
        Logits on one retained client's samples (members of every population).
    population_logits : array (N, n_p, C)
        Logits on population data: samples of the same distribution that no client holds
        (non-members of every population).
    forget_labels, retained_labels, population_labels : int arrays (n_f,), (n_k,), (n_p,)
    test_accuracy, retain_accuracy : arrays (N,)
        Accuracy of each model on the test set and on the remaining clients' data.
    backdoor_success : array (N,) or None
        Each model's attack success rate on triggered test samples of other classes (None when the
        run planted no trigger).
    seconds : array (N,)
        Wall time per model (the population's time divided by N when produced as a stack).
    """

    forget_logits: np.ndarray
    forget_labels: np.ndarray
    retained_logits: np.ndarray
    retained_labels: np.ndarray
    population_logits: np.ndarray
    population_labels: np.ndarray
    test_accuracy: np.ndarray
    retain_accuracy: np.ndarray
    seconds: np.ndarray
    backdoor_success: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.test_accuracy)
        for name in ("forget", "retained", "population"):
            logits, labels = getattr(self, f"{name}_logits"), getattr(self, f"{name}_labels")
            if logits.ndim != 3 or logits.shape[0] != n or logits.shape[1] != len(labels):
                raise ConfigError(
                    f"{name}_logits", logits.shape, f"(models={n}, examples={len(labels)}, classes)"
                )

    @property
    def num_models(self) -> int:
        return len(self.test_accuracy)


@dataclass(frozen=True)
class JudgeData:
    """Every population of one judge run, keyed by name (``original``, methods, references)."""

    populations: Mapping[str, Outputs]
    target: str = "client 0"
    details: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [p for p in (ORIGINAL, REFERENCE, INDEPENDENT) if p not in self.populations]
        if missing:
            raise ConfigError("populations", sorted(self.populations), f"including {missing}")

    def __getitem__(self, name: str) -> Outputs:
        return self.populations[name]
