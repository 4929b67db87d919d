"""What the server accepts from a client's reply to ``query.certified_head`` (Guo et al.'s sums).

In a deployment a SuperNode is another organisation's machine: its reply is data to check, never a
fact. A certified head's bound is computed from these sums, so a NaN, a wrong shape or a count that
does not match the samples the server believes the client holds would make a certificate say
nothing (or fail far from its cause). Every reply is checked before anything is added up:

* it comes from the node that was asked, once;
* its ``metrics`` hold ``count`` (an integer equal to what the server expects: the partition's
  samples still in D'; for ``prepare`` in [1, N_k], N_k declared at discovery) and ``needs-model``
  (0 or 1);
* its ``sums`` hold exactly the arrays of the op (:func:`expected_shapes`), with those shapes,
  integer ``count``/``dim`` and floating everything else, all finite; the arrays' own ``count``
  equals the samples summed (``removed``: the m_p ids sent to that partition);
* sums of squares and losses are not negative (``loss``, ``point``, ``xv_squared``, the diagonals
  of the packed Gram and Hessian matrices).

A bad reply raises :class:`BadReplyError` naming the node, its partition and the reason
(:func:`check_sources` refuses a reply from a node not asked, and fails the query on a missing one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedunlearn.reply_checks import RefusedReply, decoded_arrays

# The errors and the source check live in server.federation.queries, shared by every query; re-exported here
# for the certified head's callers.
from server.federation.queries import BadReplyError, QueryFailedError, check_sources  # noqa: F401

#: Arrays holding integers (a count, a width); every other array must be floating point.
INTEGER_ARRAYS = ("count", "dim")
#: Arrays that are sums of non-negative terms.
NON_NEGATIVE = ("loss", "point", "xv_squared")
#: Packed symmetric matrices (``pack_symmetric``) whose diagonal is a sum of squares.
PACKED = ("gram", "hessian")


def packed_size(dim: int) -> int:
    return dim * (dim + 1) // 2


def expected_shapes(
    op: str, *, heads: int, dim: int, hessian: bool = False, removed: int = 0, factor: bool = False
) -> dict[str, tuple[int, ...]]:
    """The arrays (name -> shape) a correct reply to ``op`` holds (``clients/head_queries.py``).

    ``hessian``: a ``sums`` query that asked for the Hessian; ``removed``: the ids sent to this
    partition in a ``removed`` query; ``factor``: whether it sent an anchor (then the factor has
    ``removed`` rows, else none).
    """
    packed = packed_size(dim)
    if op == "prepare":
        return {"dim": (1,)}
    if op == "sums":
        shapes = {"count": (1,), "loss": (heads,), "gradient": (heads, dim)}
        if hessian:
            shapes["hessian"] = (heads, packed)
        return shapes
    if op == "gram":
        return {"gram": (packed,)}
    if op == "removed":
        return {
            "count": (1,),
            "gradient": (heads, dim),
            "factor": (heads, removed if factor else 0, dim),
            "gram": (packed,),
        }
    if op == "step":
        return {"point": (heads,), "xv_squared": (heads,), "hessian_vector": (heads, dim)}
    raise ValueError(f"unknown certified-head op {op!r}")


@dataclass(frozen=True)
class Expectation:
    """What one partition's reply must hold: array shapes, the range of ``metrics["count"]``
    (inclusive) and the arrays' own ``count`` (None: no such array)."""

    shapes: Mapping[str, tuple[int, ...]]
    count: tuple[int, int]
    array_count: int | None = None


@dataclass(frozen=True)
class CheckedReply:
    """A reply that passed :func:`check_reply`: float64 arrays (integers for ``count``/``dim``)."""

    needs_model: bool
    count: int
    arrays: dict[str, np.ndarray]


def _metric_int(metrics, name: str, fail) -> int:
    if name not in metrics:
        fail(f"metrics lack {name!r}")
    value = metrics[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        fail(f"metrics {name!r} = {value!r} is not an integer")
    return int(value)


def check_reply(
    content, op: str, expect: Expectation, *, node: int, partition: int
) -> CheckedReply:
    """The validated content of one reply (module docstring), or :class:`BadReplyError`."""

    def fail(reason: str):
        raise BadReplyError(node, partition, op, reason)

    try:
        metrics, sums = content["metrics"], content["sums"]
    except (KeyError, TypeError):
        fail("the reply lacks its 'metrics' or 'sums' record")
    needs_model = _metric_int(metrics, "needs-model", fail)
    if needs_model not in (0, 1):
        fail(f"needs-model = {needs_model}, not 0 or 1")
    if needs_model:
        return CheckedReply(True, 0, {})
    count = _metric_int(metrics, "count", fail)
    low, high = expect.count
    if not low <= count <= high:
        wanted = str(low) if low == high else f"in [{low}, {high}]"
        fail(f"count = {count}, expected {wanted}")
    try:
        names = set(sums.keys())
    except AttributeError:
        fail("its 'sums' record is not an array record")
    if names != set(expect.shapes):
        fail(f"arrays {sorted(names)}, expected exactly {sorted(expect.shapes)}")
    arrays = {name: _checked_array(sums, name, expect.shapes[name], fail) for name in expect.shapes}
    if expect.array_count is not None and int(arrays["count"][0]) != expect.array_count:
        fail(f"its arrays sum {int(arrays['count'][0])} samples, expected {expect.array_count}")
    _check_signs(arrays, fail)
    return CheckedReply(False, count, arrays)


def _checked_array(sums, name: str, shape: tuple[int, ...], fail) -> np.ndarray:
    try:
        array = decoded_arrays({name: sums[name]})[name]
    except RefusedReply as refused:  # a malformed Array fails in many ways; all are this client's
        fail(refused.reason)
    if array.shape != shape:
        fail(f"array {name!r} has shape {array.shape}, expected {shape}")
    if name in INTEGER_ARRAYS:
        if not np.issubdtype(array.dtype, np.integer):
            fail(f"array {name!r} has dtype {array.dtype}, expected integers")
        if np.any(array < 0):
            fail(f"array {name!r} = {array.tolist()} is negative")
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.floating):
        fail(f"array {name!r} has dtype {array.dtype}, expected floating point")
    if not np.all(np.isfinite(array)):
        fail(f"array {name!r} holds NaN or infinite values")
    return array.astype(np.float64)


def _check_signs(arrays: dict[str, np.ndarray], fail) -> None:
    for name in NON_NEGATIVE:
        if name in arrays and np.any(arrays[name] < 0):
            fail(f"array {name!r} (a sum of non-negative terms) has negative entries")
    for name in PACKED:
        if name in arrays:
            packed = arrays[name]
            dim = int(round((np.sqrt(8 * packed.shape[-1] + 1) - 1) / 2))
            rows, cols = np.triu_indices(dim)
            if np.any(packed[..., rows == cols] < 0):
                fail(f"array {name!r} has a negative diagonal entry (a sum of squares)")
