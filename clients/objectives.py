"""What a client's training message may ask it to run (``objective`` in the message's config), one
function each, called as ``objective(model, x, y, config, setup, settings, attached)`` on a single
network with the message's SGD ``settings`` (``epochs``, ``lr``, ``batch_size``, ``momentum``,
``seed``, ``device``) and the states the message carries beside the model (``attached``, by name:
PGA's anchor); each trains ``model`` in place and returns its loss.

* ``train`` (:data:`fedunlearn.registry.DEFAULT_OBJECTIVE`): ordinary SGD (FedProx's proximal
  term when the message carries ``proximal-mu``);
* Golatkar et al.'s forgetting baselines on D_f (:func:`negative_gradient_step`,
  :func:`random_labels_step`);
* the unlearning methods' client steps, each reading its settings from the config: PGA's projected
  ascent, FedQUIT's distillation, FedOSD's gradients, rapid retraining's Fisher steps (their math
  beside their cores in :mod:`fedunlearn.unlearning`).

Every objective but ``train`` is named on the registry entry of the method that asks for it
(:attr:`fedunlearn.method_spec.MethodSpec.objectives`, ``"clients.objectives:pga_step"``): the
message's ``objective`` is checked against the registered ones (:func:`objective_of`), one
registered at run time included, and the server reads the same name from the entry.

A value the method's server side sends is still checked here: the core functions refuse a bad
one with a :class:`~fedunlearn.errors.ConfigError` that names it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.registry import DEFAULT_OBJECTIVE, client_objectives
from fedunlearn.scrubbing.baselines import negative_gradient_epochs, random_label_epochs
from fedunlearn.seeding import derive_seed
from fedunlearn.store.retention import AUXILIARY_REQUEST
from fedunlearn.training.local import evaluate, train_epochs
from fedunlearn.training.models import build_dataset_model
from fedunlearn.training.stacked import ModelStack
from fedunlearn.unlearning.fedau import auxiliary_targets, train_auxiliary_head
from fedunlearn.unlearning.fedosd import client_gradient
from fedunlearn.unlearning.fedquit import fedquit_epochs
from fedunlearn.unlearning.pga import (
    PGA_DEFAULTS,
    STOP_RULES,
    ball_radius,
    parameter_distance,
    projected_gradient_ascent,
    stop_distance,
    validation_threshold,
)
from fedunlearn.unlearning.rapid_retraining import rapid_retraining_epochs


def _train(model, x, y, config, setup, settings, attached=None) -> float:
    weight_decay = float(config.get("weight-decay", setup.config.weight_decay))
    mu = float(config.get("proximal-mu", 0.0))  # FedProx's (strategy = fedprox)
    return train_epochs(model, x, y, weight_decay=weight_decay, proximal_mu=mu, **settings)


def negative_gradient_step(model, x, y, config, setup, settings, attached=None) -> float:
    return negative_gradient_epochs(model, x, y, num_classes=setup.num_classes, **settings)


def random_labels_step(model, x, y, config, setup, settings, attached=None) -> float:
    return random_label_epochs(model, x, y, num_classes=setup.num_classes, **settings)


def rapid_retraining_step(model, x, y, config, setup, settings, attached=None) -> float:
    """Liu et al. 2022's client step: local epochs with the diagonal-Fisher quasi-Newton optimiser."""
    settings = {k: v for k, v in settings.items() if k not in ("lr", "momentum")}
    return rapid_retraining_epochs(
        model,
        x,
        y,
        lr=float(config["rapid-lr"]),
        damping=float(config["rapid-damping"]),
        **settings,
    )


def fedquit_step(model, x, y, config, setup, settings, attached=None) -> float:
    """Mora et al. 2024's step on the leaving client: distillation from the virtual teacher (the
    received model with each sample's true-class logit set to its minimum), Adam."""
    settings = {k: v for k, v in settings.items() if k not in ("lr", "momentum")}
    return fedquit_epochs(model, x, y, lr=float(config["fedquit-lr"]), **settings)


def pga_step(model, x, y, config, setup, settings, attached=None) -> float:
    """Halimi et al. 2022's step on the leaving client: projected gradient ascent on its data
    within the L2 ball of radius delta (the authors' rule, from seeded random models) around the
    reference model it received (w_ref, the mean of the other clients' models), stopping by the
    rule ``pga-stop`` names (:func:`_stop`): the paper's, at the first step whose accuracy on the
    server's validation samples (attached as ``validation``) is below w_ref's minus
    ``pga-stop-margin`` points; the authors' code's, once its squared distance to its own last
    model (the ``anchor`` attached) exceeds ``pga-stop-distance``; or ours, ``pga-stop-ratio``
    times where it started."""
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    seed = int(config.get("model-seed", setup.config.training_seed))

    def random_model(s: int):
        return build_dataset_model(
            setup.config.model, setup.config.dataset, setup.input_shape, setup.num_classes, seed=s
        )

    radius = ball_radius(reference, random_model, seed=derive_seed(seed, "pga-ball"))
    settings = {k: v for k, v in settings.items() if k not in ("lr", "momentum", "epochs")}
    keys = [k for k, _ in model.named_parameters()]
    result = projected_gradient_ascent(
        model,
        x,
        y,
        reference=reference,
        radius=radius,
        epochs=int(config["local-epochs"]),
        lr=float(config["pga-lr"]),
        momentum=PGA_DEFAULTS["momentum"],
        clip_norm=PGA_DEFAULTS["clip_norm"],
        **_stop(attached, config, model, reference, keys, settings["device"]),
        **settings,
    )
    return float(result["last_loss"])


