"""The head's sums as clients send them add up to the exact central Hessian and gradient."""

from __future__ import annotations

import numpy as np
import torch

from fedunlearn.certified.curvature import assemble_hessian, head_matrix, head_sums, with_head
from fedunlearn.scrubbing.scrubbers import softmax_head_sums


def test_client_block_sums_add_up_to_the_exact_head_hessian():
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(60, 4)), np.ones((60, 1))])
    y = rng.integers(0, 3, size=60)
    w = rng.normal(size=(3, 5))
    loss, gradient, hessian = softmax_head_sums(x, y, w)
    parts = [head_sums(x[:25], y[:25], w), head_sums(x[25:], y[25:], w)]
    total = {k: sum(p[k].astype(np.float64) for p in parts) for k in parts[0]}
    assert np.isclose(total["loss"][0], loss, rtol=1e-12)
    np.testing.assert_allclose(total["gradient"].ravel(), gradient, rtol=1e-12)
    # blocks travel in float32: the assembled Hessian matches to single precision
    np.testing.assert_allclose(assemble_hessian(total["blocks"], 3, 5), hessian, atol=1e-5)
    assert head_sums(x[:0], y[:0], w)["blocks"].shape == parts[0]["blocks"].shape


def test_head_matrix_round_trips_through_a_state_dict():
    head = torch.nn.Linear(4, 3)
    state = {"head.weight": head.weight.detach(), "head.bias": head.bias.detach()}
    matrix = head_matrix(state)
    assert matrix.shape == (3, 5)
    new = with_head(state, matrix + 1.0)
    np.testing.assert_allclose(head_matrix(new), matrix + 1.0, rtol=1e-6)
    assert torch.equal(state["head.weight"], head.weight.detach())  # the original is untouched
