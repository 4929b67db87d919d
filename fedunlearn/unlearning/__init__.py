"""Federated unlearning methods on retained updates (FedEraser, FedAccum) and their metrics.

Each module is importable by its own path; this package re-exports their public names
(as torchvision's ``datasets/__init__.py`` does).
"""

from fedunlearn.unlearning.federaser import (
    calibration_epochs,
    calibration_scales,
    apply_scales,
    calibrate_update,
    aggregate_updates,
    ReconstructionStep,
    Reconstruction,
    fedaccum,
    federaser,
)
from fedunlearn.unlearning.metrics import (
    prediction_difference,
    angle_degrees,
    per_neuron_angles,
    l2_distance,
)

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
]
