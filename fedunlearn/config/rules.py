"""Rules across keys: small named functions, run in the order of :data:`RULES` after every key's
own check (:mod:`fedunlearn.config.constraints`), so each may assume its keys are valid alone.

A rule of one group takes that group's view (:class:`ConfigGroup`), so a direct user of the group's
parameters (:class:`fedunlearn.certified.certificate.CertifiedRemovalParams`) runs the same rule
through :func:`validate_group`; every other rule takes the whole configuration (an
:class:`fedunlearn.config.ExperimentConfig`, annotated by its base :class:`RunParameters`: the
configuration imports the rules, never the reverse).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fedunlearn.config import choices
from fedunlearn.config.choices import ADOPT_FEDERATION_SIZE, MODELS, SAMPLE_SHAPES
from fedunlearn.config.constraints import Interval, validate_parameter_constraints
from fedunlearn.config.parameters import RunParameters
from fedunlearn.config.table import parameter_constraints
from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING, norms_problem


class ConfigGroup(Mapping[str, Any]):
    """A read-only view of one group's values by their names in it (``config.certified.lam``).

    :meth:`key` is the name an error reports: the run-config key (``certified-lambda``) for a
    configuration's view, the name itself for a direct user's.
    """

    def __init__(self, name: str, values: Mapping[str, Any], keys: Mapping[str, str] | None = None):
        self.name, self._values, self._keys = name, dict(values), dict(keys or {})

    def key(self, name: str) -> str:
        return self._keys.get(name, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"group {self.name!r} has no {name!r}") from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ConfigGroup({self.name!r}, {self._values!r})"


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


def _size_known(config: RunParameters) -> bool:
    """Whether ``num-clients`` is known: a rule comparing against it waits for the federation's
    size when it is to be adopted (:meth:`fedunlearn.config.ExperimentConfig.with_federation_size` checks again)."""
    return config.num_clients != ADOPT_FEDERATION_SIZE


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


# ------------------------------------------------------------------ data and training
def check_model_fits_dataset(config: RunParameters) -> None:
    """The model's layers take the dataset's samples (e.g. not mnist-cnn's two 5x5 convolutions on
    8x8 digits), found by running it on PyTorch's meta device: no data needed."""
    model, dataset = config.model, config.dataset
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


def check_train_samples_cover_clients(config: RunParameters) -> None:
    """A subset of the training set holds at least one sample per client."""
    if 0 < config.train_samples < config.num_clients:
        raise ConfigError(
            "train-samples",
            config.train_samples,
            f"0 (the whole training set) or at least num-clients={config.num_clients}",
        )


def check_data_root(config: RunParameters) -> None:
    """A data root exists unless the dataset is to be downloaded into it, and every dataset but
    the embedded digits has one."""
    if config.data_root and not config.download and not config.data_root_path.is_dir():
        raise ConfigError(
            "data-root",
            config.data_root,
            f"an existing directory; {config.data_root_path} does not exist: fetch the data "
            f"with `fedunlearn data download {config.dataset} --root {config.data_root}` or "
            "--set download=true",
        )
    if config.dataset != "digits" and not config.data_root:
        raise ConfigError(
            "data-root",
            config.data_root,
            f"dataset {config.dataset!r} needs a data root in torchvision's layout "
            "(e.g. a folder holding MNIST/raw); only 'digits' is embedded",
        )


def check_dp_delta(config: RunParameters) -> None:
    """DP-SGD with noise has a delta > 0."""
    if config.dp_noise_multiplier > 0 and config.dp_delta == 0:
        raise ConfigError(
            "dp-delta", config.dp_delta, "a number in (0, 1) when dp-noise-multiplier > 0"
        )


