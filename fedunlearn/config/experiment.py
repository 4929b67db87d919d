"""The experiment's run configuration: parsed from Flower's run config, validated before any work.

Validation happens here, up front, so a bad value stops a run before a file is written; each error
names the parameter, the value found and what is allowed (:class:`fedunlearn.errors.ConfigError`).
What needs the dataset or the disk is checked later by :mod:`fedunlearn.preflight`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedunlearn.config import choices
from fedunlearn.config.constraints import coerce
from fedunlearn.config.group import ConfigGroup
from fedunlearn.config.parameters import GROUPS, RunParameters
from fedunlearn.config.paths import expand_path
from fedunlearn.config.rules import partition_ids, validate_config
from fedunlearn.config.table import method_parameters, parameter_constraints, parameter_table
from fedunlearn.errors import ConfigError, did_you_mean

#: Keys a later version took out: key -> (the value that meant "off", what replaced it). A run
#: directory's ``config.json`` written before holds the key at that value, and is read without it;
#: another value is refused, naming what to set instead.
RETIRED_KEYS = {
    "pga-stop-accuracy": (
        0.0,
        "a retired key: PGA's accuracy stop is now the paper's, pga-stop = validation with "
        "pga-stop-margin (validation accuracy below w_ref's minus the margin); remove the key",
    ),
}


def _without_retired(run_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``run_config`` without the :data:`RETIRED_KEYS` it holds at their "off" value."""
    for key, (off, replaced) in RETIRED_KEYS.items():
        if key in run_config and run_config[key] not in (off, str(off)):
            raise ConfigError(key, run_config[key], replaced)
    return {k: v for k, v in run_config.items() if k not in RETIRED_KEYS}


