"""Checks of an untrusted client reply: the design's "Untrusted clients".

In a deployment a SuperNode is another organisation's machine, so a reply is data to validate, not
a fact. Before a reply is aggregated, retained or used, it must match what the server sent and what
the node declared when it was discovered:

* the same arrays: the same keys, shapes and dtypes as the model sent, every floating value finite
  (a NaN update would poison the average and every model built from the store);
* exactly the metrics the protocol names, each a finite number (no lists);
* ``num-examples`` an integer in ``[1, N_k]``, N_k the sample count the node declared (FedAvg weighs
  updates by it: a claimed 1e12 would take over the average);
* ``partition-id`` equal to the partition the node is bound to (the store is keyed by it: a spoofed
  id would file the update under another client).

These are pure functions on plain values (shapes, dtype names, NumPy arrays, numbers); the Flower
layer (``server/federation/reply_screening.py``) turns messages into them and decides what a refusal costs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable, Mapping

import numpy as np

from fedunlearn.errors import FedUnlearnError
from fedunlearn.store.retention import AUXILIARY_KEY

#: An array's description: (shape, dtype name as NumPy spells it).
ArraySpec = tuple[tuple[int, ...], str]

#: The metrics a ``train`` / ``train.calibrate`` reply carries (clients/client_app.py).
TRAIN_METRICS = frozenset({"num-examples", "partition-id", "train-loss", "calibration"})
#: Those it carries when the message asks (``report-start-loss``: Crab's time windows).
OPTIONAL_TRAIN_METRICS = frozenset({"start-loss"})
#: The metrics an ``evaluate`` reply carries.
EVALUATE_METRICS = frozenset({"num-examples", "partition-id", "eval-loss", "eval-accuracy"})
#: The metrics a ``query.describe`` reply carries (server/federation/members.py).
DESCRIBE_METRICS = frozenset({"partition-id", "num-partitions", "num-examples", "cuda"})


class RefusedReply(FedUnlearnError, ValueError):
    """A client reply failed a check; ``reason`` says which, in words a log line can carry."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class NonFiniteReply(RefusedReply):
    """A reply refused for a value that is not finite: what honest clients send when the model
    they were asked to train from diverges in their training."""


def check_array_specs(sent: Mapping[str, ArraySpec], received: Mapping[str, ArraySpec]) -> None:
    """The reply's arrays have exactly the sent keys, and each the sent shape and dtype."""
    _same_names("arrays", sent, received)
    for name, (shape, dtype) in sent.items():
        got_shape, got_dtype = received[name]
        if tuple(got_shape) != tuple(shape):
            raise RefusedReply(
                f"array {name!r} has shape {tuple(got_shape)}, the model sent has {tuple(shape)}"
            )
        if str(got_dtype) != str(dtype):
            raise RefusedReply(f"array {name!r} has dtype {got_dtype}, the model sent has {dtype}")


