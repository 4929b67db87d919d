"""Membership-inference attacks that see only a model's outputs, to judge unlearning.

Two families, both working on softmax probabilities ``probs`` of shape (n, K) and integer
``labels`` of shape (n,), and both scoring "more likely a member" higher:

* threshold attacks on one number per sample, the loss (Yeom et al., "Privacy Risk in Machine
  Learning: Analyzing the Connection to Overfitting", CSF 2018), the confidence in the true label
  and the prediction's entropy (Song & Mittal, "Systematic Evaluation of Privacy Risks of Machine
  Learning Models", USENIX Security 2021), judged by AUC and TPR at low FPR;
* the shadow-model attack of FedEraser (Liu et al., "FedEraser: Enabling Efficient Client-Level
  Data Removal from Federated Learning Models", IWQoS 2021), after Shokri et al., "Membership
  Inference Attacks Against Machine Learning Models" (IEEE S&P 2017): a classifier trained on a
  shadow model's sorted softmax vectors, on its training data (members) and on held-out data
  (non-members), then applied to the target model, judged by precision, recall and F1.

The held-out data the attack trains on must be disjoint from the held-out data it is evaluated
on; :func:`split_held_out` and :func:`disjoint_indices` are there to guarantee it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.ensemble import GradientBoostingClassifier

from fedunlearn.errors import ConfigError
from fedunlearn.membership.lira import other_classes_mass
from fedunlearn.membership.metrics import precision_recall_f1, roc_auc, threshold_summary

__all__ = [
    "THRESHOLD_SCORES",
    "ShadowModelAttack",
    "confidence_scores",
    "disjoint_indices",
    "entropy_scores",
    "loss_scores",
    "split_held_out",
    "threshold_attacks",
]

#: Probabilities are clipped from below at this value before taking logarithms.
PROB_FLOOR = 1e-12
#: How far a row of ``probs`` may sum from 1 (float16 softmax outputs included).
_ROW_SUM_TOLERANCE = 1e-2


def _probs(values: object, name: str = "probs") -> np.ndarray:
    """``values`` as an (n, K) float64 array of probability rows, else ConfigError."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            name, type(values).__name__, "an (n, K) array of probabilities"
        ) from error
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ConfigError(
            name, f"array of shape {array.shape}", "an (n, K) array with n >= 1 and K >= 1"
        )
    if not np.all(np.isfinite(array)) or array.min() < 0.0 or array.max() > 1.0:
        raise ConfigError(name, "values outside [0, 1]", "finite probabilities in [0, 1]")
    sums = array.sum(axis=1)
    worst = float(np.max(np.abs(sums - 1.0)))
    if worst > _ROW_SUM_TOLERANCE:
        raise ConfigError(
            name, f"a row summing to {sums[np.argmax(np.abs(sums - 1.0))]:.4g}", "rows summing to 1"
        )
    return array


def _labels(values: object, n: int, n_classes: int, name: str = "labels") -> np.ndarray:
    """``values`` as n integer labels in [0, n_classes), else ConfigError."""
    array = np.asarray(values)
    if array.ndim != 1 or array.shape[0] != n:
        raise ConfigError(name, f"array of shape {array.shape}", f"a 1-D array of {n} labels")
    if array.dtype.kind not in "iu":
        raise ConfigError(name, f"array of dtype {array.dtype}", "integer class labels")
    if n and (array.min() < 0 or array.max() >= n_classes):
        raise ConfigError(
            name,
            f"labels in [{array.min()}, {array.max()}]",
            f"labels in [0, {n_classes - 1}] (K = {n_classes} columns of probs)",
        )
    return array.astype(np.int64)


def loss_scores(probs: object, labels: object) -> np.ndarray:
    """Minus the cross-entropy loss, log p_y, of each sample (Yeom et al., 2018).

    Members tend to have a lower loss, hence a higher score.

    Parameters
    ----------
    probs : array_like, shape (n, K)
        Softmax probabilities of the attacked model.
    labels : array_like of int, shape (n,)
        True class of each sample.

    Returns
    -------
    numpy.ndarray, shape (n,)
        ``log(max(p_y, 1e-12))``, at most 0 and at least about -27.6. It is computed as
        ``log1p(-sum of the other classes' p)``, so confident samples (p_y within 1e-16 of 1,
        which float64 rounds to 1) keep distinct scores instead of all scoring 0.
    """
    p = _probs(probs)
    y = _labels(labels, p.shape[0], p.shape[1])
    others = other_classes_mass(p, y)
    with np.errstate(divide="ignore"):
        scores = np.where(
            others < 0.5, np.log1p(-np.minimum(others, 0.5)), np.log(p[np.arange(len(p)), y])
        )
    return np.maximum(scores, np.log(PROB_FLOOR))


