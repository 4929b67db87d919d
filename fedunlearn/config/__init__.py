"""The run configuration: a constraints table, one validator, rules across keys, group views.

* :mod:`~fedunlearn.config.parameters`: the keys every run reads, each with its group, type,
  default, constraint and description (:class:`RunParameters`); a single method's keys are
  declared on its registry entry (:class:`MethodKey`, ``MethodSpec.keys``).
* :mod:`~fedunlearn.config.table`: both read row by row (:func:`parameter_table`).
* :mod:`~fedunlearn.config.constraints`: what one key allows, and the validator
  (:func:`validate_parameter_constraints`).
* :mod:`~fedunlearn.config.rules`: rules across keys (:data:`RULES`), run in their order; the
  rules themselves in :mod:`~fedunlearn.config.training_rules` (data, model, retention,
  aggregation, sampling) and :mod:`~fedunlearn.config.request_rules` (unlearning, certified head,
  scrubbing, audit, judge, poisoning).
* :mod:`~fedunlearn.config.group`: group views (:class:`ConfigGroup`).
* :mod:`~fedunlearn.config.experiment`: :class:`ExperimentConfig`, the validated configuration.
* :mod:`~fedunlearn.config.docs`: ``docs/configuration.md`` from the table.
"""

import importlib

from fedunlearn.lazy import homes_of

#: Where each public name lives. The package imports nothing until a name is asked for (PEP 562):
#: the registry declares its methods' keys with :mod:`.constraints` and :mod:`.fields`, and must
#: reach them without running the table, the rules and the validated configuration, which read
#: the registry.
_HOMES = {
    "choices": (
        "ADOPT_FEDERATION_SIZE",
        "CALIBRATION_ORDERS",
        "DATASETS",
        "DEVICES",
        "INT64",
        "MAX_ALPHA",
        "MAX_CLIENTS",
        "MAX_REPLY_TIMEOUT",
        "MAX_SEED",
        "MODELS",
        "PARTITIONINGS",
        "SAMPLE_SHAPES",
        "STORE_DTYPES",
    ),
    "constraints": (
        "ByRule",
        "Constraint",
        "Flag",
        "FolderPath",
        "Interval",
        "NameList",
        "Options",
        "PositiveNumbers",
        "RunName",
        "coerce",
        "validate_parameter_constraints",
    ),
    "docs": ("constraints_markdown",),
    "experiment": ("ExperimentConfig",),
    "fields": ("MethodKey",),
    "group": ("ConfigGroup",),
    "parameters": ("GROUPS", "RunParameters"),
    "paths": ("MAX_PATH_BYTES", "RUN_NAME", "RUN_NAME_ALLOWED", "check_path_text"),
    "rules": (
        "RULES",
        "partition_ids",
        "validate_config",
        "validate_group",
    ),
    "table": ("Parameter", "parameter_constraints", "parameter_table"),
    "training_rules": ("model_problem",),
}
_HOME = homes_of(_HOMES)

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
    """A public name, imported from its module when first asked for; the method lists are read
    from the registries on every access (:mod:`.choices`)."""
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    choices = importlib.import_module(f"{__name__}.choices")
    if name in choices.METHOD_LISTS:
        return getattr(choices, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
