"""The Flower message types the server sends and the clients answer, named once (Flower-free).

A message type is ``<category>`` or ``<category>.<action>``: Flower's ClientApp routes
``train.calibrate`` to the handler registered with ``@app.train("calibrate")`` and
``query.scrub_stats`` to ``@app.query("scrub_stats")`` (:func:`action`). The server sends these
names (``server/``, ``strategies/``), the clients register their handlers under them
(``clients/client_app.py``) and the method registry (:mod:`fedunlearn.registry`) lists, for each
method, the ones it sends.
"""

from __future__ import annotations

__all__ = [
    "CALIBRATE",
    "DESCRIBE",
    "EVALUATE",
    "HEAD_QUERY",
    "MESSAGE_TYPES",
    "PRUNE_QUERY",
    "SCRUB_QUERY",
    "TRAIN",
    "action",
]

#: Local training from the global model (FedAvg's rounds, retraining, the fine-tuning baselines).
TRAIN = "train"
#: FedEraser's calibration training (``strategies/federaser.py``).
CALIBRATE = "train.calibrate"
#: Loss and accuracy of the global model on a client's partition.
EVALUATE = "evaluate"
#: Who a client is (partition, expected federation size, sample count): the server's discovery.
DESCRIBE = "query.describe"
#: Sums over a client's head features for the certified head (``server/certified/head_data.py``).
HEAD_QUERY = "query.certified_head"
#: Sums over a client's D_r / D_f for the scrubbing methods (``server/scrubbing/phase.py``).
SCRUB_QUERY = "query.scrub_stats"
#: Per-class channel activations for class-discriminative pruning (``server/scrubbing/class_pruning.py``).
PRUNE_QUERY = "query.prune_stats"
#: Every message type above: what a registered method may list as the messages it sends.
MESSAGE_TYPES = (TRAIN, CALIBRATE, EVALUATE, DESCRIBE, HEAD_QUERY, SCRUB_QUERY, PRUNE_QUERY)


def action(message_type: str) -> str:
    """The action of ``message_type`` (``"calibrate"`` for ``"train.calibrate"``), the name its
    ClientApp handler is registered under; a bare category (``"train"``) has none."""
    _, dot, name = message_type.partition(".")
    if not dot or not name:
        raise ValueError(f"{message_type!r} is a bare category, without an action")
    return name
