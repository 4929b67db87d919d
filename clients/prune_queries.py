"""What a client computes for the server's class-discriminative pruning (``query.prune_stats``).

Wang et al., *Federated Unlearning via Class-Discriminative Pruning* (WWW 2022), local processing:
at the global model the server sends (``arrays``), the client passes its samples through the
network and answers, for the layer the server names (``layer``), each class's sum of every
channel's pooled activation AvgPool(ReLU(O_l)) (eqs. 2-3) and how many samples each class has
(:func:`fedunlearn.scrubbing.pruning.class_channel_sums`). Sums, not means: the server adds the
clients' sums, so its A* is the mean over every sample of a class. All of the client's samples
count, the forgotten class's included (its row is what TF-IDF scores).

Reply: ``stats`` (an ArrayRecord: ``sums``, float64 ``(num-classes, channels)``; ``counts``, int64
``(num-classes,)``) and ``metrics`` (``partition-id``).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from torch import nn

from clients.client_state import ClientSetup
from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.pruning import class_channel_sums
from fedunlearn.training.stacked import stack_size


def answer_prune_query(msg: Message, setup: ClientSetup) -> Message:
    """Reply to one :data:`~fedunlearn.messages.PRUNE_QUERY` message (see the module docstring)."""
    config = msg.content["config"]
    state = msg.content["arrays"].to_torch_state_dict()
    if stack_size(state):
        raise ConfigError("arrays", f"a stack of {stack_size(state)} models", "one network")
    num_classes = int(config["num-classes"])
    if num_classes != setup.num_classes:
        raise ConfigError("num-classes", num_classes, f"this run's {setup.num_classes} classes")
    model = setup.new_model()
    model.load_state_dict(state)
    layer = str(config["layer"])
    modules = dict(model.named_modules())
    if not isinstance(modules.get(layer), nn.Conv2d | nn.Linear):
        raise ConfigError("layer", layer, "the module path of a Conv2d or Linear layer")
    sums, counts = class_channel_sums(
        model, setup.data.x, setup.data.y, num_classes, layer=layer, device=setup.device
    )
    stats = ArrayRecord(
        {
            "sums": Array(np.ascontiguousarray(sums.numpy())),
            "counts": Array(np.ascontiguousarray(counts.numpy())),
        }
    )
    metrics = MetricRecord({"partition-id": setup.partition_id})
    return Message(content=RecordDict({"stats": stats, "metrics": metrics}), reply_to=msg)
