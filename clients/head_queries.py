"""The statistics a client computes for the server's certified head (``query.certified_head``).

The server (``server/certified/head.py``) holds the head, the perturbation b and the list of removed
samples; a client holds its samples and answers, at the head the server sends, one of:

* ``prepare``: compute and cache this client's features for the body the server sends;
* ``sums``: loss, gradient (and Hessian) sums over its samples still in D';
* ``gram``: ``X_k^T X_k`` over those samples;
* ``removed``: the gradient at w and the Hessian factor at w0 of the samples being removed;
* ``step``: the per-sample terms of the bounds for a removal step v.

Every message carries the client's removed sample ids, so a client keeps no state that matters:
features are cached per process (keyed by the body's digest) and rebuilt when the server resends the
body after a client answers ``needs-model``. The server validates every reply (shapes, finite
values, counts: ``server/certified/replies.py``); targets are the one-vs-rest {-1, +1} the
logistic bounds assume, and the pure functions refuse any other.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from clients.client_state import ClientSetup
from fedunlearn.certified.features import head_features
from fedunlearn.certified.head_data import is_integer_id
from fedunlearn.certified.losses import check_loss, one_vs_rest_targets
from fedunlearn.certified.statistics import (
    head_sums,
    pack_symmetric,
    removed_parts,
    step_sums,
    weighted_grams,
)
from fedunlearn.errors import ConfigError

OPS = ("prepare", "sums", "gram", "removed", "step")

# One process serves many partitions in a simulation (a Ray actor takes whichever client is next),
# so the cache holds every partition's features up to a memory cap, not a fixed count.
_FEATURES: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()
CACHE_BYTES = 2 * 1024**3


def answer_head_query(msg: Message, setup: ClientSetup) -> Message:
    """Reply to one ``query.certified_head`` message (see the module docstring)."""
    config = msg.content["config"]
    op = str(config["op"])
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
    key = (setup.partition_id, str(config["model-id"]))
    if key not in _FEATURES:
        if "model" not in msg.content:
            return _reply(msg, {}, count=0, needs_model=True)
        model = setup.new_model()
        model.load_state_dict(msg.content["model"].to_torch_state_dict())
        _FEATURES[key] = head_features(model, setup.data.x, device=setup.device)
        while len(_FEATURES) > 1 and sum(f.nbytes for f in _FEATURES.values()) > CACHE_BYTES:
            _FEATURES.popitem(last=False)
    features = _FEATURES[key]
    _FEATURES.move_to_end(key)
    loss = check_loss(str(config["loss"]))
    targets = one_vs_rest_targets(setup.data.y.numpy(), list(config["classes"]))
    present = np.ones(len(features), dtype=bool)
    present[_local_ids(config.get("removed", []), len(features), "removed")] = False
    arrays = {name: record.numpy() for name, record in msg.content.get("head", {}).items()}
    count = int(present.sum())
    if op == "prepare":
        return _reply(msg, {"dim": np.array([features.shape[1]])}, count=count)
    if op == "sums":
        sums = head_sums(
            loss,
            features,
            targets,
            arrays["weights"],
            hessian=bool(config["hessian"]),
            mask=present,
        )
        return _reply(msg, sums.to_arrays(), count=count)
    if op == "gram":
        gram = weighted_grams(features, present[:, None].astype(np.float64))[0]
        return _reply(msg, {"gram": pack_symmetric(gram)}, count=count)
    if op == "removed":
        ids = _local_ids(config["ids"], len(features), "ids")
        if not present[ids].all():
            raise ConfigError("ids", ids[~present[ids]].tolist(), "samples not removed before")
        parts = removed_parts(
            loss, features[ids], targets[ids], arrays["weights"], arrays.get("anchor")
        )
        return _reply(msg, parts.to_arrays(), count=count)
    terms = step_sums(
        loss,
        features,
        targets,
        arrays["weights"],
        arrays["anchor"],
        arrays["step"],
        hessian_vector=bool(config["hessian-vector"]),
        mask=present,
    )
    return _reply(msg, terms.to_arrays(), count=count)


def _local_ids(values, size: int, name: str) -> np.ndarray:
    """Distinct local sample indices, integers in [0, size); nothing is coerced."""
    values = list(values)
    if not all(is_integer_id(v) for v in values):
        raise ConfigError(name, values, "integer local sample indices")
    ids = np.asarray(values, dtype=np.int64)
    if np.any((ids < 0) | (ids >= size)):
        raise ConfigError(name, ids.tolist(), f"local sample indices in [0, {size})")
    if len(np.unique(ids)) != len(ids):
        raise ConfigError(name, ids.tolist(), "each local sample index at most once")
    return ids


def _reply(msg: Message, arrays: dict[str, np.ndarray], *, count: int, needs_model: bool = False):
    content = RecordDict(
        {
            "sums": ArrayRecord(
                {name: Array(np.ascontiguousarray(v)) for name, v in arrays.items()}
            ),
            "metrics": MetricRecord({"count": count, "needs-model": int(needs_model)}),
        }
    )
    return Message(content=content, reply_to=msg)