def _stop(attached, config, model, reference, keys, device) -> dict:
    """The arguments of the ascent's stop rule ``pga-stop``: ``validation``, the attached
    validation samples and tau = w_ref's accuracy on them minus ``pga-stop-margin`` points (the
    model still is w_ref here); ``distance`` / ``ratio``, :func:`_anchor`'s."""
    rule = str(config.get("pga-stop", "distance"))
    if rule not in STOP_RULES:
        raise ConfigError("pga-stop", rule, f"one of {', '.join(STOP_RULES)}")
    if rule != "validation":
        return _anchor(attached, config, reference, keys)
    sent = (attached or {}).get("validation")
    if not sent or "x" not in sent or "y" not in sent:
        raise ConfigError(
            "validation", None, "the server's validation samples with pga-stop = validation"
        )
    validation = (sent["x"], sent["y"].long())
    reference_accuracy = evaluate(model, *validation, device=device).accuracy
    tau = validation_threshold(reference_accuracy, float(config["pga-stop-margin"]))
    return {"validation": validation, "stop_accuracy": tau}


def _sent_gradient(model, x, y, loss: str, device) -> float:
    """FedOSD's client: the exact gradient g of the mean ``loss`` (``uce``: the leaving client's
    Unlearning Cross-Entropy; ``ce``) over its data at the received model, sent as M - g; returns
    |g|."""
    gradient = client_gradient(model, x, y, loss=loss, device=device)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            parameter -= gradient[key].to(parameter.device, parameter.dtype)
    return float(sum(g.pow(2).sum() for g in gradient.values()) ** 0.5)


def fedosd_unlearning_step(model, x, y, config, setup, settings, attached=None) -> float:
    """FedOSD's step on a leaving client: the gradient of its UCE loss (:func:`_sent_gradient`)."""
    return _sent_gradient(model, x, y, "uce", settings["device"])


def fedosd_gradient_step(model, x, y, config, setup, settings, attached=None) -> float:
    """FedOSD's step on a remaining client: the gradient of its CE loss (:func:`_sent_gradient`)."""
    return _sent_gradient(model, x, y, "ce", settings["device"])


def _anchor(attached, config, reference, keys) -> dict:
    """PGA's distance stop: the attached anchor (the client's last model) and its threshold,
    ``pga-stop-ratio`` times the reference's squared distance to it over the parameters ``keys``
    (``pga-stop = ratio``, ours), else ``pga-stop-distance`` (the authors' code)
    (:func:`fedunlearn.unlearning.pga.stop_distance`); nothing without an anchor."""
    anchor = (attached or {}).get("anchor")
    ratio = float(config.get("pga-stop-ratio", 0.0)) if config.get("pga-stop") == "ratio" else 0.0
    absolute = float(config.get("pga-stop-distance", 0.0))
    if anchor is None or (absolute <= 0 and ratio <= 0):
        return {}
    start = parameter_distance(reference, anchor, keys) ** 2
    return {"anchor": anchor, "stop_distance": stop_distance(start, absolute, ratio)}


def member_states(attached, member: int) -> dict:
    """Member ``member``'s part of each attached state of a judge stack (``members.<i>.`` keys,
    the prefix dropped); a state without such keys (PGA's validation samples) is every member's."""
    prefix = f"members.{member}."
    return {
        name: {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if any(k.startswith("members.") for k in state)
        else dict(state)
        for name, state in (attached or {}).items()
    }


def objective_of(config) -> str:
    """The message's ``objective`` (default ``train``): ``train`` or one that a registered method
    declares (:func:`fedunlearn.registry.client_objectives`)."""
    objective = str(config.get("objective", DEFAULT_OBJECTIVE))
    allowed = (DEFAULT_OBJECTIVE, *client_objectives())
    if objective not in allowed:
        raise ConfigError("objective", objective, f"one of {', '.join(allowed)}")
    return objective


def client_step(objective: str) -> Callable[..., float]:
    """The function that runs ``objective`` (checked by :func:`objective_of`)."""
    if objective == DEFAULT_OBJECTIVE:
        return _train
    return client_objectives()[objective].client_step(objective)


def on_forgotten(objective: str) -> bool:
    """Whether ``objective`` trains on the forgotten cohort D_f when the message names one (its
    method's clients hold the forgotten data: the Golatkar baselines); else on the rest."""
    spec = client_objectives().get(objective)
    return spec is not None and spec.on_forgotten()


def auxiliary_head(model, x, y, config, setup, settings) -> list[float]:
    """FedAU's auxiliary head W_a (Gu et al. 2024), trained after the client's training on its
    frozen features with every label replaced by another class (client level), for the epochs the
    request names, with the run's SGD settings (lr, momentum, weight decay: the authors train W_a
    with the same optimiser as the model); flat (weight, then bias; a stack's members in order) for
    the reply's metrics. The random labels are drawn once per client (seeded by the run and the
    partition), as the authors' are drawn once when the data set is built."""
    members = model.members if isinstance(model, ModelStack) else [model]
    seed = int(config.get("model-seed", setup.config.training_seed))
    server_round = int(config.get("server-round", 0))
    labels = torch.Generator().manual_seed(derive_seed(seed, "fedau-labels", setup.partition_id))
    y_aux = auxiliary_targets(y, setup.num_classes, generator=labels)
    flat = []
    for member in members:
        head = train_auxiliary_head(
            member,
            x,
            y_aux,
            epochs=int(config[AUXILIARY_REQUEST]),
            lr=settings["lr"],
            momentum=settings["momentum"],
            weight_decay=float(config.get("weight-decay", setup.config.weight_decay)),
            batch_size=settings["batch_size"],
            seed=derive_seed(seed, "fedau", server_round, setup.partition_id),
            gamma=0.0,
            device=settings["device"],
        )
        flat += head["weight"].flatten().tolist() + head["bias"].flatten().tolist()
    return flat
