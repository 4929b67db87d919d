"""Federated unlearning methods (FedEraser, FedAccum, FedRecover, Crab, SIFU), their retention
policies and their metrics.

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.lazy import homes_of, lazy_getattr

#: Where each public name lives. The package imports nothing until a name is asked for (PEP 562):
#: a retention policy imports its own module, not every method's (scipy, pandas).
_HOMES = {
    "crab": (
        "CrabSelector",
        "contribution_norms",
        "model_alignment",
        "parameter_divergence",
    ),
    "crab_recovery": (
        "CrabRecovery",
        "CrabStep",
        "check_rollback_rule",
        "check_sensitivity_bound",
        "crab_recover",
        "excluded_sensitivities",
        "rollback_rounds",
    ),
    "calibration_top_up": ("TopUp", "borrowed_squares", "top_up_clients"),
    "federaser": (
        "ExactUpdatesFn",
        "Reconstruction",
        "ReconstructionStep",
        "aggregate_updates",
        "apply_scales",
        "calibrate_update",
        "calibration_epochs",
        "calibration_scales",
        "fedaccum",
        "federaser",
    ),
    "fedrecover": (
        "FedRecoverSchedule",
        "FedRecoverStep",
        "Recovery",
        "abnormality_thresholds",
        "fedrecover",
        "tolerance_threshold",
    ),
    "gaussian_mechanism": (
        "MECHANISMS",
        "add_noise",
        "entropy_generator",
        "noise_sigma",
        "unlearning_budget",
    ),
    "lbfgs": (
        "CURVATURE_EPS",
        "curvature_pairs",
        "lbfgs_hvp",
    ),
    "metrics": (
        "angle_degrees",
        "l2_distance",
        "per_neuron_angles",
        "prediction_difference",
    ),
    "sensitivity": (
        "SensitivityAccumulator",
        "local_lipschitz",
    ),
    "sifu": (
        "SifuCertificate",
        "rollback_round",
    ),
}
_HOME = homes_of(_HOMES)

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

__getattr__ = lazy_getattr(__name__, _HOMES)