def confidence_scores(probs: object, labels: object) -> np.ndarray:
    """The probability the model gives the true label, p_y (Song & Mittal, 2021).

    Parameters
    ----------
    probs : array_like, shape (n, K)
        Softmax probabilities of the attacked model.
    labels : array_like of int, shape (n,)
        True class of each sample.

    Returns
    -------
    numpy.ndarray, shape (n,)
        p_y in [0, 1].
    """
    p = _probs(probs)
    y = _labels(labels, p.shape[0], p.shape[1])
    return p[np.arange(p.shape[0]), y].copy()


def entropy_scores(probs: object, labels: object = None) -> np.ndarray:
    """Minus the Shannon entropy of each prediction, Σ_k p_k log p_k (Song & Mittal, 2021).

    Members tend to get more confident, lower-entropy predictions, hence a higher score.

    Parameters
    ----------
    probs : array_like, shape (n, K)
        Softmax probabilities of the attacked model.
    labels : array_like of int, shape (n,), optional
        Unused (accepted for the signature shared with the other scores); checked when given.

    Returns
    -------
    numpy.ndarray, shape (n,)
        Minus the entropy in nats, in [-log K, 0]; probabilities are clipped at 1e-12 inside the
        logarithm.
    """
    p = _probs(probs)
    if labels is not None:
        _labels(labels, p.shape[0], p.shape[1])
    return np.sum(p * np.log(np.clip(p, PROB_FLOOR, 1.0)), axis=1)


#: The threshold attacks' scores by name, each ``score(probs, labels) -> (n,) array``.
THRESHOLD_SCORES: dict[str, Callable[[object, object], np.ndarray]] = {
    "loss": loss_scores,
    "confidence": confidence_scores,
    "entropy": entropy_scores,
}


def threshold_attacks(
    member_probs: object, member_labels: object, nonmember_probs: object, nonmember_labels: object
) -> dict[str, dict[str, float]]:
    """Run every threshold attack of :data:`THRESHOLD_SCORES` (Yeom et al.; Song & Mittal).

    Parameters
    ----------
    member_probs, nonmember_probs : array_like, shape (n, K) and (m, K)
        The attacked model's softmax outputs on known members and known non-members.
    member_labels, nonmember_labels : array_like of int, shape (n,) and (m,)
        Their true labels.

    Returns
    -------
    dict
        For each score name, :func:`fedunlearn.membership.metrics.threshold_summary` (keys ``auc``,
        ``tpr_at_1pct_fpr``, ``tpr_at_0.1pct_fpr``).
    """
    members = _probs(member_probs, "member_probs")
    nonmembers = _probs(nonmember_probs, "nonmember_probs")
    if members.shape[1] != nonmembers.shape[1]:
        raise ConfigError(
            "nonmember_probs",
            f"{nonmembers.shape[1]} columns",
            f"as many classes as member_probs ({members.shape[1]})",
        )
    k = members.shape[1]
    y_members = _labels(member_labels, members.shape[0], k, "member_labels")
    y_nonmembers = _labels(nonmember_labels, nonmembers.shape[0], k, "nonmember_labels")
    return {
        name: threshold_summary(score(members, y_members), score(nonmembers, y_nonmembers))
        for name, score in THRESHOLD_SCORES.items()
    }


