"""The experiment's run configuration: parsed from Flower's run config, validated before any work.

Every key is spelled as in ``[tool.flwr.app.config]`` of ``pyproject.toml``. Validation happens
here, up front, so a bad value stops a run before a file is written; each error names the parameter,
the value found and what is allowed (:class:`fedunlearn.errors.ConfigError`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError
from fedunlearn.registry import SCRUBBING, UNLEARNING

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "adult")
PARTITIONINGS = ("iid", "dirichlet", "shards")
STORE_DTYPES = ("float32", "float16")
DEVICES = ("auto", "cpu", "cuda")
MODELS = ("auto", "digits-cnn", "mnist-cnn", "cifar10-cnn", "adult-mlp")
# The method lists come from the registries (fedunlearn.registry): UNLEARNING_METHODS,
# ADOPTABLE_METHODS and SCRUB_METHODS are read from them on every access (module __getattr__ below),
# so a method registered later is listed, validated and run like a built-in one.
_METHOD_LISTS = {
    "UNLEARNING_METHODS": lambda: UNLEARNING.names(),
    #: Methods whose trajectory can become the retained history after a request (unlearn-adopt).
    "ADOPTABLE_METHODS": lambda: UNLEARNING.names(adoptable=True),
    #: Scrubbing methods (Golatkar et al.) and baselines; "original" and "retrain" always run.
    "SCRUB_METHODS": lambda: SCRUBBING.names(),
}


def __getattr__(name: str):
    if name in _METHOD_LISTS:
        return _METHOD_LISTS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Largest federation a run may ask for: the simulation launches one SuperNode per client before
#: any of them is checked, and the server queries every one of them each round.
MAX_CLIENTS = 10_000
#: Seeds feed scikit-learn's and NumPy's generators, which take unsigned 32-bit seeds.
MAX_SEED = 2**32 - 1
#: Beyond this the Dirichlet split is iid in all but name (and its draws overflow near 1e308).
MAX_ALPHA = 1e6
#: Flower's run config holds 64-bit integers; a larger one fails when the run is submitted.
INT64 = (-(2**63), 2**63 - 1)
#: A run directory's name: portable across file systems and shells, never hidden, never an option.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
RUN_NAME_ALLOWED = (
    "a plain folder name without path separators: 1 to 100 characters from A-Z, a-z, 0-9, '.', "
    "'_', '-', not starting with '.' or '-' (or empty for <dataset>-<timestamp>)"
)
#: Longest output-dir (bytes, once ~ and $VARS are expanded): PATH_MAX is 4096 on Linux, and the run
#: directory adds its name and the store's nested files.
MAX_PATH_BYTES = 3072
#: The input shape of one sample of each dataset, to check a model fits before any data is loaded
#: (Adult's width depends on its categories; only its rank matters to the model).
SAMPLE_SHAPES = {
    "digits": (1, 8, 8),
    "mnist": (1, 28, 28),
    "fashion-mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "adult": (100,),
}


def _key(field_name: str) -> str:
    return field_name.replace("_", "-")


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated run configuration (see ``[tool.flwr.app.config]`` for each key's meaning).

    Build it with :meth:`from_run_config`; the constructor does not validate.
    """

    dataset: str = "digits"
    data_root: str = ""
    download: bool = False
    model: str = "auto"
    num_clients: int = 10
    train_samples: int = 0
    partitioning: str = "iid"
    alpha: float = 0.5
    shards_per_client: int = 2
    rounds: int = 20
    local_epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 32
    fraction_evaluate: float = 0.0
    retain: bool = True
    retain_interval: int = 2
    store_dtype: str = "float32"
    seed: int = 0
    device: str = "auto"
    output_dir: str = "~/fedunlearn-runs"
    run_name: str = ""
    resume: bool = False
    node_wait_seconds: float = 120.0
    unlearn_clients: str = "0"
    unlearn_methods: str = ",".join(UNLEARNING.names())
    calibration_ratio: float = 0.5
    calibration_layerwise: bool = True
    calibration_order: str = "client"
    unlearn_only: bool = False
    unlearn_adopt: str = "auto"
    keep_original: bool = False
    max_refusals: int = 3
    min_reply_fraction: float = 0.5
    certified_head: bool = False
    certified_loss: str = "logistic"
    certified_lambda: float = 1e-3
    certified_sigma: float = 1.0
    certified_epsilon: float = 1.0
    certified_delta: float = 1e-4
    certified_noise: str = "gaussian"
    certified_mode: str = "fast"
    certified_bound: str = "per-point"
    certified_gamma: str = "exact"
    certified_refresh_ratio: float = 5.0
    certified_removals: int = 100
    certified_remove_clients: str = ""
    certified_eval_every: int = 10
    certified_verify_central: bool = True
    dp_noise_multiplier: float = 0.0
    dp_clipping_norm: float = 1.0
    dp_delta: float = 1e-5
    scrub: bool = False
    scrub_forget: str = ""
    scrub_methods: str = ",".join(SCRUBBING.names())
    scrub_newton_lambda: float = 1e-6
    scrub_fisher_lambda: float = 1e-7
    scrub_fisher_sqrt_lambda: float = 1e-11
    scrub_fisher_reference_lambda: float = 1e-12
    scrub_sigma_h: float = 1.0
    scrub_lambda_factors: str = "0.01,0.1,1,10,100"
    scrub_damping: float = 1e-3
    scrub_fisher_floor: float = 1e-3
    scrub_fisher_samples: int = 1000
    scrub_time: float = 0.0
    scrub_baseline_rounds: int = 2
    scrub_baseline_epochs: int = 1
    scrub_relearn_threshold: float = 0.3
    scrub_relearn_epochs: float = 1.0
    mia: bool = False
    mia_reference_models: int = 2

    # ------------------------------------------------------------------ construction
    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The run-config keys, spelled with hyphens."""
        return tuple(_key(f.name) for f in fields(cls))

    @classmethod
    def from_run_config(
        cls, run_config: Mapping[str, Any], *, strict: bool = True
    ) -> ExperimentConfig:
        """Parse and validate a Flower run config (a flat mapping of hyphenated keys).

        Parameters
        ----------
        run_config : Mapping[str, Any]
            Values for some or all keys; missing keys take the defaults above.
        strict : bool, default True
            Reject keys this experiment does not know (a typo would otherwise be ignored).
        """
        known = {_key(f.name): f for f in fields(cls)}
        if strict:
            unknown = sorted(set(run_config) - set(known))
            if unknown:
                raise ConfigError(
                    "run-config", unknown[0], f"unknown key; known keys are {', '.join(known)}"
                )
        values: dict[str, Any] = {}
        for key, field in known.items():
            if key in run_config:
                values[field.name] = _coerce(key, run_config[key], field.default)
        config = cls(**values)
        config.validate()
        return config

    def to_run_config(self) -> dict[str, Any]:
        """The configuration as Flower's flat, hyphenated run-config mapping."""
        return {_key(k): v for k, v in dataclasses.asdict(self).items()}

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A validated copy with some fields changed (Python names, underscores)."""
        config = dataclasses.replace(self, **changes)
        config.validate()
        return config

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first parameter whose value is not allowed.

        Only the keys themselves are checked here (each alone and against the others); what needs
        the dataset or the disk is checked by :mod:`fedunlearn.preflight`.
        """
        self._validate_paths()
        self._validate_data()
        self._validate_training()
        self._validate_unlearning()
        self._validate_certified()
        self._validate_scrub()
        self._validate_mia()

    def _validate_paths(self) -> None:
        check_path_text("output-dir", self.output_dir)
        if not self.output_dir.strip():
            raise ConfigError(
                "output-dir", self.output_dir, "a folder path, e.g. ~/fedunlearn-runs"
            )
        if self.data_root:
            check_path_text("data-root", self.data_root)
        if self.run_name and not RUN_NAME.fullmatch(self.run_name):
            raise ConfigError("run-name", self.run_name, RUN_NAME_ALLOWED)

    def _validate_data(self) -> None:
        _one_of("dataset", self.dataset, DATASETS)
        _one_of("partitioning", self.partitioning, PARTITIONINGS)
        _one_of("model", self.model, MODELS)
        _check_model_fits(self.model, self.dataset)
        _between("num-clients", self.num_clients, 1, MAX_CLIENTS)
        _at_least("train-samples", self.train_samples, 0)
        if 0 < self.train_samples < self.num_clients:
            raise ConfigError(
                "train-samples",
                self.train_samples,
                f"0 (the whole training set) or at least num-clients={self.num_clients}",
            )
        _at_least("shards-per-client", self.shards_per_client, 1)
        _positive("alpha", self.alpha)
        if self.alpha > MAX_ALPHA:
            raise ConfigError(
                "alpha", self.alpha, f"a number in (0, {MAX_ALPHA:g}] (for a uniform split: iid)"
            )
        _between("seed", self.seed, 0, MAX_SEED)
        if self.data_root and not self.download and not self.data_root_path.is_dir():
            raise ConfigError(
                "data-root",
                self.data_root,
                f"the directory {self.data_root_path} does not exist (set download=true to fetch "
                "the dataset into it)",
            )
        if self.dataset != "digits" and not self.data_root:
            raise ConfigError(
                "data-root",
                self.data_root,
                f"dataset {self.dataset!r} needs a data root in torchvision's layout "
                "(e.g. a folder holding MNIST/raw); only 'digits' is embedded",
            )

    def _validate_training(self) -> None:
        _one_of("store-dtype", self.store_dtype, STORE_DTYPES)
        _one_of("device", self.device, DEVICES)
        _at_least("rounds", self.rounds, 1)
        _at_least("local-epochs", self.local_epochs, 1)
        _at_least("batch-size", self.batch_size, 1)
        _at_least("retain-interval", self.retain_interval, 1)
        _positive("lr", self.lr)
        _positive("node-wait-seconds", self.node_wait_seconds)
        _in_range("momentum", self.momentum, 0.0, 1.0, closed_high=False)
        _in_range("weight-decay", self.weight_decay, 0.0, math.inf)
        _in_range("fraction-evaluate", self.fraction_evaluate, 0.0, 1.0)
        _in_range("dp-noise-multiplier", self.dp_noise_multiplier, 0.0, math.inf)
        _positive("dp-clipping-norm", self.dp_clipping_norm)
        _in_range("dp-delta", self.dp_delta, 0.0, 1.0, closed_high=False)
        if self.dp_noise_multiplier > 0 and self.dp_delta == 0:
            raise ConfigError(
                "dp-delta", self.dp_delta, "a number in (0, 1) when dp-noise-multiplier > 0"
            )

    def _validate_unlearning(self) -> None:
        _one_of("calibration-order", self.calibration_order, ("client", "average"))
        _in_range("calibration-ratio", self.calibration_ratio, 0.0, 1.0)
        if self.calibration_ratio == 0.0:
            raise ConfigError("calibration-ratio", self.calibration_ratio, "a number in (0, 1]")
        targets = self.unlearn_targets  # parses and range-checks
        if len(set(targets)) >= self.num_clients:
            raise ConfigError(
                "unlearn-clients",
                self.unlearn_clients,
                f"fewer than all {self.num_clients} clients: someone must remain",
            )
        methods = self.methods
        rebuilding = [m for m in methods if "retained-updates" in UNLEARNING[m].needs]
        if targets and not self.retain and rebuilding:
            raise ConfigError(
                "retain",
                self.retain,
                f"true: {', '.join(rebuilding)} rebuild the model from retained updates "
                "(or set unlearn-methods='fedretrain')",
            )
        _one_of("unlearn-adopt", self.unlearn_adopt, ("auto", *UNLEARNING.names(adoptable=True)))
        if targets:
            _ = self.adopted_method  # raises when no method of this request can be adopted
        _at_least("max-refusals", self.max_refusals, 1)
        _in_range("min-reply-fraction", self.min_reply_fraction, 0.0, 1.0)
        if self.min_reply_fraction == 0.0:
            raise ConfigError("min-reply-fraction", 0.0, "a number in (0, 1]")
        if self.unlearn_only and not (self.run_name and targets):
            raise ConfigError(
                "unlearn-only",
                True,
                "set together with run-name (the trained run) and unlearn-clients (whom to forget)",
            )
        if self.resume and not self.run_name:
            raise ConfigError(
                "resume",
                True,
                "set together with run-name (the interrupted run to continue under output-dir)",
            )
        if self.resume and self.unlearn_only:
            raise ConfigError(
                "resume",
                True,
                "false with unlearn-only = true (an interrupted unlearn-only request is simply "
                "run again)",
            )

    def _validate_certified(self) -> None:
        # Imported here: the certified-removal module pulls in SciPy, which plain runs do not need.
        from fedunlearn.certified.removal import BOUNDS, GAMMAS, MODES, NOISES
        from fedunlearn.certified.losses import LOSSES

        _one_of("certified-loss", self.certified_loss, LOSSES)
        _one_of("certified-noise", self.certified_noise, NOISES)
        _one_of("certified-mode", self.certified_mode, MODES)
        _one_of("certified-bound", self.certified_bound, BOUNDS)
        _one_of("certified-gamma", self.certified_gamma, GAMMAS)
        _positive("certified-lambda", self.certified_lambda)
        _positive("certified-refresh-ratio", self.certified_refresh_ratio)
        _positive("certified-epsilon", self.certified_epsilon)
        _in_range("certified-delta", self.certified_delta, 0.0, 1.0, closed_high=False)
        if self.certified_delta == 0.0:  # (epsilon, delta)-CR divides by delta (Guo et al. Thm 3)
            raise ConfigError("certified-delta", self.certified_delta, "a number in (0, 1)")
        if self.certified_noise != "none":
            _positive("certified-sigma", self.certified_sigma)
        elif self.certified_loss != "least-squares":
            raise ConfigError(
                "certified-noise",
                self.certified_noise,
                "gaussian or gamma for the logistic loss (only least squares removes exactly)",
            )
        _at_least("certified-removals", self.certified_removals, 0)
        _at_least("certified-eval-every", self.certified_eval_every, 1)
        targets = self.certified_client_targets
        if len(targets) >= self.num_clients:
            raise ConfigError(
                "certified-remove-clients",
                self.certified_remove_clients,
                f"fewer than all {self.num_clients} clients: some data must remain",
            )

    # ------------------------------------------------------------------ derived values
    @property
    def certified_client_targets(self) -> list[int]:
        """Clients whose whole data the certified head removes (``certified-remove-clients``)."""
        return _partition_list(
            "certified-remove-clients", self.certified_remove_clients, self.num_clients
        )

    @property
    def data_root_path(self) -> Path:
        return Path(os.path.expandvars(self.data_root)).expanduser()

    @property
    def output_path(self) -> Path:
        return Path(os.path.expandvars(self.output_dir)).expanduser().resolve()

    def run_directory(self, now: float | None = None) -> Path:
        """``output-dir/run-name``; an empty run-name becomes ``<dataset>-<YYYYmmdd-HHMMSS>``."""
        name = (
            self.run_name or f"{self.dataset}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
        )
        return self.output_path / name

    @property
    def unlearn_targets(self) -> list[int]:
        """The partition ids to forget, from ``unlearn-clients`` ("" = none, "3" or "0,5")."""
        return _partition_list("unlearn-clients", self.unlearn_clients, self.num_clients)

    @property
    def methods(self) -> list[str]:
        """The unlearning methods to run, in the order given by ``unlearn-methods``."""
        return UNLEARNING.parse(self.unlearn_methods, allow_empty=False)

    @property
    def adopted_method(self) -> str:
        """The method whose trajectory becomes the retained history after an unlearning request:
        ``unlearn-adopt``, where ``auto`` is the first of federaser, fedretrain this request runs."""
        methods = self.methods
        if self.unlearn_adopt == "auto":
            adoptable = UNLEARNING.names(adoptable=True)
            for method in adoptable:
                if method in methods:
                    return method
            raise ConfigError(
                "unlearn-methods",
                self.unlearn_methods,
                f"a list with {' or '.join(adoptable)}: after the request the retained "
                "history becomes that method's trajectory (the original one is deleted)",
            )
        if self.unlearn_adopt not in methods:
            raise ConfigError(
                "unlearn-adopt",
                self.unlearn_adopt,
                f"auto or one of the methods this request runs ({', '.join(methods)}): its "
                "trajectory becomes the retained history",
            )
        return self.unlearn_adopt

    def _validate_scrub(self) -> None:
        for key in (
            "scrub-newton-lambda",
            "scrub-fisher-lambda",
            "scrub-fisher-sqrt-lambda",
            "scrub-fisher-reference-lambda",
            "scrub-sigma-h",
        ):
            _positive(key, getattr(self, key.replace("-", "_")))
        _in_range("scrub-damping", self.scrub_damping, 0.0, math.inf)
        _in_range("scrub-fisher-floor", self.scrub_fisher_floor, 0.0, math.inf)
        _in_range("scrub-time", self.scrub_time, 0.0, math.inf)
        _at_least("scrub-fisher-samples", self.scrub_fisher_samples, 1)
        _at_least("scrub-baseline-rounds", self.scrub_baseline_rounds, 1)
        _at_least("scrub-baseline-epochs", self.scrub_baseline_epochs, 1)
        _positive("scrub-relearn-threshold", self.scrub_relearn_threshold)
        _positive("scrub-relearn-epochs", self.scrub_relearn_epochs)
        _ = self.scrub_lambda_grid, self.scrubbing_methods  # parse (and raise) now
        if self.scrub:
            _ = self.forget_set  # parses and range-checks

    def _validate_mia(self) -> None:
        _at_least("mia-reference-models", self.mia_reference_models, 2)
        if not self.mia:
            return
        if len(self.unlearn_targets) != 1:
            raise ConfigError(
                "unlearn-clients",
                self.unlearn_clients,
                "exactly one client when mia=true (the target every method forgets)",
            )
        if "fedretrain" not in self.methods:
            raise ConfigError(
                "unlearn-methods",
                self.unlearn_methods,
                "a list with fedretrain when mia=true (every method is judged against it)",
            )
        if self.certified_head and self.unlearn_targets[0] not in self.certified_client_targets:
            raise ConfigError(
                "certified-remove-clients",
                self.certified_remove_clients,
                f"a list with client {self.unlearn_targets[0]} when mia=true and "
                "certified-head=true: the certified head must forget the same target",
            )
        target = f"client:{self.unlearn_targets[0]}"
        if self.scrub and str(self.forget_set) != target:
            raise ConfigError(
                "scrub-forget",
                self.scrub_forget,
                f"{target!r} when mia=true: the scrubbing methods must forget the same target",
            )

    @property
    def forget_set(self):
        """The cohort D_f named by ``scrub-forget`` (:class:`fedunlearn.data.forget_sets.ForgetSet`)."""
        from fedunlearn.data.forget_sets import ForgetSet

        if not self.scrub_forget.strip():
            raise ConfigError(
                "scrub-forget", self.scrub_forget, "a cohort when scrub=true, e.g. 'class:5'"
            )
        return ForgetSet.parse(self.scrub_forget, num_clients=self.num_clients)

    @property
    def scrubbing_methods(self) -> list[str]:
        """The scrubbing methods and baselines to run (``scrub-methods``), in the order given."""
        return SCRUBBING.parse(self.scrub_methods)

    @property
    def scrub_lambda_grid(self) -> list[float]:
        """The factors multiplying each method's lambda for the information/error trade-off."""
        allowed = "comma-separated numbers > 0, e.g. '0.01,0.1,1,10,100'"
        try:
            factors = [float(f) for f in self.scrub_lambda_factors.replace(" ", "").split(",") if f]
        except ValueError:
            raise ConfigError("scrub-lambda-factors", self.scrub_lambda_factors, allowed) from None
        if any(not (f > 0 and math.isfinite(f)) for f in factors):
            raise ConfigError("scrub-lambda-factors", self.scrub_lambda_factors, allowed)
        return sorted(set(factors))

    def is_retained_round(self, server_round: int) -> bool:
        """FedEraser's schedule: t_1 = 1, t_{j+1} = t_j + Δt."""
        return self.retain and (server_round - 1) % self.retain_interval == 0


