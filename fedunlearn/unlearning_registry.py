"""The built-in unlearning methods (Liu et al., FedEraser, Section V, and the baselines after it):
:data:`UNLEARNING`, one :meth:`Registry.register` entry each. :mod:`fedunlearn.registry`
re-exports it with the other registries, and a method a user adds goes at the end of that module
(``docs/adding-a-method.md``)."""

from __future__ import annotations

from fedunlearn.config.constraints import Flag, Interval, Options
from fedunlearn.config.fields import (
    AT_LEAST_1,
    NON_NEGATIVE,
    NUMBER,
    POSITIVE,
    WHOLE,
    MethodKey,
    lazy_names,
)
from fedunlearn.messages import TRAIN
from fedunlearn.method_spec import WEIGHTED_MEAN, Registry

#: Unlearning methods (Liu et al., FedEraser, Section V), run by ``server.unlearning.request``; their
#: models are saved as ``model_<name>`` (``-<request>`` after the first request).
UNLEARNING = Registry(
    "unlearning method", "unlearn-methods", model_prefix="model_", group="unlearning"
)

_TRAIN = (TRAIN,)
_UNLEARNING = "server.unlearning.request"
_INTERVAL = "fedunlearn.unlearning.federaser:IntervalRetention"
_CLIENT_STEPS = "clients.objectives"  # the client objectives, imported on the client when asked

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
    stacks=True,
    stacks_note="eq. 2's norms are per tensor, hence per member",
    offline=True,
    offline_note="calibrates each retained round with the remaining participants there",
    colour="#1f77b4",
    description="calibrated reconstruction from retained updates (Algorithm 1)",
)
UNLEARNING.register(
    "fedaccum",
    f"{_UNLEARNING}:fedaccum",
    retention=_INTERVAL,
    aggregations=WEIGHTED_MEAN,  # eq. 5 sums the weighted mean's terms
    sampling=True,
    sampling_note="each retained round adds its remaining participants' updates",
    stacks=True,
    stacks_note="a sum of each member's own retained updates",
    colour="#ff7f0e",
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
    stacks=True,
    stacks_note="FedAvg from each member's own initial model",
    offline=True,
    offline_note="retrains the remaining clients there",
    colour="#000000",
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
    keys=(
        MethodKey(
            "fedrecover-warmup",
            3,
            AT_LEAST_1,
            "FedRecover's T_w: the first rounds computed exactly (more than the buffer)",
        ),
        MethodKey(
            "fedrecover-correction-period",
            10,
            AT_LEAST_1,
            "FedRecover's T_c: after warm-up, every T_c-th round is exact",
        ),
        MethodKey(
            "fedrecover-final-tuning",
            2,
            Interval(WHOLE, 0),
            "FedRecover's T_f: the last rounds computed exactly",
        ),
        MethodKey(
            "fedrecover-buffer",
            2,
            AT_LEAST_1,
            "FedRecover's s: L-BFGS pairs per client",
        ),
        MethodKey(
            "fedrecover-threshold",
            0.0,
            NON_NEGATIVE,
            "FedRecover's abnormality threshold tau; 0: from the history (alpha)",
        ),
        MethodKey(
            "fedrecover-tolerance",
            1e-3,
            Interval(NUMBER, 0.0, 1.0, closed="left"),
            "FedRecover's alpha: share of each round's update coordinates allowed above tau_t",
        ),
        MethodKey(
            "fedrecover-guard",
            True,
            Flag(),
            "ours, not the paper's: redo with exact updates an estimated round whose step or "
            "server-side loss leaves the exact rounds' range; refuse exact replies far above the "
            "history's norms (false: the paper's FedRecover)",
        ),
        MethodKey(
            "fedrecover-guard-slack",
            0.5,
            NON_NEGATIVE,
            "how far (relative) an estimated round may go beyond the exact rounds' range, and an "
            "exact reply beyond the history's largest update norm",
        ),
    ),
    colour="#2ca02c",
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
    keys=(
        MethodKey(
            "crab-round-ratio",
            0.6,
            Interval(NUMBER, 0.0, 1.0, closed="right"),
            "Crab's P (the authors' select_round_ratio): share of each window's rounds kept, "
            "those whose global step has the largest KL divergence (at least one)",
        ),
        MethodKey(
            "crab-client-ratio",
            0.7,
            Interval(NUMBER, 0.0, 1.0, closed="right"),
            "Crab's X (select_client_ratio): share of a kept round's clients kept, those whose "
            "model is most cosine-aligned with the global model (at least one)",
        ),
        MethodKey(
            "crab-loss-drop",
            0.1,
            Interval(NUMBER, 0.0, 1.0, closed="neither"),
            "Crab's alpha: a window closes at the first round whose global model's training loss "
            "is below (1 - alpha) times the loss at the window's start",
        ),
        MethodKey(
            "crab-window",
            0,
            Interval(WHOLE, 0),
            "Crab: a window closes anyway once it spans this many rounds (ours: a bound on the "
            "rounds kept whole until their window closes); 0: no bound, as the authors'",
        ),
        MethodKey(
            "crab-rollback",
            "first-kept",
            Options(lazy_names("fedunlearn.unlearning.crab_recovery", "ROLLBACK_RULES")),
            "first-kept: the authors' recovery, every kept round re-run from the first; "
            "sensitivity: ours, roll back to the latest kept round before the removed clients' "
            "share of a global step exceeded crab-sensitivity-bound (round 1 is then always kept)",
        ),
        MethodKey(
            "crab-sensitivity-bound",
            0.1,
            NON_NEGATIVE,
            "Crab's beta, with crab-rollback = sensitivity only: the removed clients' largest "
            "share of a global step before the rollback round",
        ),
    ),
    colour="#9467bd",
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
    keys=(
        MethodKey(
            "sifu-epsilon",
            1.0,
            POSITIVE,
            "SIFU's epsilon of (epsilon, delta)-unlearning",
        ),
        MethodKey(
            "sifu-delta",
            1e-4,
            Interval(NUMBER, 0.0, 1.0, closed="neither"),
            "SIFU's delta",
        ),
        MethodKey(
            "sifu-sigma",
            0.01,
            POSITIVE,
            "SIFU's noise std sigma; the budget is Psi* = epsilon sigma / c(delta)",
        ),
        MethodKey(
            "sifu-smoothness",
            1.0,
            NON_NEGATIVE,
            "L, the smoothness the certificate assumes of every mini-batch loss (exact for linear "
            "models, an assumption for networks)",
        ),
        MethodKey(
            "sifu-expansion",
            "smoothness",
            Options(lazy_names("fedunlearn.unlearning.sensitivity", "EXPANSIONS")),
            "SIFU's per-round factor rho: from sifu-smoothness (a bound), or non-expansive "
            "(assumed, as the authors' code does: |1 - lr weight-decay|^K)",
        ),
        MethodKey(
            "sifu-mechanism",
            "analytic",
            Options(lazy_names("fedunlearn.unlearning.gaussian_mechanism", "MECHANISMS")),
            "Gaussian mechanism: analytic (Balle and Wang 2018, any epsilon) or classical "
            "(epsilon < 1)",
        ),
    ),
    colour="#8c564b",
    description="rollback within a sensitivity budget, noise, retraining (Fraboni et al. 2024)",
)