def decoded_arrays(arrays: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Each array of a reply as NumPy: the one decoder every reply screen uses. ``arrays`` maps a
    name to an object with ``.numpy()`` (and ``.shape``): Flower's ``Array``. A buffer that does
    not decode to the shape it declares (cut short, padded, garbage) is a :class:`RefusedReply`
    naming the array, never a crash of the phase that asked."""
    decoded = {}
    for name, array in arrays.items():
        try:
            value = np.asarray(array.numpy())  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - any decoding failure is the sender's
            raise RefusedReply(
                f"array {name!r} does not decode ({type(error).__name__}: {error})"
            ) from None
        declared = tuple(getattr(array, "shape", value.shape))
        if tuple(value.shape) != declared:
            raise RefusedReply(
                f"array {name!r} declares shape {declared} but decodes to {tuple(value.shape)}"
            )
        decoded[name] = value
    return decoded


def check_finite_arrays(arrays: Iterable[tuple[str, np.ndarray]]) -> None:
    """Every floating value of every array is finite."""
    for name, array in arrays:
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
            raise NonFiniteReply(f"array {name!r} holds {bad} non-finite value(s)")


def check_metrics(
    metrics: Mapping[str, object], expected: Collection[str], optional: Collection[str] = ()
) -> dict[str, float]:
    """Exactly the ``expected`` metric names (and any of ``optional``), each a finite int or float
    (not a bool or a list)."""
    _same_names("metrics", expected, {name for name in metrics if name not in optional})
    values: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RefusedReply(f"metric {name!r} = {value!r} is not a number")
        if not math.isfinite(float(value)):
            raise NonFiniteReply(f"metric {name!r} = {value!r} is not finite")
        values[name] = value
    return values


def check_count(name: str, value: object, low: int, high: int) -> int:
    """An integer (an ``int``, not a float or a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RefusedReply(f"{name} = {value!r} is not an integer")
    if not low <= int(value) <= high:
        raise RefusedReply(f"{name} = {value} is outside [{low}, {high}]")
    return int(value)


def check_partition(value: object, bound: int) -> int:
    """``partition-id`` equal to the partition the node was bound to at discovery."""
    partition = check_count("partition-id", value, 0, 2**62)
    if partition != bound:
        raise RefusedReply(f"partition-id = {partition}, but this node is client {bound}")
    return partition


def update_norm(received: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of a reply's update (received − sent, its floating arrays), in float64."""
    total = 0.0
    for name, array in received.items():
        if array.dtype.kind in "fc" and name in sent:
            difference = array.astype(np.float64) - np.asarray(sent[name], dtype=np.float64)
            total += float(np.square(difference).sum())
    return math.sqrt(total)


def norm_outliers(norms: Mapping[int, float], ratio: float) -> dict[int, str]:
    """The senders whose update is far outside the round's: a norm over ``ratio`` times the
    median of the others' (or not finite), with the reason. Finite values of 3e38 pass every
    per-value check yet take over the average; honest updates of one round differ by a few
    times. A majority of senders is the reference, so one needs at least one other sender."""
    outliers = {}
    for sender, norm in norms.items():
        if not math.isfinite(norm):
            outliers[sender] = "its update's norm overflows"
            continue
        others = [n for k, n in norms.items() if k != sender and math.isfinite(n)]
        if not others:
            continue
        median = float(np.median(others))
        if median > 0 and norm > ratio * median:
            outliers[sender] = (
                f"its update's norm {norm:.3g} is over max-update-ratio={ratio:g} times the "
                f"median of the round's other updates ({median:.3g})"
            )
    return outliers


def check_training_reply(
    sent: Mapping[str, ArraySpec],
    received: Mapping[str, ArraySpec],
    metrics: Mapping[str, object],
    *,
    partition: int,
    declared_examples: int,
    arrays: Iterable[tuple[str, np.ndarray]] = (),
) -> dict[str, float]:
    """Every check of a ``train`` or ``train.calibrate`` reply; returns its metrics.

    ``arrays`` yields the received arrays' values (checked for finiteness after the cheap checks of
    shapes and counts, so a malformed reply is refused before its arrays are decoded).
    """
    check_array_specs(sent, received)
    metrics = dict(metrics)
    if AUXILIARY_KEY in metrics:
        check_auxiliary_head(metrics.pop(AUXILIARY_KEY), sent)
    values = check_metrics(metrics, TRAIN_METRICS, OPTIONAL_TRAIN_METRICS)
    check_partition(values["partition-id"], partition)
    check_count("num-examples", values["num-examples"], 1, declared_examples)
    check_count("calibration", values["calibration"], 0, 1)
    if float(values.get("start-loss", 0.0)) < 0.0:
        raise RefusedReply(f"start-loss = {values['start-loss']} is negative")
    check_finite_arrays(arrays)
    return values


def check_auxiliary_head(value: object, sent: Mapping[str, ArraySpec]) -> None:
    """FedAU's auxiliary head (asked with ``report-auxiliary-head``): a list of finite floats, as
    many as the sent model's head(s) hold, weight and bias (a stack's members each)."""
    heads = [
        shape for name, (shape, _) in sent.items() if name.split(".")[-2:] == ["head", "weight"]
    ]
    size = sum(math.prod(shape) + shape[0] for shape in heads)
    if not isinstance(value, list) or len(value) != size:
        found = f"{len(value)} values" if isinstance(value, list) else repr(type(value).__name__)
        raise RefusedReply(f"{AUXILIARY_KEY} holds {found}, not the head's {size}")
    if not all(isinstance(v, float) and math.isfinite(v) for v in value):
        raise RefusedReply(f"{AUXILIARY_KEY} holds a value that is not a finite float")


def check_evaluate_reply(
    metrics: Mapping[str, object], *, partition: int, declared_examples: int
) -> dict[str, float]:
    """Every check of an ``evaluate`` reply (metrics only); returns its metrics."""
    values = check_metrics(metrics, EVALUATE_METRICS)
    check_partition(values["partition-id"], partition)
    check_count("num-examples", values["num-examples"], 1, declared_examples)
    if not 0.0 <= float(values["eval-accuracy"]) <= 1.0:
        raise RefusedReply(f"eval-accuracy = {values['eval-accuracy']} is outside [0, 1]")
    if float(values["eval-loss"]) < 0.0:
        raise RefusedReply(f"eval-loss = {values['eval-loss']} is negative")
    return values


def _same_names(what: str, expected: Collection[str], found: Collection[str]) -> None:
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or extra:
        parts = ([f"missing {_listed(missing)}"] if missing else []) + (
            [f"unexpected {_listed(extra)}"] if extra else []
        )
        raise RefusedReply(f"{what} " + " and ".join(parts))


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
