"""The head's parameters as a matrix and back (the exact Hessian of the clients' head sums is
cross-checked in tests/scrubbing/test_scrubbing.py)."""

from __future__ import annotations

import numpy as np
import torch

from fedunlearn.certified.curvature import head_matrix, with_head


def test_head_matrix_round_trips_through_a_state_dict():
    head = torch.nn.Linear(4, 3)
    state = {"head.weight": head.weight.detach(), "head.bias": head.bias.detach()}
    matrix = head_matrix(state)
    assert matrix.shape == (3, 5)
    new = with_head(state, matrix + 1.0)
    np.testing.assert_allclose(head_matrix(new), matrix + 1.0, rtol=1e-6)
    assert torch.equal(state["head.weight"], head.weight.detach())  # the original is untouched
