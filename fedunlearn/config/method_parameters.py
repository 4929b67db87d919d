"""The keys of single unlearning methods: the field's baselines (rapid retraining, PGA, FedOSD,
FedQUIT, FedAU), keep-training and the recovery methods (FedRecover, Crab, SIFU), declared as the
fields of :class:`MethodParameters`, a base of :class:`fedunlearn.config.parameters.RunParameters`.

They are the table's rows like any other key (group ``unlearning``); they live here, apart from the
keys every run reads, because each belongs to one method. To add one: a field here and its default
in ``pyproject.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedunlearn.config import choices
from fedunlearn.config.constraints import Flag, Interval, Options
from fedunlearn.config.fields import (
    AT_LEAST_1,
    NON_NEGATIVE,
    NUMBER,
    POSITIVE,
    WHOLE,
    key_in,
    lazy_names,
)

unlearning = key_in("unlearning")


@dataclass(frozen=True)
class MethodParameters:
    """The single methods' keys, flat (``config.pga_epochs``)."""

    rapid_rounds: int = unlearning(
        0, Interval(WHOLE, 0), "rapid retraining's rounds (Liu et al. 2022); 0: the run's rounds"
    )
    rapid_lr: float = unlearning(1e-3, POSITIVE, "rapid retraining's step size eta")
    rapid_damping: float = unlearning(
        1e-3,
        NON_NEGATIVE,
        "rapid retraining's lambda, added to the Fisher term's square root (ours: the authors' "
        "1e-8 oscillated on digits, 78.7% after 20 rounds against FedRetrain's 98.0%)",
    )
    post_training_rounds: int = unlearning(
        2,
        Interval(WHOLE, 0),
        "PGA, FedQUIT, FedOSD: rounds of the run's aggregation by the remaining clients after "
        "the unlearning step (ours for FedQUIT, whose code stops at a retrained model's accuracy)",
    )
    pga_epochs: int = unlearning(5, AT_LEAST_1, "PGA: the leaving client's ascent epochs")
    pga_lr: float = unlearning(0.01, POSITIVE, "PGA: the leaving client's SGD step size")
    pga_stop: str = unlearning(
        "validation",
        Options(lazy_names("fedunlearn.unlearning.pga", "STOP_RULES")),
        "PGA's stop: validation, the paper's (the ascent stops at the first step whose accuracy on "
        "the server's validation samples is below tau = acc(w_ref) - pga-stop-margin); distance, "
        "the authors' code's (squared distance to the leaving client's own last model above "
        "pga-stop-distance); ratio, ours (that distance above pga-stop-ratio times its start)",
    )
    pga_stop_margin: float = unlearning(
        10.0,
        Interval(NUMBER, 0.0, 100.0),
        "PGA, pga-stop = validation: m, in points of accuracy; tau = w_ref's validation "
        "accuracy - m",
    )
    pga_validation_samples: int = unlearning(
        500,
        Interval(WHOLE, 1, 100_000),
        "PGA, pga-stop = validation: the server's validation samples, sent with the ascent "
        "request: training samples no client holds (train-samples < the set), else test samples",
    )
    pga_stop_distance: float = unlearning(
        2.2,
        POSITIVE,
        "PGA, pga-stop = distance: the squared distance to the leaving client's own last model "
        "at which the ascent stops (the authors' code, for their MNIST network)",
    )
    pga_stop_ratio: float = unlearning(
        4.9,
        POSITIVE,
        "PGA, pga-stop = ratio (ours): each target stops once its squared distance to its own "
        "model exceeds this multiple of where it started (w_ref's); the authors' stored run stops "
        "at 2.2 from a start of 0.45 (4.9x)",
    )
    fedosd_rounds: int = unlearning(100, AT_LEAST_1, "FedOSD: unlearning rounds (the code's UR)")
    fedosd_lr: float = unlearning(
        0.1,
        POSITIVE,
        "FedOSD: unlearning step size, x0.999 a round (ours: the code's 4e-4 scales its "
        "multi-batch pseudo-gradients; on digits' exact gradients it moved the model 0.002)",
    )
    fedquit_epochs: int = unlearning(
        5, AT_LEAST_1, "FedQUIT: the leaving client's epochs (ours; the authors' 1)"
    )
    fedquit_lr: float = unlearning(
        1e-3,
        POSITIVE,
        "FedQUIT: the leaving client's Adam step size (ours: the authors' 1 epoch at 1e-4 is six "
        "steps on a digits client and forgot nothing)",
    )
    fedau_alpha: float = unlearning(
        0.9,
        Interval(NUMBER, 0.0, 1.0),
        "FedAU's alpha: the head becomes (1 - alpha) W + alpha W_a (the authors' code's 0.9)",
    )
    keep_training_budget: str = unlearning(
        "fedretrain",
        Options(lambda: tuple(m for m in choices.UNLEARNING_METHODS if m != "keep-training")),
        "keep-training (no unlearning: the remaining clients go on training the original model): "
        "its budget is this method's client-epochs in the same request (a method of "
        "unlearn-methods; keep-training runs after it)",
    )
    keep_training_rounds: int = unlearning(
        0,
        Interval(WHOLE, 0),
        "keep-training: this many rounds of the run's training instead; 0: keep-training-budget",
    )
    fedrecover_warmup: int = unlearning(
        3, AT_LEAST_1, "FedRecover's T_w: the first rounds computed exactly (more than the buffer)"
    )
    fedrecover_correction_period: int = unlearning(
        10, AT_LEAST_1, "FedRecover's T_c: after warm-up, every T_c-th round is exact"
    )
    fedrecover_final_tuning: int = unlearning(
        2, Interval(WHOLE, 0), "FedRecover's T_f: the last rounds computed exactly"
    )
    fedrecover_buffer: int = unlearning(2, AT_LEAST_1, "FedRecover's s: L-BFGS pairs per client")
    fedrecover_threshold: float = unlearning(
        0.0, NON_NEGATIVE, "FedRecover's abnormality threshold tau; 0: from the history (alpha)"
    )
    fedrecover_tolerance: float = unlearning(
        1e-3,
        Interval(NUMBER, 0.0, 1.0, closed="left"),
        "FedRecover's alpha: share of each round's update coordinates allowed above tau_t",
    )
    fedrecover_guard: bool = unlearning(
        True,
        Flag(),
        "ours, not the paper's: redo with exact updates an estimated round whose step or "
        "server-side loss leaves the exact rounds' range; refuse exact replies far above the "
        "history's norms (false: the paper's FedRecover)",
    )
    fedrecover_guard_slack: float = unlearning(
        0.5,
        NON_NEGATIVE,
        "how far (relative) an estimated round may go beyond the exact rounds' range, and an "
        "exact reply beyond the history's largest update norm",
    )
    crab_round_ratio: float = unlearning(
        0.6,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "Crab's P (the authors' select_round_ratio): share of each window's rounds kept, those "
        "whose global step has the largest KL divergence (at least one)",
    )
    crab_client_ratio: float = unlearning(
        0.7,
        Interval(NUMBER, 0.0, 1.0, closed="right"),
        "Crab's X (select_client_ratio): share of a kept round's clients kept, those whose model "
        "is most cosine-aligned with the global model (at least one)",
    )
    crab_loss_drop: float = unlearning(
        0.1,
        Interval(NUMBER, 0.0, 1.0, closed="neither"),
        "Crab's alpha: a window closes at the first round whose global model's training loss is "
        "below (1 - alpha) times the loss at the window's start",
    )
    crab_window: int = unlearning(
        0,
        Interval(WHOLE, 0),
        "Crab: a window closes anyway once it spans this many rounds (ours: a bound on the rounds "
        "kept whole until their window closes); 0: no bound, as the authors'",
    )
    crab_rollback: str = unlearning(
        "first-kept",
        Options(lazy_names("fedunlearn.unlearning.crab_recovery", "ROLLBACK_RULES")),
        "first-kept: the authors' recovery, every kept round re-run from the first; sensitivity: "
        "ours, roll back to the latest kept round before the removed clients' share of a global "
        "step exceeded crab-sensitivity-bound (round 1 is then always kept)",
    )
    crab_sensitivity_bound: float = unlearning(
        0.1,
        NON_NEGATIVE,
        "Crab's beta, with crab-rollback = sensitivity only: the removed clients' largest share "
        "of a global step before the rollback round",
    )
    sifu_epsilon: float = unlearning(1.0, POSITIVE, "SIFU's epsilon of (epsilon, delta)-unlearning")
    sifu_delta: float = unlearning(
        1e-4, Interval(NUMBER, 0.0, 1.0, closed="neither"), "SIFU's delta"
    )
    sifu_sigma: float = unlearning(
        0.01, POSITIVE, "SIFU's noise std sigma; the budget is Psi* = epsilon sigma / c(delta)"
    )
    sifu_smoothness: float = unlearning(
        1.0,
        NON_NEGATIVE,
        "L, the smoothness the certificate assumes of every mini-batch loss (exact for linear "
        "models, an assumption for networks)",
    )
    sifu_expansion: str = unlearning(
        "smoothness",
        Options(lazy_names("fedunlearn.unlearning.sensitivity", "EXPANSIONS")),
        "SIFU's per-round factor rho: from sifu-smoothness (a bound), or non-expansive (assumed, "
        "as the authors' code does: |1 - lr weight-decay|^K)",
    )
    sifu_mechanism: str = unlearning(
        "analytic",
        Options(lazy_names("fedunlearn.unlearning.gaussian_mechanism", "MECHANISMS")),
        "Gaussian mechanism: analytic (Balle and Wang 2018, any epsilon) or classical (epsilon < 1)",
    )