# ------------------------------------------------------------------ unlearning
def check_someone_remains(config: RunParameters) -> None:
    """The clients to forget are partition ids, and not all of them."""
    if _size_known(config) and len(set(config.unlearn_targets)) >= config.num_clients:
        raise ConfigError(
            "unlearn-clients",
            config.unlearn_clients,
            f"fewer than all {config.num_clients} clients: someone must remain (forget fewer "
            "clients, raise num-clients, or unlearn-clients='' to train only)",
        )


def check_retention_for_methods(config: RunParameters) -> None:
    """Methods that read the history retained during training have it (``retain = true``)."""
    rebuilding = [m for m in choices.RETAINED_UPDATE_METHODS if m in config.methods]
    if config.unlearn_targets and not config.retain and rebuilding:
        raise ConfigError(
            "retain",
            config.retain,
            f"true: {', '.join(rebuilding)} rebuild the model from the history retained during "
            "training (or set unlearn-methods='fedretrain')",
        )


def check_retain_mode(config: RunParameters) -> None:
    """``retain-mode = norms`` keeps whole updates of round t_1 only: every method of the run reads
    no more (FedEraser with per-client calibration), or is refused before anything is trained."""
    if config.retain_mode != "norms" or not config.retain:
        return
    problems = [norms_problem(UNLEARNING[name]) for name in config.methods]
    problems = [problem for problem in problems if problem]
    if problems:
        keep = [name for name in config.methods if not norms_problem(UNLEARNING[name])]
        raise ConfigError(
            "retain-mode",
            config.retain_mode,
            f"'full' for these methods ({'; '.join(problems)}), or unlearn-methods without "
            f"them (e.g. '{','.join(keep) or 'federaser'}')",
        )
    if config.calibration_order == "average" and "federaser" in config.methods:
        raise ConfigError(
            "calibration-order",
            config.calibration_order,
            "'client' when retain-mode = norms: the paper code's average calibration needs the "
            "whole updates of every retained round",
        )


def _specs(config: RunParameters) -> list:
    """The registry entries of the run's unlearning methods (a name the choices list but no entry
    holds is the constraint's to report)."""
    return [UNLEARNING[name] for name in config.methods if name in UNLEARNING]


def check_aggregation(config: RunParameters) -> None:
    """Every unlearning method of the run supports its ``strategy``
    (:meth:`fedunlearn.registry.MethodSpec.aggregation_problem`); Krum has K > 2f + 2; FedProx's
    proximal term is not in a judge run's stacked training."""
    problems = [spec.aggregation_problem(config.strategy) for spec in _specs(config)]
    problems = [problem for problem in problems if problem]
    if problems:
        keep = [s.name for s in _specs(config) if not s.aggregation_problem(config.strategy)]
        raise ConfigError(
            "strategy",
            config.strategy,
            f"an aggregation every unlearning method supports ({'; '.join(problems)}), or "
            f"unlearn-methods without them (e.g. '{','.join(keep) or 'fedretrain'}')",
        )
    if config.strategy == "krum" and _size_known(config):
        if config.num_clients <= 2 * config.krum_malicious + 2:
            raise ConfigError(
                "krum-malicious",
                config.krum_malicious,
                f"f with num-clients > 2f + 2 (Krum's condition; num-clients = {config.num_clients})",
            )
    if config.strategy == "fedprox" and config.judge_models:
        raise ConfigError(
            "strategy", config.strategy, "fedavg for a judge run (its stack has no proximal term)"
        )


