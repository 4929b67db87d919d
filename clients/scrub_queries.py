"""The statistics a client computes for the server's scrubbing plug-in (``query.scrub_stats``).

The server (``server/scrubbing/phase.py``) holds the model and applies the scrub; a client holds its samples
and answers, at the model the server sends, with sums over its part of D_r (``retained``) or of D_f
(``forgotten``), D_f being the cohort named by ``forget`` (:class:`fedunlearn.data.forget_sets.ForgetSet`),
which every party resolves the same way from the run seed:

* ``head``: the softmax head's summed loss, gradient and exact Hessian blocks
  (:func:`fedunlearn.certified.curvature.head_sums`);
* ``fisher``: the summed diagonal Fisher of every parameter (eq. 8, labels sampled from the model),
  on at most ``max-samples`` samples per part, drawn with a seed derived from the run seed.

Replies carry ``<part>.count`` (samples the sums cover) so the server can average.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from clients.client_state import ClientSetup
from fedunlearn.certified.curvature import head_inputs, head_matrix, head_sums
from fedunlearn.data.forget_sets import ForgetSet
from fedunlearn.errors import ConfigError
from fedunlearn.scrubbing.scrubbers import diagonal_fisher
from fedunlearn.seeding import derive_seed

OPS = ("head", "fisher")
PARTS = ("retained", "forgotten")


def forget_mask(setup: ClientSetup, forget: str) -> np.ndarray:
    """This client's D_f mask for the cohort string ``forget``."""
    spec = ForgetSet.parse(forget, num_clients=setup.config.num_clients)
    return spec.mask(setup.data.y.numpy(), setup.partition_id, setup.config.seed)


def answer_scrub_query(msg: Message, setup: ClientSetup) -> Message:
    """Reply to one ``query.scrub_stats`` message (see the module docstring)."""
    config = msg.content["config"]
    op = str(config["op"])
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
    parts = [str(p) for p in config["parts"]]
    if not parts or any(p not in PARTS for p in parts):
        raise ConfigError("parts", parts, f"some of {', '.join(PARTS)}")
    forgotten = forget_mask(setup, str(config["forget"]))
    model = setup.new_model()
    model.load_state_dict(msg.content["model"].to_torch_state_dict())
    arrays: dict[str, np.ndarray] = {}
    metrics: dict[str, int] = {"partition-id": setup.partition_id}
    features = None
    for part in parts:
        index = np.flatnonzero(forgotten if part == "forgotten" else ~forgotten)
        if op == "head":
            if features is None:
                features = head_inputs(model, setup.data.x, device=setup.device)
            sums = head_sums(
                features[index],
                setup.data.y.numpy()[index],
                head_matrix(model.state_dict()),
                hessian=bool(config["hessian"]),
            )
            arrays.update({f"{part}.{name}": value for name, value in sums.items()})
        else:
            limit = int(config["max-samples"])
            if len(index) > limit:
                rng = np.random.default_rng(
                    derive_seed(setup.config.seed, "fisher", part, setup.partition_id)
                )
                index = np.sort(rng.choice(index, size=limit, replace=False))
            generator = torch.Generator().manual_seed(
                derive_seed(setup.config.seed, "fisher-labels", part, setup.partition_id)
            )
            if len(index):
                fisher = diagonal_fisher(
                    model.to(setup.device),
                    setup.data.x[torch.as_tensor(index)].to(setup.device),
                    generator=generator if setup.device.type == "cpu" else None,
                    batch_size=64,
                )
                for name, value in fisher.items():
                    arrays[f"{part}.{name}"] = value.double().cpu().numpy() * len(index)
        metrics[f"{part}.count"] = int(len(index))
    content = RecordDict(
        {
            "stats": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
            "metrics": MetricRecord(metrics),
        }
    )
    return Message(content=content, reply_to=msg)
