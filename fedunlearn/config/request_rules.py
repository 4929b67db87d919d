"""The rules across keys that check an unlearning request and what is run beside it: whom to forget
and with which methods, the certified head (on its group's view), scrubbing, the audit, the judge
and poisoning (its attackers being whom recovery removes). They run in the order of
:data:`fedunlearn.config.rules.RULES`.
"""

from __future__ import annotations

from fedunlearn.config.constraints import Interval
from fedunlearn.config.group import ConfigGroup
from fedunlearn.config.parameters import RunParameters
from fedunlearn.config.training_rules import method_specs, size_known
from fedunlearn.errors import ConfigError


# ------------------------------------------------------------------ unlearning
def check_someone_remains(config: RunParameters) -> None:
    """The clients to forget are partition ids, and not all of them."""
    if size_known(config) and len(set(config.unlearn_targets)) >= config.num_clients:
        raise ConfigError(
            "unlearn-clients",
            config.unlearn_clients,
            f"fewer than all {config.num_clients} clients: someone must remain (forget fewer "
            "clients, raise num-clients, or unlearn-clients='' to train only)",
        )


def check_target_participation(config: RunParameters) -> None:
    """Methods whose leaving client works during the request run only when the config opts in."""
    participating = [spec.name for spec in method_specs(config) if spec.target_participates]
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
    if size_known(config) and len(config.certified_client_targets) >= config.num_clients:
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


# ------------------------------------------------------------------ stacked comparison
#: What ``stack-models`` must not ask for beyond the judge's refusals: the judge itself, and
#: DP-SGD (its per-sample clipping would clip the N members' gradients as one).
_STACK_REFUSES = (
    *(row for row in _JUDGE_REFUSES if row[0] != "mia"),
    ("mia", True, "false: the membership audit reads one network"),
)


def check_stack(config: RunParameters) -> None:
    """``stack-models`` = N >= 2 trains N federations as one stack (the judge's, without the
    judge): every method must stack (:attr:`fedunlearn.method_spec.MethodSpec.stacks`, member i
    then equals the single run with member i's ``model-seed``), and nothing that would read the N
    models as one is on."""
    if not config.stack_models:
        return
    if config.stack_models < 2:
        raise ConfigError("stack-models", config.stack_models, "0 (off) or at least 2")
    if config.judge_models:
        raise ConfigError(
            "stack-models", config.stack_models, "0 when judge-models > 0 (the judge stacks)"
        )
    unstacked = [spec for spec in method_specs(config) if not spec.stacks]
    if unstacked:
        names = {spec.name for spec in unstacked}
        stacking = ",".join(m for m in config.methods if m not in names) or "fedretrain"
        raise ConfigError(
            "unlearn-methods",
            config.unlearn_methods,
            f"methods that stack when stack-models > 0 ({unstacked[0].name}: "
            f"{unstacked[0].stacks_note}; run such methods one federation per run), "
            f"e.g. {stacking!r}",
        )
    if config.dp_noise_multiplier > 0:
        raise ConfigError(
            "dp-noise-multiplier", config.dp_noise_multiplier, "0 when stack-models > 0"
        )
    for key, refused, allowed in _STACK_REFUSES:
        if config.to_run_config()[key] == refused:
            raise ConfigError(key, refused, f"{allowed} (stack-models > 0)")


def check_backdoor_class(config: RunParameters) -> None:
    """The backdoor's target class is one of the dataset's classes."""
    from fedunlearn.config.choices import NUM_CLASSES

    classes = NUM_CLASSES.get(config.dataset)  # None: checked once the data is loaded (preflight)
    if classes and config.judge_backdoor and config.judge_backdoor_class >= classes:
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
    if size_known(config) and len(attackers) >= config.num_clients:
        raise ConfigError(
            "attack-clients",
            config.attack_clients,
            f"fewer than all {config.num_clients} clients: someone must train honestly",
        )
    classes = NUM_CLASSES.get(config.dataset)  # None: checked once the data is loaded (preflight)
    if classes and config.attack == "backdoor" and config.attack_target_class >= classes:
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