def check_sampling(config: RunParameters) -> None:
    """With ``fraction-train`` < 1 every unlearning method holds under sampling
    (:meth:`fedunlearn.registry.MethodSpec.sampling_problem`), neither DP-FedAvg's accountant nor a
    judge run's stacked federations (both assume every client in every round) is on, and
    ``min-train-clients`` does not exceed the federation."""
    fraction = config.fraction_train
    if fraction >= 1:
        return
    problems = [p for spec in _specs(config) if (p := spec.sampling_problem(fraction))]
    if problems:
        keep = [s.name for s in _specs(config) if not s.sampling_problem(fraction)]
        raise ConfigError(
            "fraction-train",
            fraction,
            f"1.0 for methods that need every client in every round ({'; '.join(problems)}), or "
            f"unlearn-methods without them (e.g. '{','.join(keep) or 'fedretrain'}')",
        )
    for on, what in (
        (config.dp_noise_multiplier > 0, "DP-FedAvg (dp-noise-multiplier > 0), whose accountant"),
        (bool(config.judge_models), "a judge run (judge-models), whose stacked federations"),
    ):
        if on:
            raise ConfigError(
                "fraction-train", fraction, f"1.0 with {what} assume every client in every round"
            )
    if _size_known(config) and config.min_train_clients > config.num_clients:
        raise ConfigError(
            "min-train-clients",
            config.min_train_clients,
            f"at most num-clients ({config.num_clients}) when fraction-train < 1",
        )
    if config.strategy == "krum" and _size_known(config):
        from fedunlearn.training.sampling import sample_size

        remaining = config.num_clients - len(config.unlearn_targets)  # FedRetrain's pool
        n = sample_size(remaining, fraction, config.min_train_clients)
        if n <= 2 * config.krum_malicious + 2:
            raise ConfigError(
                "fraction-train",
                fraction,
                f"a fraction whose rounds keep Krum's condition n > 2f + 2 (krum-malicious = "
                f"{config.krum_malicious}; a retraining round would train {n} clients)",
            )


def check_target_participation(config: RunParameters) -> None:
    """Methods whose leaving client works during the request run only when the config opts in."""
    participating = [spec.name for spec in _specs(config) if spec.target_participates]
    if participating and not config.allow_target_participation:
        raise ConfigError(
            "allow-target-participation",
            config.allow_target_participation,
            f"true to run {', '.join(participating)} (the leaving client trains during the "
            "request; it receives nothing after it), or unlearn-methods without them",
        )


def check_keep_training(config: RunParameters) -> None:
    """Keep-training's budget is another method of the same request (it runs after it), unless
    it is given in rounds (``keep-training-rounds``)."""
    if "keep-training" not in config.methods or config.keep_training_rounds:
        return
    if config.keep_training_budget not in config.methods:
        raise ConfigError(
            "keep-training-budget",
            config.keep_training_budget,
            f"a method of unlearn-methods ({', '.join(config.methods)}) whose client-epochs "
            "keep-training spends, or keep-training-rounds > 0",
        )


def check_adoptable_method(config: RunParameters) -> None:
    """A request runs a method whose trajectory can become the retained history
    (:attr:`fedunlearn.config.ExperimentConfig.adoption_candidates`)."""
    if config.unlearn_targets:
        _ = config.adoption_candidates


def check_recipes(config: RunParameters) -> None:
    """``unlearn-only`` names the trained run and whom to forget; ``resume`` names the run (with
    ``unlearn-only``: the same request again finishes an interrupted one, server.unlearning.journal)."""
    if config.unlearn_only and not (config.run_name and config.unlearn_targets):
        raise ConfigError(
            "unlearn-only",
            True,
            "set together with run-name (the trained run) and unlearn-clients (whom to forget)",
        )
    if config.resume and not config.run_name:
        raise ConfigError(
            "resume",
            True,
            "set together with run-name (the interrupted run to continue under output-dir)",
        )


# ------------------------------------------------------------------ certified head
def check_perturbation(certified: ConfigGroup) -> None:
    """The perturbation b has a scale sigma > 0; only least squares removes exactly without one."""
    if certified.noise != "none":
        positive = Interval(float, 0, closed="neither", note="the perturbation's scale")
        positive.check(certified.key("sigma"), certified.sigma)
    elif certified.loss != "least-squares":
        raise ConfigError(
            certified.key("noise"),
            certified.noise,
            "gaussian or gamma for the logistic loss (only least squares removes exactly without "
            "a perturbation)",
        )


