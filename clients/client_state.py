"""What a ClientApp needs before it can act: its config, partition, data and device.

Loading and partitioning a dataset costs far more than a training round on it, so the result is
cached per process (a Ray actor or a SuperNode serves many rounds).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import Context, Message

from fedunlearn.config import ADOPT_FEDERATION_SIZE, ExperimentConfig
from fedunlearn.config.choices import MAX_JUDGE_MODELS
from fedunlearn.data.datasets import TensorSplit
from fedunlearn.data.federated_data import load_federated_data, settings_in
from fedunlearn.errors import ConfigError
from fedunlearn.training.local import resolve_device
from fedunlearn.training.models import BodyHeadNet, build_dataset_model
from fedunlearn.training.stacked import ModelStack, build_model_stack


@dataclass(frozen=True)
class ClientSetup:
    config: ExperimentConfig
    partition_id: int
    data: TensorSplit
    input_shape: tuple[int, ...]
    num_classes: int
    device: torch.device

    def new_model(self) -> BodyHeadNet:
        return build_dataset_model(
            self.config.model, self.config.dataset, self.input_shape, self.num_classes
        )

    def new_stack(self, members: int) -> ModelStack:
        """A stack of ``members`` networks (a judge run's message carries N models at once)."""
        if not 1 <= members <= MAX_JUDGE_MODELS:
            raise ConfigError("arrays", f"{members} models", f"at most {MAX_JUDGE_MODELS}")
        return build_model_stack(
            self.config.model,
            self.config.dataset,
            self.input_shape,
            self.num_classes,
            list(range(members)),
        )


def client_config(context: Context, overrides: Mapping[str, Any] | None = None) -> ExperimentConfig:
    """The validated run config (Flower's, then ``overrides``), parsed once per process."""
    return _parse_config(tuple(sorted({**context.run_config, **(overrides or {})}.items())))


def client_setup(
    context: Context, overrides: Mapping[str, Any] | None = None, msg: Message | None = None
) -> ClientSetup:
    """The client's setup from Flower's context (run config, then ``overrides``, + node config).

    ``msg``'s config record may carry the trained run's data settings
    (:data:`fedunlearn.data.federated_data.DATA_KEYS`, sent by the server with every message): they
    replace the run config's, so that a short ``unlearn-only`` or ``resume`` request, whose run config
    lacks them, still builds the partitions and the model the run was trained with.
    A SuperNode started with ``--node-config "... data-root=/its/data"`` reads its partition from
    that folder instead (each machine keeps its data where it is). ``num-clients`` = 0 (not set)
    is this node's ``num-partitions``, the federation's size the server adopts too.
    """
    if msg is not None and "config" in msg.content.config_records:
        overrides = {**(overrides or {}), **settings_in(msg.content["config"])}
    if "data-root" in context.node_config:
        overrides = {**(overrides or {}), "data-root": str(context.node_config["data-root"])}
    partition_id, num_partitions = node_partition(context)
    config = client_config(context, overrides)
    if config.num_clients == ADOPT_FEDERATION_SIZE:
        # A message without the server's (adopted) K: partition as the server does, by this
        # federation's size. Through client_config, so the parsed config stays cached.
        config = client_config(context, {**(overrides or {}), "num-clients": num_partitions})
    config = config.with_federation_size(num_partitions)  # refuses another K
    data = load_federated_data(config)
    return ClientSetup(
        config=config,
        partition_id=partition_id,
        data=data.client_split(partition_id),
        input_shape=tuple(data.splits.input_shape),
        num_classes=data.splits.num_classes,
        device=resolve_device(config.device),
    )


def node_partition(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config, or a clear error when they are missing."""
    node = context.node_config
    if "partition-id" not in node or "num-partitions" not in node:
        raise ConfigError(
            "node-config",
            dict(node),
            "partition-id and num-partitions (set by the simulation, or by "
            "`flower-supernode --node-config 'partition-id=0 num-partitions=K'`)",
        )
    return int(node["partition-id"]), int(node["num-partitions"])


@functools.lru_cache(maxsize=8)
def _parse_config(items: tuple) -> ExperimentConfig:
    return ExperimentConfig.from_run_config(dict(items))