def _by_home(values: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for :class:`ExperimentConfig`: the fields' values as they are, the
    registered methods' keys gathered under ``method_values``."""
    own = {row.attribute for row in method_parameters()}
    out: dict[str, Any] = {k: v for k, v in values.items() if k not in own}
    methods = {k: v for k, v in values.items() if k in own}
    return {**out, "method_values": methods} if methods else out


@dataclass(frozen=True)
class ExperimentConfig(RunParameters):
    """A validated run configuration: the keys of the table as flat attributes
    (``config.num_clients``, ``config.crab_window``) and as group views (``config.certified.lam``).

    The keys every run reads are the fields of
    :class:`~fedunlearn.config.parameters.RunParameters`; the registered methods' own keys
    (``MethodSpec.keys``) are held in ``method_values`` (attribute -> value, every such key of the
    registered methods, defaults filled in) and read as attributes all the same.

    Build it with :meth:`from_run_config`; the constructor does not validate.
    """

    method_values: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def __post_init__(self) -> None:
        """Fill in the default of every registered method's key not given; refuse one no
        registered method declares."""
        rows = {row.attribute: row for row in method_parameters()}
        unknown = sorted(set(self.method_values) - set(rows))
        if unknown:
            raise ConfigError(
                "run-config",
                unknown[0].replace("_", "-"),
                f"a key of a registered method{did_you_mean(unknown[0], rows)}",
            )
        values = {name: row.default for name, row in rows.items()} | dict(self.method_values)
        object.__setattr__(self, "method_values", values)

    def __getattr__(self, name: str) -> Any:
        """A registered method's key (``config.crab_window``); called only when no field or
        property has ``name``."""
        values = self.__dict__.get("method_values")
        if values is None or name not in values:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return values[name]

    # ------------------------------------------------------------------ construction
    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The run-config keys, spelled with hyphens."""
        return tuple(row.key for row in parameter_table())

    @classmethod
    def from_run_config(
        cls, run_config: Mapping[str, Any], *, strict: bool = True
    ) -> ExperimentConfig:
        """Parse and validate a Flower run config (a flat mapping of hyphenated keys).

        Parameters
        ----------
        run_config : Mapping[str, Any]
            Values for some or all keys; missing keys take the defaults of the table.
        strict : bool, default True
            Reject keys this experiment does not know (a typo would otherwise be ignored).
        """
        known = cls.keys()
        run_config = _without_retired(run_config)
        if strict:
            unknown = sorted(set(run_config) - set(known))
            if unknown:
                raise ConfigError(
                    "run-config",
                    unknown[0],
                    f"unknown key{did_you_mean(unknown[0], known)} (every key, its default and "
                    "what it accepts: docs/configuration.md)",
                )
        values = {
            row.attribute: coerce(row.key, run_config[row.key], row.kind)
            for row in parameter_table()
            if row.key in run_config
        }
        config = cls(**_by_home(values))
        config.validate()
        return config

    def to_run_config(self) -> dict[str, Any]:
        """The configuration as Flower's flat, hyphenated run-config mapping."""
        return {row.key: getattr(self, row.attribute) for row in parameter_table()}

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A validated copy with some keys changed (Python names, underscores), a registered
        method's too."""
        fields = _by_home(changes)
        fields["method_values"] = {**self.method_values, **fields.get("method_values", {})}
        config = dataclasses.replace(self, **fields)
        config.validate()
        return config

    def with_federation_size(self, size: int) -> ExperimentConfig:
        """This configuration for a federation of ``size`` SuperNodes (their ``num-partitions``):
        ``num-clients`` = 0 (:data:`~fedunlearn.config.choices.ADOPT_FEDERATION_SIZE`) adopts
        ``size`` and the rules that need K are checked again; a set ``num-clients`` must equal it.

        Raises
        ------
        ConfigError
            ``num-clients`` when it is set to another size, or when the adopted size breaks a rule
            (e.g. ``unlearn-clients`` naming a partition the federation does not have).
        """
        if self.num_clients == size:
            return self
        if self.num_clients != choices.ADOPT_FEDERATION_SIZE:
            raise ConfigError(
                "num-clients",
                self.num_clients,
                f"equal to the federation's num-partitions ({size}); run with --federation-config "
                f"'num-supernodes={self.num_clients}', set num-clients={size}, or 0 to adopt it",
            )
        return self.replace(num_clients=size)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first parameter whose value is not allowed: each
        key alone (the constraints table), then the rules across keys
        (:data:`fedunlearn.config.rules.RULES`)."""
        validate_config(self)

    # ------------------------------------------------------------------ group views
    def group(self, name: str) -> ConfigGroup:
        """One group's values by their names in the group; errors name the run-config keys."""
        if name not in GROUPS:
            raise ConfigError("group", name, f"one of {', '.join(GROUPS)}")
        rows = [row for row in parameter_table() if row.group == name]
        return ConfigGroup(
            name,
            {row.name: getattr(self, row.attribute) for row in rows},
            {row.name: row.key for row in rows},
        )

    data = property(lambda self: self.group("data"), doc="The data group's view.")
    training = property(lambda self: self.group("training"), doc="The training group's view.")
    federation = property(lambda self: self.group("federation"), doc="The federation's view.")
    poisoning = property(lambda self: self.group("poisoning"), doc="The poisoning attack's view.")
    unlearning = property(lambda self: self.group("unlearning"), doc="The unlearning view.")
    certified = property(lambda self: self.group("certified"), doc="The certified head's view.")
    scrubbing = property(lambda self: self.group("scrubbing"), doc="The scrubbing group's view.")
    audit = property(lambda self: self.group("audit"), doc="The membership audit's view.")
    judge = property(lambda self: self.group("judge"), doc="The judge's view.")

    # ------------------------------------------------------------------ paths
    @property
    def data_root_path(self) -> Path:
        return expand_path("data-root", self.data_root)

    @property
    def output_path(self) -> Path:
        return expand_path("output-dir", self.output_dir, Path.cwd(), resolve=True)

    @property
    def code_path_folder(self) -> Path:
        """``code-path`` as a path on this machine (``~`` expanded)."""
        return Path(self.code_path).expanduser()

    @property
    def _dataset_label(self) -> str:
        """The dataset as a folder name: a user's ``mypkg.data:load`` becomes ``mypkg-data-load``."""
        return self.dataset.replace(".", "-").replace(":", "-").replace("_", "-").lower()

    def run_directory(self, now: float | None = None) -> Path:
        """``output-dir/run-name``; an empty run-name becomes ``<dataset>-<YYYYmmdd-HHMMSS>``."""
        name = (
            self.run_name
            or f"{self._dataset_label}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
        )
        return self.output_path / name

    # ------------------------------------------------------------------ derived values
    @property
    def training_seed(self) -> int:
        """The seed of the initial model and of the clients' batch order: ``model-seed``, or
        ``seed`` when it is -1 (the data split always follows ``seed``)."""
        return self.seed if self.model_seed < 0 else self.model_seed

    @property
    def stack_members(self) -> int:
        """N when the run trains N federations as one stack (``judge-models`` or
        ``stack-models``), else 0 (one network)."""
        return self.judge_models or self.stack_models

    @property
    def unlearn_targets(self) -> list[int]:
        """The partition ids to forget, from ``unlearn-clients`` ("" = none, "3" or "0,5"),
        parsed once (a fresh list each read)."""
        return list(self._unlearn_targets)

    @functools.cached_property
    def _unlearn_targets(self) -> tuple[int, ...]:
        return tuple(partition_ids("unlearn-clients", self.unlearn_clients, self.num_clients))

    @property
    def attack_targets(self) -> list[int]:
        """The malicious clients' partition ids, from ``attack-clients`` ("" = no attack)."""
        return partition_ids("attack-clients", self.attack_clients, self.num_clients)

    @property
    def certified_client_targets(self) -> list[int]:
        """Clients whose whole data the certified head removes (``certified-remove-clients``)."""
        return partition_ids(
            "certified-remove-clients", self.certified_remove_clients, self.num_clients
        )

    @property
    def methods(self) -> list[str]:
        """The unlearning methods to run, in the order given by ``unlearn-methods``."""
        return parameter_constraints()["unlearn-methods"].parse(
            "unlearn-methods", self.unlearn_methods
        )

    @property
    def adoption_candidates(self) -> list[str]:
        """The methods whose trajectory may become the retained history after this request, in
        preference order; each writes its trajectory while it runs and the request adopts one
        once the models are measured (:func:`fedunlearn.unlearning.verdicts.choose_adoption`).

        ``unlearn-adopt`` names one; ``auto`` takes federaser, fedretrain among the methods run,
        leaving out one whose trajectory would not keep what the request's methods need when
        another's would (FedEraser's trajectory keeps its Δt schedule only: after it, a request
        could not run FedRecover, Crab or SIFU)."""
        from fedunlearn.registry import UNLEARNING, retention_policies, trajectory_serves

        methods, adoptable = self.methods, choices.ADOPTABLE_METHODS
        if self.unlearn_adopt != "auto":
            if self.unlearn_adopt not in methods:
                raise ConfigError(
                    "unlearn-adopt",
                    self.unlearn_adopt,
                    f"auto or one of the methods this request runs ({', '.join(methods)}): its "
                    "trajectory becomes the retained history",
                )
            return [self.unlearn_adopt]
        candidates = [method for method in adoptable if method in methods]
        if not candidates:
            raise ConfigError(
                "unlearn-methods",
                self.unlearn_methods,
                f"a list with {' or '.join(adoptable)}: after the request the retained history "
                "becomes that method's trajectory (the original one is deleted)",
            )
        if len(candidates) == 1:
            return candidates
        needs = set(retention_policies(methods))
        serving = [m for m in candidates if needs <= set(trajectory_serves(UNLEARNING[m]))]
        return serving or candidates

    @property
    def forget_set(self):
        """The cohort D_f named by ``scrub-forget``
        (:class:`fedunlearn.data.forget_sets.ForgetSet`)."""
        from fedunlearn.data.forget_sets import ForgetSet

        if not self.scrub_forget.strip():
            raise ConfigError(
                "scrub-forget", self.scrub_forget, "a cohort when scrub=true, e.g. 'class:5'"
            )
        return ForgetSet.parse(self.scrub_forget, num_clients=self.num_clients)

    @property
    def judge_metric_names(self) -> list[str]:
        """The judge's registered tests to run (``judge-metrics``), in the order given."""
        return parameter_constraints()["judge-metrics"].parse("judge-metrics", self.judge_metrics)

    @property
    def scrubbing_methods(self) -> list[str]:
        """The scrubbing methods and baselines to run (``scrub-methods``), in the order given."""
        return parameter_constraints()["scrub-methods"].parse("scrub-methods", self.scrub_methods)

    @property
    def scrub_lambda_grid(self) -> list[float]:
        """The factors multiplying each method's lambda for the information/error trade-off."""
        return parameter_constraints()["scrub-lambda-factors"].parse(
            "scrub-lambda-factors", self.scrub_lambda_factors
        )