def check_certified_clients(config: RunParameters) -> None:
    """The clients whose whole data the certified head removes are partition ids, not all."""
    if _size_known(config) and len(config.certified_client_targets) >= config.num_clients:
        raise ConfigError(
            "certified-remove-clients",
            config.certified_remove_clients,
            f"fewer than all {config.num_clients} clients: some data must remain",
        )


# ------------------------------------------------------------------ scrubbing and audit
def check_scrub_cohort(config: RunParameters) -> None:
    """Scrubbing names a cohort D_f of the federation (``scrub-forget``)."""
    if config.scrub:
        _ = config.forget_set


def check_audit_target(config: RunParameters) -> None:
    """The audit judges every method on one forgotten client, against FedRetrain."""
    if not config.mia:
        return
    if len(config.unlearn_targets) != 1:
        raise ConfigError(
            "unlearn-clients",
            config.unlearn_clients,
            "exactly one client when mia=true (the target every method forgets)",
        )
    if "fedretrain" not in config.methods:
        raise ConfigError(
            "unlearn-methods",
            config.unlearn_methods,
            "a list with fedretrain when mia=true (every method is judged against it)",
        )


def check_audit_same_target(config: RunParameters) -> None:
    """The certified head and the scrubbing methods forget the audit's target too."""
    if not config.mia:
        return
    client = config.unlearn_targets[0]
    if config.certified_head and client not in config.certified_client_targets:
        raise ConfigError(
            "certified-remove-clients",
            config.certified_remove_clients,
            f"a list with client {client} when mia=true and certified-head=true: the certified "
            "head must forget the same target",
        )
    target = f"client:{client}"
    if config.scrub and str(config.forget_set) != target:
        raise ConfigError(
            "scrub-forget",
            config.scrub_forget,
            f"{target!r} when mia=true: the scrubbing methods must forget the same target",
        )


# ------------------------------------------------------------------ judge
#: What a judge run must not ask for (key, value that is refused, why): each would treat the
#: stack of N models as one model (a norm, a clipping or a head over all of them at once).
_JUDGE_REFUSES = (
    ("calibration-layerwise", False, "true: eq. 2's norms are taken per model and per tensor"),
    ("certified-head", True, "false: the certified head is not run on a stack of models"),
    ("scrub", True, "false: the scrubbing phase is not run on a stack of models"),
    ("mia", True, "false: the judge replaces the audit in a judge run"),
    ("unlearn-only", True, "false: a judge run trains its own N federations"),
    ("resume", True, "false: a judge run is not resumed"),
)


def check_judge(config: RunParameters) -> None:
    """A judge run (``judge-models`` = N >= 3) trains N federations as one stack and forgets
    exactly one client with every method, against FedRetrain."""
    if config.judge_backdoor and not config.judge_models:
        raise ConfigError("judge-backdoor", True, "false unless judge-models >= 3")
    if not config.judge_models:
        return
    if config.judge_models < 3:
        raise ConfigError(
            "judge-models",
            config.judge_models,
            "0 (off) or at least 3 (U-LiRA holds one model out and fits on the others)",
        )
    if len(config.unlearn_targets) != 1:
        raise ConfigError(
            "unlearn-clients", config.unlearn_clients, "exactly one client when judge-models > 0"
        )
    if "fedretrain" not in config.methods:
        raise ConfigError(
            "unlearn-methods",
            config.unlearn_methods,
            "a list with fedretrain when judge-models > 0 (the reference population)",
        )
    if config.dp_noise_multiplier > 0:
        raise ConfigError(
            "dp-noise-multiplier", config.dp_noise_multiplier, "0 when judge-models > 0"
        )
    if "forgetting-score" not in config.judge_metric_names:
        raise ConfigError(
            "judge-metrics",
            config.judge_metrics,
            "a list with forgetting-score (the verdict compares its floor and ceiling)",
        )
    for key, refused, allowed in _JUDGE_REFUSES:
        if config.to_run_config()[key] == refused:
            raise ConfigError(key, refused, f"{allowed} (judge-models > 0)")


