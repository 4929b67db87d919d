"""fedunlearn.reply_checks.decoded_arrays: the one decoder of every reply screen refuses a buffer
that does not hold what its array declares, whatever is wrong with it, and passes an honest one."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from fedunlearn.reply_checks import RefusedReply, decoded_arrays


def _forged(honest: Array, **fields) -> Array:
    values = dict(dtype=honest.dtype, shape=tuple(honest.shape), stype=honest.stype)
    values["data"] = honest.data
    return Array(**{**values, **fields})


HONEST = Array(np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize(
    "forged",
    [
        _forged(HONEST, data=HONEST.data[:-8]),  # 8 bytes short
        _forged(HONEST, data=HONEST.data[:10]),  # cut inside the header
        _forged(HONEST, data=b""),
        _forged(HONEST, data=b"\x93NUMPY garbage" * 20),
        _forged(HONEST, shape=(4, 3)),  # declares another shape than its bytes hold
        _forged(HONEST, shape=(12,)),
        _forged(HONEST, stype="no-such-serialisation"),
    ],
)
def test_an_array_whose_bytes_are_not_what_it_declares_is_refused_by_name(forged):
    with pytest.raises(RefusedReply, match="array 'w'"):
        decoded_arrays({"ok": HONEST, "w": forged})


def test_an_honest_array_decodes_to_its_values():
    decoded = decoded_arrays({"w": HONEST})
    np.testing.assert_array_equal(decoded["w"], np.arange(12, dtype=np.float32).reshape(3, 4))
