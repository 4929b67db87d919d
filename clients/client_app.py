"""Flower ClientApp: train (E_loc local epochs of SGD from the global model) and evaluate.

Each reply carries ``num-examples`` (FedAvg's weight N_k) and ``partition-id`` (the key under which the
server retains this client's updates; Flower's node ids are random). Training is seeded per run,
round and client, so a rerun with the same seed sends the same updates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from clients.client_state import ClientSetup, client_config, client_setup, node_partition
from clients.objectives import (
    auxiliary_head,
    client_step,
    member_states,
    objective_of,
    on_forgotten,
)
from clients.scrub_queries import answer_scrub_query, forget_mask
from fedunlearn.data.federated_data import settings_in
from fedunlearn.data.poisoning import scaled_update
from fedunlearn.errors import ConfigError
from fedunlearn.messages import CALIBRATE, DESCRIBE, HEAD_QUERY, PRUNE_QUERY, SCRUB_QUERY, action
from fedunlearn.registry import DEFAULT_OBJECTIVE
from fedunlearn.seeding import derive_seed
from fedunlearn.store.retention import AUXILIARY_KEY, AUXILIARY_REQUEST
from fedunlearn.training.local import evaluate as evaluate_model
from fedunlearn.training.stacked import (
    ModelStack,
    evaluate_stack,
    mean_evaluation,
    stack_size,
    train_stack_epochs,
)


def create_client_app(
    run_config_overrides: Mapping[str, Any] | None = None, mods: list[Mod] | None = None
) -> ClientApp:
    """A ClientApp; ``run_config_overrides`` replace run-config values (tests, embedded runs);
    ``mods`` are Flower mods wrapped around every handler (e.g. Flower's client-side DP mods)."""
    overrides = dict(run_config_overrides or {})
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        """Train the received global model on this client's partition for ``local-epochs`` epochs."""
        return _local_training(msg, client_setup(context, overrides, msg), "train")

    @app.train(action(CALIBRATE))
    def calibrate(msg: Message, context: Context) -> Message:
        """FedEraser's calibration training (``train.calibrate``): E_cali epochs from M̃^{t_j}.

        The server sends ``local-epochs`` = E_cali and ``server-round`` = t_j, the retained round
        being reconstructed; the batches are those of training round t_j, so that with r = 1 the
        calibration repeats what retraining would do.
        """
        return _local_training(msg, client_setup(context, overrides, msg), "calibrate")

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        """Loss and accuracy of the received global model on this client's partition."""
        return _evaluation(msg, client_setup(context, overrides, msg))

    @app.query(action(DESCRIBE))
    def describe(msg: Message, context: Context) -> Message:
        """Who this client is: its partition, the federation size it expects, and its sample count.

        The server asks this once before training, to map Flower's random node ids to partition ids and
        to catch a federation whose size does not match ``num-clients`` before anything is written.
        """
        return _description(msg, context, overrides)

    @app.query(action(HEAD_QUERY))
    def certified_head(msg: Message, context: Context) -> Message:
        """Sums over this client's head features for the server's certified head (Guo et al.)."""
        from clients.head_queries import answer_head_query  # the certified package: when asked

        return answer_head_query(msg, client_setup(context, overrides, msg))

    @app.query(action(SCRUB_QUERY))
    def scrub_stats(msg: Message, context: Context) -> Message:
        """Sums over this client's D_r / D_f for the server's scrubbing plug-in (Golatkar et al.)."""
        return answer_scrub_query(msg, client_setup(context, overrides, msg))

    @app.query(action(PRUNE_QUERY))
    def prune_stats(msg: Message, context: Context) -> Message:
        """Per-class channel activations for class-discriminative pruning (Wang et al.)."""
        from clients.prune_queries import answer_prune_query  # only a pruning run asks

        return answer_prune_query(msg, client_setup(context, overrides, msg))

    return app


def _local_training(msg: Message, setup: ClientSetup, action: str) -> Message:
    model = _received_model(msg, setup)
    config = msg.content["config"]
    server_round = int(config.get("server-round", 0))
    objective = objective_of(config)
    x, y = setup.data.x, setup.data.y
    if "forget" in config:
        forgotten = torch.as_tensor(forget_mask(setup, str(config["forget"])))
        keep = forgotten if on_forgotten(objective) else ~forgotten
        x, y = x[keep], y[keep]
    settings = dict(
        epochs=int(config.get("local-epochs", setup.config.local_epochs)),
        lr=float(config.get("lr", setup.config.lr)),
        batch_size=int(config.get("batch-size", setup.config.batch_size)),
        momentum=float(config.get("momentum", setup.config.momentum)),
        device=setup.device,
    )
    weight_decay = float(config.get("weight-decay", setup.config.weight_decay))
    reported = {}
    if int(config.get("report-start-loss", 0)):  # L^t for Crab's windows, before any step
        reported["start-loss"] = _model_loss(model, x, y, setup)
    attached = _attached(msg)
    if isinstance(model, ModelStack):
        loss = _train_stack(model, x, y, config, setup, objective, weight_decay, settings, attached)
    else:
        model_seed = int(config.get("model-seed", setup.config.training_seed))
        settings["seed"] = derive_seed(model_seed, "train", server_round, setup.partition_id)
        loss = client_step(objective)(model, x, y, config, setup, settings, attached)
    if int(config.get(AUXILIARY_REQUEST, 0)):  # FedAU's W_a, after training (its retention)
        reported[AUXILIARY_KEY] = auxiliary_head(model, x, y, config, setup, settings)
    metrics = MetricRecord(
        {
            "num-examples": len(x),
            "partition-id": setup.partition_id,
            "train-loss": loss,
            "calibration": int(action == "calibrate"),
            **reported,
        }
    )
    content = RecordDict(
        {"arrays": ArrayRecord(_reply_state(msg, model, setup)), "metrics": metrics}
    )
    return Message(content=content, reply_to=msg)


def _model_loss(model, x: torch.Tensor, y: torch.Tensor, setup: ClientSetup) -> float:
    """The mean loss of the received model on the data it is about to train on (a stack's: its
    members' mean)."""
    if isinstance(model, ModelStack):
        return mean_evaluation(evaluate_stack(model, x, y, device=setup.device)).loss
    return evaluate_model(model, x, y, device=setup.device).loss


def _reply_state(msg: Message, model, setup: ClientSetup) -> dict[str, torch.Tensor]:
    """The trained model M_k, or, from a scaled-update attacker (``attack-clients``), M + λ (M_k − M)
    (:func:`fedunlearn.data.poisoning.scaled_update`), in every training message it answers (a
    client removed from the run receives none)."""
    trained = model.cpu().state_dict()
    config = setup.config
    if config.attack != "scaled-update" or setup.partition_id not in config.attack_targets:
        return trained
    sent = msg.content["arrays"].to_torch_state_dict()
    return scaled_update(sent, trained, config.attack_scale)


def _attached(msg: Message) -> dict[str, dict[str, torch.Tensor]]:
    """The states a message carries beside its model (``arrays``), by name (PGA's anchor)."""
    records = msg.content.array_records
    return {name: records[name].to_torch_state_dict() for name in records if name != "arrays"}


def _train_stack(
    model, x, y, config, setup: ClientSetup, objective, weight_decay, settings, attached=None
):
    """A judge run's stack of N models, trained at once (:func:`train_stack_epochs`): member i
    sees the batches a single run with ``model-seed`` = ``stack-seeds[i]`` would see. Another
    objective (an unlearning method's client step) runs member by member, member i as a single
    run with that seed would."""
    if float(config.get("proximal-mu", 0.0)) > 0:
        raise ConfigError("proximal-mu", config["proximal-mu"], "0 for a stack of models")
    seeds = [int(s) for s in config.get("stack-seeds", [])]
    if len(seeds) != model.num_members:
        raise ConfigError("stack-seeds", seeds, f"{model.num_members} seeds, one per model")
    server_round = int(config.get("server-round", 0))
    batch_seeds = [derive_seed(s, "train", server_round, setup.partition_id) for s in seeds]
    if objective != DEFAULT_OBJECTIVE:
        step = client_step(objective)
        losses = [
            step(
                member, x, y, config, setup, {**settings, "seed": seed}, member_states(attached, i)
            )
            for i, (member, seed) in enumerate(zip(model.members, batch_seeds))
        ]
        return float(sum(losses) / len(losses))
    losses = train_stack_epochs(
        model, x, y, seeds=batch_seeds, weight_decay=weight_decay, **settings
    )
    return float(sum(losses) / len(losses))


def _evaluation(msg: Message, setup: ClientSetup) -> Message:
    model = _received_model(msg, setup)
    if isinstance(model, ModelStack):
        results = evaluate_stack(model, setup.data.x, setup.data.y, device=setup.device)
        result = mean_evaluation(results)
    else:
        result = evaluate_model(model, setup.data.x, setup.data.y, device=setup.device)
    metrics = MetricRecord(
        {
            "num-examples": result.num_examples,
            "partition-id": setup.partition_id,
            "eval-loss": result.loss,
            "eval-accuracy": result.accuracy,
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def _description(msg: Message, context: Context, overrides: Mapping[str, Any]) -> Message:
    """The ``describe`` reply: partition, federation size and sample count (a client whose
    federation size is not ``num-clients``, or is asked with ``num-clients`` = 0 for the size to
    adopt, reports it without loading its data)."""
    partition_id, num_partitions = node_partition(context)
    settings = dict(overrides)
    if "config" in msg.content.config_records:
        settings.update(settings_in(msg.content["config"]))
    expected = client_config(context, settings).num_clients
    if num_partitions != expected:
        # Report rather than raise: the server turns this into one clear error for the user, or,
        # asked with num-clients = 0, adopts num-partitions as the federation's size.
        metrics = MetricRecord(
            {
                "partition-id": partition_id,
                "num-partitions": num_partitions,
                "num-examples": 0,
                "cuda": 0,
            }
        )
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
    setup = client_setup(context, overrides, msg)
    metrics = MetricRecord(
        {
            "partition-id": setup.partition_id,
            "num-partitions": num_partitions,
            "num-examples": len(setup.data),
            "cuda": int(setup.device.type == "cuda"),
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def _received_model(msg: Message, setup: ClientSetup):
    """The model a message carries: one network, or a judge run's stack of N
    (``members.<i>.<tensor>`` keys)."""
    state = msg.content["arrays"].to_torch_state_dict()
    members = stack_size(state)
    model = setup.new_model() if members == 0 else setup.new_stack(members)
    model.load_state_dict(state)
    return model


app = create_client_app()