def _seed(seed: object, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(name, seed, "an integer >= 0")
    return int(seed)


def _sorted_features(probs: np.ndarray) -> np.ndarray:
    """Each softmax vector sorted in descending order (Shokri et al., 2017; Liu et al., 2021)."""
    return -np.sort(-probs, axis=1)


def _subsample(rows: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    if rows.shape[0] <= size:
        return rows
    return rows[np.sort(rng.choice(rows.shape[0], size=size, replace=False))]


class ShadowModelAttack:
    """FedEraser's membership-inference attack (Liu et al., 2021), after Shokri et al. (2017).

    A gradient-boosting classifier learns, from a shadow model trained like the target, to tell
    the softmax vectors (sorted in descending order, so that the attack does not depend on the
    class) of the shadow's training samples from those of held-out samples. Applied to the target
    model's outputs it predicts which samples the target was trained on; after unlearning, the
    forgotten client's data should no longer be predicted members.

    Parameters
    ----------
    seed : int
        Seeds the balancing subsample, the evaluation subsample and the classifier.
    n_estimators, max_depth, learning_rate
        Passed to ``sklearn.ensemble.GradientBoostingClassifier``.

    Attributes
    ----------
    n_classes_ : int
        K, the width of the softmax vectors seen in :meth:`fit`.
    n_train_per_side_ : int
        How many members and as many non-members the classifier was trained on.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        n_estimators: int = 100,
        max_depth: int = 3,
        learning_rate: float = 0.1,
    ) -> None:
        self.seed = _seed(seed)
        if isinstance(n_estimators, bool) or not isinstance(n_estimators, (int, np.integer)):
            raise ConfigError("n_estimators", n_estimators, "an integer >= 1")
        if n_estimators < 1:
            raise ConfigError("n_estimators", n_estimators, "an integer >= 1")
        if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)):
            raise ConfigError("max_depth", max_depth, "an integer >= 1")
        if max_depth < 1:
            raise ConfigError("max_depth", max_depth, "an integer >= 1")
        rate_is_number = isinstance(learning_rate, (int, float, np.floating)) and not isinstance(
            learning_rate, bool
        )
        if not rate_is_number or not 0.0 < float(learning_rate) <= 1.0:
            raise ConfigError("learning_rate", learning_rate, "a number in (0, 1]")
        self.n_estimators = int(n_estimators)
        self.max_depth = int(max_depth)
        self.learning_rate = float(learning_rate)
        self.model_: GradientBoostingClassifier | None = None
        self.n_classes_: int | None = None
        self.n_train_per_side_: int | None = None

    def fit(self, member_probs: object, nonmember_probs: object) -> ShadowModelAttack:
        """Train the attack on the shadow model's outputs.

        Parameters
        ----------
        member_probs : array_like, shape (n, K)
            The shadow model's softmax outputs on its own training data.
        nonmember_probs : array_like, shape (m, K)
            Its outputs on held-out data it never saw (disjoint from the data the attack will be
            evaluated on).

        Returns
        -------
        ShadowModelAttack
            ``self``, trained on min(n, m) members and as many non-members (the larger side is
            subsampled with the seed).
        """
        members = _probs(member_probs, "member_probs")
        nonmembers = _probs(nonmember_probs, "nonmember_probs")
        if members.shape[1] != nonmembers.shape[1]:
            raise ConfigError(
                "nonmember_probs",
                f"{nonmembers.shape[1]} columns",
                f"as many classes as member_probs ({members.shape[1]})",
            )
        rng = np.random.default_rng(self.seed)
        size = min(members.shape[0], nonmembers.shape[0])
        members = _subsample(members, size, rng)
        nonmembers = _subsample(nonmembers, size, rng)
        features = _sorted_features(np.concatenate([members, nonmembers]))
        target = np.concatenate([np.ones(size, dtype=int), np.zeros(size, dtype=int)])
        model = GradientBoostingClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            learning_rate=self.learning_rate,
            random_state=self.seed,
        )
        model.fit(features, target)
        self.model_ = model
        self.n_classes_ = int(members.shape[1])
        self.n_train_per_side_ = size
        return self

    def _checked(self, probs: object, name: str) -> np.ndarray:
        if self.model_ is None:
            raise ConfigError(
                "ShadowModelAttack", "not fitted", "call fit(member_probs, nonmember_probs) first"
            )
        array = _probs(probs, name)
        if array.shape[1] != self.n_classes_:
            raise ConfigError(
                name,
                f"{array.shape[1]} columns",
                f"{self.n_classes_} columns, as the shadow outputs the attack was fitted on",
            )
        return array

    def member_probability(self, probs: object) -> np.ndarray:
        """The attack model's probability that each sample is a member, shape (n,)."""
        array = self._checked(probs, "probs")
        column = int(np.flatnonzero(self.model_.classes_ == 1)[0])
        return self.model_.predict_proba(_sorted_features(array))[:, column]

    def predict(self, probs: object) -> np.ndarray:
        """The attack's decision for each sample, ``True`` = member, shape (n,)."""
        array = self._checked(probs, "probs")
        return self.model_.predict(_sorted_features(array)) == 1

    def evaluate(self, target_probs: object, unseen_probs: object) -> dict[str, float]:
        """Attack the target model as FedEraser does: its training data against unseen data.

        Parameters
        ----------
        target_probs : array_like, shape (n, K)
            The target model's outputs on the data in question (e.g. the forgotten client's),
            all taken as members.
        unseen_probs : array_like, shape (m, K)
            Its outputs on held-out data, taken as non-members; when m > n a seeded subsample of
            n rows is used, so both sides weigh the same.

        Returns
        -------
        dict
            ``precision``, ``recall``, ``f1`` of :meth:`predict` (members positive), ``auc`` of
            :meth:`member_probability`, and the counts ``n_members``, ``n_nonmembers`` used.
        """
        members = self._checked(target_probs, "target_probs")
        nonmembers = self._checked(unseen_probs, "unseen_probs")
        rng = np.random.default_rng([self.seed, 1])
        nonmembers = _subsample(nonmembers, members.shape[0], rng)
        result = precision_recall_f1(self.predict(members), self.predict(nonmembers))
        result["auc"] = roc_auc(
            self.member_probability(members), self.member_probability(nonmembers)
        )
        result["n_members"] = int(members.shape[0])
        result["n_nonmembers"] = int(nonmembers.shape[0])
        return result


def disjoint_indices(*index_sets: object, names: Sequence[str]) -> None:
    """Check that no two index sets share an element, else raise ConfigError naming both.

    Used to guarantee that the held-out samples an attack is trained on are not among those it is
    evaluated on (Shokri et al., 2017, keep shadow and target data disjoint for the same reason).

    Parameters
    ----------
    *index_sets : array_like of int
        1-D arrays of sample indices.
    names : sequence of str
        One name per index set, used in the error.

    Raises
    ------
    ConfigError
        With parameter ``"<name_a>/<name_b>"`` when sets a and b overlap, or on bad arguments.
    """
    if isinstance(names, str) or len(names) != len(index_sets):
        raise ConfigError("names", names, f"one name per index set ({len(index_sets)})")
    arrays = []
    for values, name in zip(index_sets, names, strict=True):
        array = np.asarray(values)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise ConfigError(
                name, f"array of shape {array.shape}", "a 1-D array of integer indices"
            )
        arrays.append(array)
    for (a, name_a), (b, name_b) in itertools.combinations(zip(arrays, names, strict=True), 2):
        shared = np.intersect1d(a, b)
        if shared.size:
            shown = ", ".join(str(int(i)) for i in shared[:5]) + (
                ", ..." if shared.size > 5 else ""
            )
            raise ConfigError(
                f"{name_a}/{name_b}",
                f"{shared.size} shared index(es): {shown}",
                "disjoint index sets",
            )


def split_held_out(n: int, seed: int, fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Split the held-out indices range(n) into attack-training and evaluation parts.

    Parameters
    ----------
    n : int
        How many held-out samples there are; at least 2.
    seed : int
        Seeds the permutation; the same seed gives the same split.
    fraction : float
        The share, in (0, 1), that goes to the attack's training (rounded to the nearest count);
        both parts must end up non-empty.

    Returns
    -------
    train_idx, eval_idx : numpy.ndarray of int64
        Sorted, disjoint, and together exactly range(n).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ConfigError("n", n, "an integer >= 2")
    seed = _seed(seed)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)):
        raise ConfigError("fraction", fraction, "a number in (0, 1)")
    if not 0.0 < float(fraction) < 1.0:
        raise ConfigError("fraction", fraction, "a number in (0, 1)")
    n_train = int(np.floor(float(fraction) * int(n) + 0.5))
    if not 0 < n_train < n:
        raise ConfigError(
            "fraction",
            fraction,
            f"a share of n={n} leaving both parts non-empty (it gives {n_train} of {n})",
        )
    permutation = np.random.default_rng(seed).permutation(int(n))
    return np.sort(permutation[:n_train]), np.sort(permutation[n_train:])
