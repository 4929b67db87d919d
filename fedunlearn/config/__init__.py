"""The run configuration: a constraints table, one validator, rules across keys, group views.

* :mod:`~fedunlearn.config.parameters`: the table, every key's group, type, default, constraint
  and description (:class:`RunParameters`, :func:`parameter_table`).
* :mod:`~fedunlearn.config.constraints`: what one key allows, and the validator
  (:func:`validate_parameter_constraints`).
* :mod:`~fedunlearn.config.rules`: rules across keys (:data:`RULES`) and group views.
* :mod:`~fedunlearn.config.experiment`: :class:`ExperimentConfig`, the validated configuration.
* :mod:`~fedunlearn.config.docs`: ``docs/configuration.md`` from the table.
"""

from fedunlearn.config import choices as _choices
from fedunlearn.config.choices import (
    ADOPT_FEDERATION_SIZE,
    CALIBRATION_ORDERS,
    DATASETS,
    DEVICES,
    INT64,
    MAX_ALPHA,
    MAX_CLIENTS,
    MAX_REPLY_TIMEOUT,
    MAX_SEED,
    MODELS,
    PARTITIONINGS,
    SAMPLE_SHAPES,
    STORE_DTYPES,
)
from fedunlearn.config.constraints import (
    ByRule,
    Constraint,
    Flag,
    FolderPath,
    Interval,
    NameList,
    Options,
    PositiveNumbers,
    RunName,
    coerce,
    validate_parameter_constraints,
)
from fedunlearn.config.docs import constraints_markdown
from fedunlearn.config.experiment import ExperimentConfig
from fedunlearn.config.parameters import GROUPS, RunParameters
from fedunlearn.config.paths import MAX_PATH_BYTES, RUN_NAME, RUN_NAME_ALLOWED, check_path_text
from fedunlearn.config.rules import (
    RULES,
    ConfigGroup,
    model_problem,
    partition_ids,
    validate_config,
    validate_group,
)
from fedunlearn.config.table import Parameter, parameter_constraints, parameter_table

__all__ = [
    "ADOPT_FEDERATION_SIZE",
    "ADOPTABLE_METHODS",
    "CALIBRATION_ORDERS",
    "DATASETS",
    "DEVICES",
    "GROUPS",
    "INT64",
    "MAX_ALPHA",
    "MAX_CLIENTS",
    "MAX_PATH_BYTES",
    "MAX_REPLY_TIMEOUT",
    "MAX_SEED",
    "MODELS",
    "PARTITIONINGS",
    "RETAINED_UPDATE_METHODS",
    "RULES",
    "RUN_NAME",
    "RUN_NAME_ALLOWED",
    "SAMPLE_SHAPES",
    "SCRUB_METHODS",
    "STORE_DTYPES",
    "UNLEARNING_METHODS",
    "ByRule",
    "ConfigGroup",
    "Constraint",
    "ExperimentConfig",
    "Flag",
    "FolderPath",
    "Interval",
    "NameList",
    "Options",
    "Parameter",
    "PositiveNumbers",
    "RunName",
    "RunParameters",
    "check_path_text",
    "coerce",
    "constraints_markdown",
    "model_problem",
    "parameter_constraints",
    "parameter_table",
    "partition_ids",
    "validate_config",
    "validate_group",
    "validate_parameter_constraints",
]


def __getattr__(name: str):
    """The method lists, read from the registries on every access (:mod:`.choices`)."""
    if name in _choices.METHOD_LISTS:
        return getattr(_choices, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
