"""Federated unlearning methods (FedEraser, FedAccum, FedRecover, Crab, SIFU), their retention
policies and their metrics.

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.unlearning.crab import (
    CrabSelector,
    contribution_norms,
    model_alignment,
    parameter_divergence,
)
from fedunlearn.unlearning.crab_recovery import (
    CrabRecovery,
    CrabStep,
    check_rollback_rule,
    check_sensitivity_bound,
    crab_recover,
    excluded_sensitivities,
    rollback_rounds,
)
from fedunlearn.unlearning.federaser import (
    ExactUpdatesFn,
    Reconstruction,
    ReconstructionStep,
    aggregate_updates,
    apply_scales,
    calibrate_update,
    calibration_epochs,
    calibration_scales,
    fedaccum,
    federaser,
)
from fedunlearn.unlearning.fedrecover import (
    FedRecoverSchedule,
    FedRecoverStep,
    Recovery,
    abnormality_thresholds,
    fedrecover,
    tolerance_threshold,
)
from fedunlearn.unlearning.gaussian_mechanism import (
    MECHANISMS,
    add_noise,
    entropy_generator,
    noise_sigma,
    unlearning_budget,
)
from fedunlearn.unlearning.lbfgs import CURVATURE_EPS, curvature_pairs, lbfgs_hvp
from fedunlearn.unlearning.metrics import (
    angle_degrees,
    l2_distance,
    per_neuron_angles,
    prediction_difference,
)
from fedunlearn.unlearning.sensitivity import SensitivityAccumulator, local_lipschitz
from fedunlearn.unlearning.sifu import SifuCertificate, rollback_round

__all__ = [
    "calibration_epochs",
    "calibration_scales",
    "apply_scales",
    "calibrate_update",
    "aggregate_updates",
    "ReconstructionStep",
    "Reconstruction",
    "fedaccum",
    "federaser",
    "prediction_difference",
    "angle_degrees",
    "per_neuron_angles",
    "l2_distance",
    "ExactUpdatesFn",
    "FedRecoverSchedule",
    "FedRecoverStep",
    "Recovery",
    "abnormality_thresholds",
    "fedrecover",
    "tolerance_threshold",
    "CURVATURE_EPS",
    "curvature_pairs",
    "lbfgs_hvp",
    "MECHANISMS",
    "SensitivityAccumulator",
    "SifuCertificate",
    "add_noise",
    "entropy_generator",
    "local_lipschitz",
    "noise_sigma",
    "rollback_round",
    "unlearning_budget",
    "CrabSelector",
    "CrabStep",
    "CrabRecovery",
    "crab_recover",
    "check_rollback_rule",
    "check_sensitivity_bound",
    "contribution_norms",
    "excluded_sensitivities",
    "model_alignment",
    "parameter_divergence",
    "rollback_rounds",
]