_BASELINES = "server.unlearning.baselines"
UNLEARNING.register(
    "rapid-retraining",
    f"{_BASELINES}:rapid_retraining",
    needs=("initial-model",),
    messages=_TRAIN,
    objectives={"rapid-retraining": f"{_CLIENT_STEPS}:rapid_retraining_step"},
    default=False,
    keys=(
        MethodKey(
            "rapid-rounds",
            0,
            Interval(WHOLE, 0),
            "rapid retraining's rounds (Liu et al. 2022); 0: the run's rounds",
        ),
        MethodKey(
            "rapid-lr",
            1e-3,
            POSITIVE,
            "rapid retraining's step size eta",
        ),
        MethodKey(
            "rapid-damping",
            1e-3,
            NON_NEGATIVE,
            "rapid retraining's lambda, added to the Fisher term's square root (ours: the "
            "authors' 1e-8 oscillated on digits, 78.7% after 20 rounds against FedRetrain's "
            "98.0%)",
        ),
    ),
    colour="#8c6d31",
    description="retraining with diagonal-Fisher quasi-Newton client steps (Liu et al. 2022)",
)
UNLEARNING.register(
    "pga",
    f"{_BASELINES}:pga",
    retention="fedunlearn.unlearning.pga:LastRoundRetention",
    messages=_TRAIN,
    objectives={"pga": f"{_CLIENT_STEPS}:pga_step"},
    target_participates=True,
    default=False,
    sampling_note="a sampled target may lack the last round's anchor",
    keys=(
        MethodKey(
            "pga-epochs",
            5,
            AT_LEAST_1,
            "PGA: the leaving client's ascent epochs",
        ),
        MethodKey(
            "pga-lr",
            0.01,
            POSITIVE,
            "PGA: the leaving client's SGD step size",
        ),
        MethodKey(
            "pga-stop",
            "validation",
            Options(lazy_names("fedunlearn.unlearning.pga", "STOP_RULES")),
            "PGA's stop: validation, the paper's (the ascent stops at the first step whose "
            "accuracy on the server's validation samples is below tau = acc(w_ref) - "
            "pga-stop-margin); distance, the authors' code's (squared distance to the leaving "
            "client's own last model above pga-stop-distance); ratio, ours (that distance above "
            "pga-stop-ratio times its start)",
        ),
        MethodKey(
            "pga-stop-margin",
            10.0,
            Interval(NUMBER, 0.0, 100.0),
            "PGA, pga-stop = validation: m, in points of accuracy; tau = w_ref's validation "
            "accuracy - m",
        ),
        MethodKey(
            "pga-validation-samples",
            500,
            Interval(WHOLE, 1, 100_000),
            "PGA, pga-stop = validation: the server's validation samples, sent with the ascent "
            "request: training samples no client holds (train-samples < the set), else test "
            "samples",
        ),
        MethodKey(
            "pga-stop-distance",
            2.2,
            POSITIVE,
            "PGA, pga-stop = distance: the squared distance to the leaving client's own last "
            "model at which the ascent stops (the authors' code, for their MNIST network)",
        ),
        MethodKey(
            "pga-stop-ratio",
            4.9,
            POSITIVE,
            "PGA, pga-stop = ratio (ours): each target stops once its squared distance to its own "
            "model exceeds this multiple of where it started (w_ref's); the authors' stored run "
            "stops at 2.2 from a start of 0.45 (4.9x)",
        ),
    ),
    colour="#e7298a",
    description="the leaving client's projected gradient ascent, then post-training (Halimi et al. 2022)",
)
UNLEARNING.register(
    "fedosd",
    "server.unlearning.fedosd:fedosd",
    messages=_TRAIN,
    objectives={  # the leaving clients' gradient of the UCE loss; the remaining clients' of CE
        "fedosd-unlearning": f"{_CLIENT_STEPS}:fedosd_unlearning_step",
        "fedosd-gradient": f"{_CLIENT_STEPS}:fedosd_gradient_step",
    },
    target_participates=True,
    aggregations=WEIGHTED_MEAN,  # its post-training averages the projected gradients itself
    default=False,
    keys=(
        MethodKey(
            "fedosd-rounds",
            100,
            AT_LEAST_1,
            "FedOSD: unlearning rounds (the code's UR)",
        ),
        MethodKey(
            "fedosd-lr",
            0.1,
            POSITIVE,
            "FedOSD: unlearning step size, x0.999 a round (ours: the code's 4e-4 scales its "
            "multi-batch pseudo-gradients; on digits' exact gradients it moved the model 0.002)",
        ),
    ),
    colour="#5254a3",
    description="unlearning descent orthogonal to the others' gradients, non-reverting post-training (Pan et al. 2025)",
)
UNLEARNING.register(
    "fedquit",
    f"{_BASELINES}:fedquit",
    messages=_TRAIN,
    objectives={"fedquit": f"{_CLIENT_STEPS}:fedquit_step"},
    target_participates=True,
    default=False,
    keys=(
        MethodKey(
            "fedquit-epochs",
            5,
            AT_LEAST_1,
            "FedQUIT: the leaving client's epochs (ours; the authors' 1)",
        ),
        MethodKey(
            "fedquit-lr",
            1e-3,
            POSITIVE,
            "FedQUIT: the leaving client's Adam step size (ours: the authors' 1 epoch at 1e-4 is "
            "six steps on a digits client and forgot nothing)",
        ),
    ),
    colour="#1b9e77",
    description="the leaving client distils from a virtual teacher, then post-training (Mora et al. 2024)",
)
UNLEARNING.register(
    "fedau",
    f"{_BASELINES}:fedau",
    retention="fedunlearn.unlearning.fedau:AuxiliaryHeads",
    default=False,
    sampling_note="a sampled target may lack the last round's auxiliary head",
    keys=(
        MethodKey(
            "fedau-alpha",
            0.9,
            Interval(NUMBER, 0.0, 1.0),
            "FedAU's alpha: the head becomes (1 - alpha) W + alpha W_a (the authors' code's 0.9)",
        ),
    ),
    colour="#e6ab02",
    description="the head combined with the target's auxiliary head, no client work (Gu et al. 2024)",
)

UNLEARNING.register(
    "keep-training",
    "server.unlearning.keep_training:keep_training",
    needs=("trained-model",),
    messages=_TRAIN,
    default=False,
    sampling_note="its budget is spent over every remaining client each round",
    stacks=True,
    stacks_note="FedAvg rounds from each member's trained model, one budget for all",
    offline=True,
    offline_note="trains the remaining clients there",
    keys=(
        MethodKey(
            "keep-training-budget",
            "fedretrain",
            Options(lambda: tuple(m for m in UNLEARNING.names() if m != "keep-training")),
            "keep-training (no unlearning: the remaining clients go on training the original "
            "model): its budget is this method's client-epochs in the same request (a method of "
            "unlearn-methods; keep-training runs after it)",
        ),
        MethodKey(
            "keep-training-rounds",
            0,
            Interval(WHOLE, 0),
            "keep-training: this many rounds of the run's training instead; 0: "
            "keep-training-budget",
        ),
    ),
    colour="#525252",
    description="no unlearning: the remaining clients go on training the original model for another method's client-epochs (Mora & Bellavista 2025)",
)