def check_backdoor_class(config: RunParameters) -> None:
    """The backdoor's target class is one of the dataset's classes."""
    from fedunlearn.config.choices import NUM_CLASSES

    classes = NUM_CLASSES[config.dataset]
    if config.judge_backdoor and config.judge_backdoor_class >= classes:
        raise ConfigError(
            "judge-backdoor-class",
            config.judge_backdoor_class,
            f"a class of {config.dataset} in [0, {classes - 1}]",
        )


# ------------------------------------------------------------------ poisoning
def check_attack(config: RunParameters) -> None:
    """A poisoning run names its malicious clients (``attack-clients``, not all of them) and what
    they do (``attack``), a backdoor's target being one of the dataset's classes; an attack without
    clients, or clients without an attack, is refused."""
    from fedunlearn.config.choices import NUM_CLASSES

    attackers = config.attack_targets
    if attackers and config.attack == "none":
        raise ConfigError(
            "attack",
            config.attack,
            "backdoor, label-flip or scaled-update when attack-clients is set",
        )
    if not attackers and config.attack != "none":
        raise ConfigError(
            "attack-clients",
            config.attack_clients,
            f"the malicious clients' partition ids when attack = {config.attack}, e.g. '3,7'",
        )
    if _size_known(config) and len(attackers) >= config.num_clients:
        raise ConfigError(
            "attack-clients",
            config.attack_clients,
            f"fewer than all {config.num_clients} clients: someone must train honestly",
        )
    classes = NUM_CLASSES[config.dataset]
    if config.attack == "backdoor" and config.attack_target_class >= classes:
        raise ConfigError(
            "attack-target-class",
            config.attack_target_class,
            f"a class of {config.dataset} in [0, {classes - 1}]",
        )


def check_attackers_removed(config: RunParameters) -> None:
    """Recovery from poisoning removes the attackers (their detection is given): a poisoning run's
    ``unlearn-clients`` names exactly the ``attack-clients``, or is empty (train only). A later
    ``unlearn-only`` request on the poisoned run may forget any client."""
    attackers = config.attack_targets
    if not attackers or config.unlearn_only:
        return
    targets = config.unlearn_targets
    if targets and targets != attackers:
        wanted = ",".join(str(k) for k in attackers)
        raise ConfigError(
            "unlearn-clients",
            config.unlearn_clients,
            f"{wanted!r}, the attack-clients (recovery from poisoning removes the attackers), "
            "or '' to train only",
        )


def check_attack_combinations(config: RunParameters) -> None:
    """An attack is not run in a judge run (its N federations plant their own backdoor), and
    scaled-update not under DP-FedAvg (clipping every update to dp-clipping-norm undoes the
    boost)."""
    if not config.attack_targets:
        return
    if config.judge_models:
        raise ConfigError(
            "attack-clients",
            config.attack_clients,
            "empty when judge-models > 0 (a judge run is not poisoned; judge-backdoor verifies "
            "removal instead)",
        )
    if config.attack == "scaled-update" and config.dp_noise_multiplier > 0:
        raise ConfigError(
            "attack",
            config.attack,
            "backdoor or label-flip when dp-noise-multiplier > 0 (DP-FedAvg clips every update to "
            "dp-clipping-norm, which undoes the boost)",
        )


Rule = Callable[[Any], None]
#: Every rule across keys, in the order they run: ``(group, rule)``; a rule with a group takes that
#: group's view, one without takes the whole configuration.
RULES: tuple[tuple[str | None, Rule], ...] = (
    (None, check_model_fits_dataset),
    (None, check_train_samples_cover_clients),
    (None, check_data_root),
    (None, check_dp_delta),
    (None, check_someone_remains),
    (None, check_retention_for_methods),
    (None, check_retain_mode),
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