def _partition_list(key: str, value: str, num_clients: int) -> list[int]:
    """Partition ids from ``"3"`` or ``"0,5"`` ("" = none), each in ``[0, num_clients)``."""
    text = value.replace(" ", "")
    if not text:
        return []
    allowed = f"comma-separated partition ids in [0, {num_clients - 1}], e.g. '0' or '0,5'"
    try:
        targets = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(key, value, allowed) from None
    if any(not 0 <= t < num_clients for t in targets):
        raise ConfigError(key, value, allowed)
    return sorted(set(targets))


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Convert a run-config value to the type of its default, or say what was expected.

    Integer keys take integers (or their decimal text from a command line), never a float: TOML
    reads ``1e9`` and ``5.0`` as floats, and rounding them silently would hide a typo.
    """
    expected = type(default)
    if expected is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(key, value, "true or false")
    if expected is int:
        return _coerce_int(key, value)
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
            raise ConfigError(key, value, "a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, value, "a number") from None
        except OverflowError:
            raise ConfigError(key, value, "a finite number") from None
        if not math.isfinite(number):
            raise ConfigError(key, value, "a finite number")
        return number
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. unlearn-clients=3 from the command line, read as a TOML integer
    if not isinstance(value, str):
        raise ConfigError(key, value, "a string")
    return value


def _coerce_int(key: str, value: Any) -> int:
    allowed = "a whole number written as one, e.g. 100 (not 100.0, 1e2 or true)"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        number = int(value.strip())
    else:
        raise ConfigError(key, value, allowed)
    if not INT64[0] <= number <= INT64[1]:
        raise ConfigError(key, value, f"{allowed} between -2^63 and 2^63-1 (a 64-bit integer)")
    return number


def _unsafe_character(text: str) -> tuple[int, str] | None:
    """The first character (position, char) a path should not hold: control and format characters,
    unassigned or private-use code points, lone surrogates, line separators, non-ASCII spaces, and
    emoji with their modifiers and variation selectors. Letters of every script, combining accents,
    digits and punctuation are fine."""
    for position, char in enumerate(text):
        category = unicodedata.category(char)
        if (
            category[0] == "C"
            or category in ("So", "Me", "Zl", "Zp")
            or (category == "Zs" and char != " ")
            or (category == "Sk" and not char.isascii())
            or 0xFE00 <= ord(char) <= 0xFE0F
        ):
            return position, char
    return None


def check_path_text(key: str, value: str) -> None:
    """Refuse a path (``output-dir``, ``data-root``) that holds a character a folder name should
    not (:func:`_unsafe_character`), or that is too long to hold a run directory."""
    expanded = os.path.expanduser(os.path.expandvars(value))
    found = _unsafe_character(expanded)
    if found is not None:
        position, char = found
        raise ConfigError(
            key,
            value,
            "a folder path without control characters, emoji or other symbols (found "
            f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')} at position {position}"
            + (f" of {expanded!r}" if expanded != value else "")
            + ")",
        )
    size = len(expanded.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise ConfigError(key, value, f"a path of at most {MAX_PATH_BYTES} bytes (found {size})")
    too_long = [part for part in expanded.split(os.sep) if len(part.encode("utf-8")) > 255]
    if too_long:
        raise ConfigError(key, value, f"folder names of at most 255 bytes ({too_long[0][:20]}...)")


def _check_model_fits(model: str, dataset: str) -> None:
    """Refuse a model whose layers cannot take the dataset's samples (e.g. mnist-cnn's two 5x5
    convolutions on 8x8 digits), found by running it on PyTorch's meta device: no data needed."""
    if model == "auto" or dataset not in SAMPLE_SHAPES:
        return
    problem = model_problem(model, SAMPLE_SHAPES[dataset])
    if problem:
        fitting = [m for m in MODELS[1:] if not model_problem(m, SAMPLE_SHAPES[dataset])]
        raise ConfigError(
            "model",
            model,
            f"auto or a model that fits {dataset} samples of shape {SAMPLE_SHAPES[dataset]}: "
            f"{', '.join(fitting)} ({model}: {problem})",
        )


@functools.lru_cache(maxsize=64)
def model_problem(model: str, sample_shape: tuple[int, ...]) -> str:
    """Why ``model`` cannot classify samples of ``sample_shape`` ("" when it can)."""
    import torch

    from fedunlearn.training.models import build_model

    try:
        with torch.device("meta"):
            net = build_model(model, sample_shape, 2)
            net(torch.empty((1, *sample_shape)))
    except (ConfigError, RuntimeError, ValueError) as error:
        reason = error.allowed if isinstance(error, ConfigError) else str(error).split("\n")[0]
        return reason[:200]
    return ""



def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(allowed)}")


def _at_least(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(key, value, f"a whole number >= {minimum}")


def _between(key: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(key, value, f"a whole number in [{low}, {high}]")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(key, value, "a number > 0")


def _in_range(key: str, value: float, low: float, high: float, closed_high: bool = True) -> None:
    above = value > high if closed_high else value >= high
    if value < low or above:
        bracket = "]" if closed_high else ")"
        raise ConfigError(key, value, f"a number in [{low}, {high}{bracket}")
