"""Rules across keys: small named functions, run in the order of :data:`RULES` after every key's
own check (:mod:`fedunlearn.config.constraints`), so each may assume its keys are valid alone.

A rule of one group takes that group's view (:class:`ConfigGroup`), so a direct user of the group's
parameters (:class:`fedunlearn.certified.certificate.CertifiedRemovalParams`) runs the same rule
through :func:`validate_group`; every other rule takes the whole configuration (an
:class:`fedunlearn.config.ExperimentConfig`, annotated by its base :class:`RunParameters`: the
configuration imports the rules, never the reverse).

The rules themselves live by the phase they check: :mod:`fedunlearn.config.training_rules` (the data
and the model, retention, aggregation and sampling) and :mod:`fedunlearn.config.request_rules` (the
unlearning request, the certified head, scrubbing, the audit, the judge and poisoning); the group
view is :mod:`fedunlearn.config.group`. This module runs them, and parses partition ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedunlearn.config.choices import ADOPT_FEDERATION_SIZE
from fedunlearn.config.constraints import validate_parameter_constraints
from fedunlearn.config.group import ConfigGroup
from fedunlearn.config.parameters import RunParameters
from fedunlearn.config.request_rules import (
    check_adoptable_method,
    check_attack,
    check_attack_combinations,
    check_attackers_removed,
    check_audit_same_target,
    check_audit_target,
    check_backdoor_class,
    check_certified_clients,
    check_judge,
    check_keep_training,
    check_perturbation,
    check_recipes,
    check_scrub_cohort,
    check_someone_remains,
    check_stack,
    check_target_participation,
)
from fedunlearn.config.table import parameter_constraints
from fedunlearn.config.training_rules import (
    check_aggregation,
    check_calibration_clients,
    check_data_root,
    check_dp_delta,
    check_model_fits_dataset,
    check_optional_packages,
    check_retain_mode,
    check_retention_for_methods,
    check_sampling,
    check_train_samples_cover_clients,
    check_user_code,
)
from fedunlearn.errors import ConfigError


def partition_ids(key: str, value: str, num_clients: int) -> list[int]:
    """Partition ids from ``"3"`` or ``"0,5"`` ("" = none), each in ``[0, num_clients)``; while
    ``num_clients`` is :data:`ADOPT_FEDERATION_SIZE` only ``>= 0`` (the bound is checked once the
    federation's size is adopted)."""
    text = value.replace(" ", "")
    if not text:
        return []
    adopting = num_clients == ADOPT_FEDERATION_SIZE
    ids = "partition ids >= 0" if adopting else f"partition ids in [0, {num_clients - 1}]"
    allowed = f"comma-separated {ids}, e.g. '0' or '0,5'"
    try:
        targets = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(key, value, allowed) from None
    if any(t < 0 or (not adopting and t >= num_clients) for t in targets):
        raise ConfigError(key, value, allowed)
    return sorted(set(targets))


Rule = Callable[[Any], None]
#: Every rule across keys, in the order they run: ``(group, rule)``; a rule with a group takes that
#: group's view, one without takes the whole configuration.
RULES: tuple[tuple[str | None, Rule], ...] = (
    (None, check_user_code),
    (None, check_optional_packages),
    (None, check_model_fits_dataset),
    (None, check_train_samples_cover_clients),
    (None, check_data_root),
    (None, check_dp_delta),
    (None, check_someone_remains),
    (None, check_retention_for_methods),
    (None, check_retain_mode),
    (None, check_calibration_clients),
    (None, check_aggregation),
    (None, check_sampling),
    (None, check_target_participation),
    (None, check_keep_training),
    (None, check_adoptable_method),
    (None, check_recipes),
    ("certified", check_perturbation),
    (None, check_certified_clients),
    (None, check_scrub_cohort),
    (None, check_audit_target),
    (None, check_audit_same_target),
    (None, check_judge),
    (None, check_stack),
    (None, check_backdoor_class),
    (None, check_attack),
    (None, check_attackers_removed),
    (None, check_attack_combinations),
)


def validate_group(view: ConfigGroup) -> None:
    """Check a group's values alone (each present name's constraint), then the group's rules."""
    constraints = parameter_constraints(view.name, by="name")
    validate_parameter_constraints(
        {view.key(name): value for name, value in view.items()},
        {view.key(name): constraint for name, constraint in constraints.items()},
    )
    for group, rule in RULES:
        if group == view.name:
            rule(view)


def validate_config(config: RunParameters) -> None:
    """Every key's own constraint, then every rule of :data:`RULES`."""
    validate_parameter_constraints(config.to_run_config(), parameter_constraints())
    for group, rule in RULES:
        rule(config.group(group) if group else config)
