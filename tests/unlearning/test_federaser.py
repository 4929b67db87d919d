"""FedEraser's math (Liu et al. 2021, eqs. 2, 3, 5 and Algorithm 1), centrally, without Flower."""

from __future__ import annotations

import math

import pytest
import torch

from fedunlearn.data.datasets import load_dataset
from fedunlearn.data.partitioning import partition_indices
from fedunlearn.errors import ConfigError
from fedunlearn.seeding import derive_seed
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.local import train_epochs
from fedunlearn.training.model_state import state_difference, state_sum, weighted_average
from fedunlearn.training.models import build_model
from fedunlearn.unlearning.calibration_top_up import TopUp, borrowed_squares, top_up_clients
from fedunlearn.unlearning.federaser import (
    aggregate_updates,
    calibrate_update,
    calibration_epochs,
    fedaccum,
    federaser,
)

T = torch.tensor


def test_calibration_keeps_the_retained_norm_and_the_new_direction_per_layer():
    retained = {"a": T([3.0, 4.0]), "b": T([0.0, 0.0, 1.0])}
    calibration = {"a": T([0.0, 2.0]), "b": T([2.0, 0.0, 0.0])}
    out = calibrate_update(retained, calibration)
    assert torch.allclose(out["a"], T([0.0, 5.0]))
    assert torch.allclose(out["b"], T([1.0, 0.0, 0.0]))


def test_whole_vector_calibration_uses_one_norm():
    retained = {"a": T([3.0, 4.0]), "b": T([0.0, 0.0, 0.0])}  # ‖U‖ = 5
    calibration = {"a": T([0.0, 3.0]), "b": T([4.0, 0.0, 0.0])}  # ‖Û‖ = 5
    out = calibrate_update(retained, calibration, layerwise=False)
    assert torch.allclose(out["a"], T([0.0, 3.0])) and torch.allclose(out["b"], T([4.0, 0.0, 0.0]))


@pytest.mark.parametrize("layerwise", [True, False])
def test_zero_norm_updates_give_a_zero_step_never_nan(layerwise):
    zero = {"a": T([0.0, 0.0])}
    some = {"a": T([1.0, -1.0])}
    for retained, calibration in ((some, zero), (zero, some), (zero, zero)):
        out = calibrate_update(retained, calibration, layerwise=layerwise)
        assert torch.isfinite(out["a"]).all()
        assert torch.equal(out["a"], T([0.0, 0.0]))


def test_buffers_are_taken_from_the_calibration_unscaled():
    retained = {"w": T([10.0]), "bn.running_mean": T([100.0]), "bn.num_batches_tracked": T(7)}
    calibration = {"w": T([0.5]), "bn.running_mean": T([0.25]), "bn.num_batches_tracked": T(3)}
    out = calibrate_update(retained, calibration, scaled_keys={"w"})
    assert torch.allclose(out["w"], T([10.0]))
    assert torch.equal(out["bn.running_mean"], T([0.25]))
    assert torch.equal(out["bn.num_batches_tracked"], T(3))


def test_aggregation_weights_are_n_k_over_sum_n():
    out = aggregate_updates({0: {"a": T([1.0])}, 5: {"a": T([4.0])}}, {0: 1, 5: 2, 9: 100})
    assert torch.allclose(out["a"], T([3.0]))


@pytest.mark.parametrize(
    ("ratio", "epochs", "expected"),
    [(0.5, 2, 1), (0.5, 10, 5), (0.1, 2, 1), (1.0, 3, 3), (0.25, 10, 3)],
)
def test_calibration_epochs_is_ceil_r_times_e_loc(ratio, epochs, expected):
    assert calibration_epochs(epochs, ratio) == expected


@pytest.mark.parametrize("ratio", [0.0, -0.5, 1.5])
def test_calibration_ratio_outside_0_1_is_refused(ratio):
    with pytest.raises(ConfigError, match="calibration-ratio"):
        calibration_epochs(2, ratio)


def _handmade_store(tmp_path, rounds=(1, 3, 5), clients=(0, 1, 2)):
    store = UpdateStore(tmp_path / "store")
    g = torch.Generator().manual_seed(0)
    for t in rounds:
        updates = {k: ({"w": torch.randn(4, generator=g)}, 10 + k) for k in clients}
        store.write_round(t, {"w": torch.full((4,), float(t))}, updates)
    return store


def test_fedaccum_is_initial_model_plus_every_remaining_aggregate(tmp_path):
    store = _handmade_store(tmp_path)
    result = fedaccum(store, targets=[1])
    expected = store.read_global(1)["w"].clone()
    for t in (1, 3, 5):
        u = {k: store.read_update(t, k) for k in (0, 2)}
        expected += (10 * u[0]["w"] + 12 * u[2]["w"]) / 22
    assert torch.allclose(result.model["w"], expected, atol=1e-6)
    assert [s.clients for s in result.steps] == [[0, 2]] * 3


def test_targets_are_never_asked_to_calibrate_and_first_step_is_uncalibrated(tmp_path):
    store = _handmade_store(tmp_path)
    calls = []

    def calibrate(t, model, clients):
        calls.append((t, list(clients)))
        return {k: {"w": torch.ones(4)} for k in clients}

    result = federaser(store, targets=[1], calibrate=calibrate)
    assert calls == [(3, [0, 2]), (5, [0, 2])]
    assert [s.calibrated for s in result.steps] == [False, True, True]


def test_a_calibration_answer_from_a_target_is_refused(tmp_path):
    store = _handmade_store(tmp_path)
    with pytest.raises(RuntimeError, match="target clients \\[1\\]"):
        federaser(store, targets=[1], calibrate=lambda t, m, c: {1: {"w": torch.ones(4)}})


def test_every_step_has_the_retained_norm_of_each_client_when_directions_agree(tmp_path):
    store = _handmade_store(tmp_path, rounds=(1, 2), clients=(0, 1))
    direction = torch.tensor([1.0, 0.0, 0.0, 0.0])
    result = federaser(store, [], calibrate=lambda t, m, c: {k: {"w": direction} for k in c})
    u = {k: store.read_update(2, k)["w"] for k in (0, 1)}
    norms = {k: float(u[k].norm()) for k in u}
    expected_step = (10 * norms[0] + 11 * norms[1]) / 21 * direction
    first = (
        store.read_global(1)["w"]
        + (10 * store.read_update(1, 0)["w"] + 11 * store.read_update(1, 1)["w"]) / 21
    )
    assert torch.allclose(result.model["w"], first + expected_step, atol=1e-5)


# ----------------------------------------------------------------- the paper's claim, centrally
def _central_fedavg(model0, data, parts, clients, rounds, epochs, seed, store=None):
    """FedAvg on tensors; client k in round t trains with derive_seed(seed, 'train', t, k)."""
    model = build_model("digits-cnn", data.input_shape, data.num_classes)
    model.load_state_dict(model0)
    history = {}
    for t in range(1, rounds + 1):
        start = {k: v.clone() for k, v in model.state_dict().items()}
        updates, sizes = {}, {}
        for k in clients:
            local = build_model("digits-cnn", data.input_shape, data.num_classes)
            local.load_state_dict(start)
            x, y = data.train.x[parts[k]], data.train.y[parts[k]]
            train_epochs(
                local,
                x,
                y,
                epochs=epochs,
                lr=0.05,
                batch_size=32,
                seed=derive_seed(seed, "train", t, k),
            )
            updates[k], sizes[k] = state_difference(local.state_dict(), start), len(parts[k])
        if store is not None:
            store.write_round(t, start, {k: (updates[k], sizes[k]) for k in clients})
        history[t] = updates
        model.load_state_dict(state_sum(start, aggregate_updates(updates, sizes)))
    return model.state_dict(), history


def test_with_r_1_and_delta_t_1_federaser_first_steps_reproduce_fedretrain(tmp_path):
    data = load_dataset("digits", seed=0)
    parts = [torch.as_tensor(p) for p in partition_indices(data.train.y, 4, "iid", seed=0)]
    model0 = build_model("digits-cnn", data.input_shape, data.num_classes, seed=1).state_dict()
    store = UpdateStore(tmp_path / "store")
    _central_fedavg(model0, data, parts, [0, 1, 2, 3], 2, 1, seed=5, store=store)
    retrain_1, _ = _central_fedavg(model0, data, parts, [1, 2, 3], 1, 1, seed=5)
    _, retrain_history = _central_fedavg(model0, data, parts, [1, 2, 3], 2, 1, seed=5)

    captured = {}

    def calibrate(t, model_state, clients):  # r = 1: E_cali = E_loc, the same seeds as training
        answers = {}
        for k in clients:
            local = build_model("digits-cnn", data.input_shape, data.num_classes)
            local.load_state_dict(model_state)
            x, y = data.train.x[parts[k]], data.train.y[parts[k]]
            train_epochs(
                local,
                x,
                y,
                epochs=calibration_epochs(1, 1.0),
                lr=0.05,
                batch_size=32,
                seed=derive_seed(5, "train", t, k),
            )
            answers[k] = state_difference(local.state_dict(), model_state)
        captured[t] = answers
        return answers

    # Step 1 (uncalibrated): M^1 + aggregate of the remaining retained updates = FedRetrain's round 1.
    only_first = UpdateStore(tmp_path / "first")
    only_first.write_round(
        1,
        store.read_global(1),
        {k: (store.read_update(1, k), store.num_examples(1)[k]) for k in (0, 1, 2, 3)},
    )
    step_one = federaser(only_first, [0], calibrate)
    assert all(torch.allclose(step_one.model[k], retrain_1[k], atol=1e-6) for k in retrain_1)

    # Step 2: the calibration updates are FedRetrain's round-2 client updates (same start, same seeds);
    # the calibrated step keeps their direction with the retained norms.
    result = federaser(store, [0], calibrate)
    assert [s.clients for s in result.steps] == [[1, 2, 3], [1, 2, 3]]
    for k in (1, 2, 3):
        for key, value in captured[2][k].items():
            assert torch.allclose(value, retrain_history[2][k][key], atol=1e-6)
    final_step = state_difference(result.model, step_one.model)
    direction = weighted_average(
        [calibrate_update(store.read_update(2, k), captured[2][k]) for k in (1, 2, 3)],
        [store.num_examples(2)[k] for k in (1, 2, 3)],
    )
    for key in final_step:
        assert torch.allclose(final_step[key], direction[key], atol=1e-5)
    assert not math.isnan(result.steps[-1].update_norm)


def test_average_order_calibrates_the_aggregates_as_the_papers_code_does(tmp_path):
    store = _handmade_store(tmp_path, rounds=(1, 2), clients=(0, 1))
    answers = {
        0: {"w": torch.tensor([1.0, 0.0, 0.0, 0.0])},
        1: {"w": torch.tensor([0.0, 3.0, 0.0, 0.0])},
    }
    result = federaser(store, [], lambda t, m, c: answers, calibration_order="average")
    weights = {0: 10, 1: 11}
    old = (10 * store.read_update(2, 0)["w"] + 11 * store.read_update(2, 1)["w"]) / 21
    new = (10 * answers[0]["w"] + 11 * answers[1]["w"]) / 21
    first = (
        store.read_global(1)["w"]
        + (10 * store.read_update(1, 0)["w"] + 11 * store.read_update(1, 1)["w"]) / 21
    )
    expected = first + old.norm() * new / new.norm()
    assert torch.allclose(result.model["w"], expected, atol=1e-5)
    assert sum(weights.values()) == 21
    with pytest.raises(ConfigError, match="calibration-order"):
        federaser(store, [], lambda t, m, c: answers, calibration_order="sometimes")


def test_several_targets_at_once_are_all_left_out(tmp_path):
    store = _handmade_store(tmp_path, clients=(0, 1, 2, 3))
    asked = []

    def calibrate(t, model, clients):
        asked.extend(clients)
        return {k: {"w": torch.ones(4)} for k in clients}

    result = federaser(store, targets=[0, 2], calibrate=calibrate)
    assert set(asked) == {1, 3}
    assert [s.clients for s in result.steps] == [[1, 3]] * 3
    assert [s.clients for s in fedaccum(store, targets=[0, 2]).steps] == [[1, 3]] * 3


@pytest.mark.parametrize("order", ["client", "average"])
def test_the_trajectory_is_the_reconstruction_and_keeps_each_clients_step_size(tmp_path, order):
    """The adopted history: its global models are the reconstruction's M~, its updates add up to
    the steps taken, and each records the norm of the update it replaces (eq. 2's step size)."""
    store = _handmade_store(tmp_path)
    trajectory = UpdateStore(tmp_path / "trajectory")
    g = torch.Generator().manual_seed(1)
    answers = {t: {k: {"w": torch.randn(4, generator=g)} for k in (0, 2)} for t in (3, 5)}
    result = federaser(
        store, [1], lambda t, m, c: answers[t], trajectory=trajectory, calibration_order=order
    )
    assert trajectory.rounds() == [1, 3, 5] and trajectory.clients() == [0, 2]
    model = trajectory.read_global(1)
    for t in (1, 3, 5):
        retained, original = trajectory.read_round(t), store.read_round(t)
        assert torch.equal(retained.global_model["w"], model["w"])
        assert retained.squares == {k: original.squares[k] for k in (0, 2)}
        model = state_sum(model, weighted_average(
            [retained.updates[k] for k in (0, 2)], [retained.num_examples[k] for k in (0, 2)]))  # fmt: skip
    assert torch.allclose(model["w"], result.model["w"], atol=1e-6)
    assert torch.equal(trajectory.read_update(1, 0)["w"], store.read_update(1, 0)["w"])


def test_recorded_norms_set_the_step_size_not_the_stored_values(tmp_path):
    """A rewritten history stores U~ with the norms of the U it replaced: eq. 2 reads those."""
    store = UpdateStore(tmp_path / "store")
    update = {"w": torch.tensor([3.0, 4.0])}  # norm 5
    store.write_round(1, {"w": torch.zeros(2)}, {0: (update, 1)})
    with store.begin_round(2, {"w": torch.zeros(2)}) as writer:
        writer.add_update(0, update, 1, squares={"w": 100.0})  # records norm 10
    result = federaser(store, [], lambda t, m, c: {0: {"w": torch.tensor([0.0, 1.0])}})
    assert torch.allclose(result.model["w"], torch.tensor([3.0, 14.0]))
    with pytest.raises(ConfigError, match="squares"):
        with store.begin_round(3, {"w": torch.zeros(2)}) as writer:
            writer.add_update(0, update, 1, squares={"w": float("nan")})


# ------------------------------------------- calibration-clients: thin sampled rounds topped up


def _sampled_store(tmp_path, participants):
    """Rounds ``{t: [clients]}`` of a sampled run: each round holds its participants only."""
    store = UpdateStore(tmp_path / "sampled")
    g = torch.Generator().manual_seed(3)
    for t, clients in participants.items():
        updates = {k: ({"w": torch.randn(4, generator=g)}, 10 + k) for k in clients}
        store.write_round(t, {"w": torch.full((4,), float(t))}, updates)
    return store


POOL = {k: 10 + k for k in range(6)}


def test_top_up_draws_only_non_participants_and_only_what_is_missing():
    assert top_up_clients([1, 2, 3], POOL, 3, seed=5) == []
    extra = top_up_clients([1, 2], POOL, 4, seed=5)
    assert len(extra) == 2 and not set(extra) & {1, 2} and set(extra) <= set(POOL)
    assert extra == top_up_clients([2, 1], POOL, 4, seed=5)  # the same draw, whatever the order
    assert top_up_clients([1], POOL, 100, seed=5) == [0, 2, 3, 4, 5]  # every one left
    draws = {tuple(top_up_clients([1], POOL, 2, seed=s)) for s in range(20)}
    assert len(draws) > 1  # the seed decides


def test_borrowed_step_is_the_participants_sample_weighted_mean_norm():
    squares = {1: {"w": 9.0, "b": 1.0}, 2: {"w": 36.0, "b": 4.0}}
    got = borrowed_squares(squares, {1: 10, 2: 30})
    assert got["w"] == pytest.approx(((10 * 3 + 30 * 6) / 40) ** 2)
    assert got["b"] == pytest.approx(((10 * 1 + 30 * 2) / 40) ** 2)


def test_a_thin_round_is_topped_up_with_remaining_non_participants_never_the_target(tmp_path):
    store = _sampled_store(tmp_path, {1: [0, 1, 2], 3: [0, 1], 5: [2, 3, 4]})
    calls = []

    def calibrate(t, model, clients):
        calls.append((t, list(clients)))
        return {k: {"w": torch.ones(4)} for k in clients}

    result = federaser(store, [0], calibrate, top_up=TopUp(3, POOL, seed=7))
    (thin_round, thin), (full_round, full) = calls  # round 1: the uncalibrated first step
    assert (thin_round, full_round) == (3, 5)
    assert 1 in thin and len(thin) == 3 and 0 not in thin  # client 1 and two non-participants
    assert full == [2, 3, 4]  # three remaining participants: untouched
    assert result.steps[0].topped_up == []  # the first step adds round 1's updates only
    assert result.steps[1].topped_up == sorted(set(thin) - {1})
    assert result.steps[2].topped_up == []


def test_a_topped_up_client_steps_by_the_participants_mean_norm(tmp_path):
    store = _sampled_store(tmp_path, {1: [1, 2], 2: [1]})
    direction = torch.tensor([0.0, 1.0, 0.0, 0.0])
    answers = lambda t, m, c: {k: {"w": direction * (k + 1)} for k in c}  # noqa: E731
    result = federaser(store, [0], answers, top_up=TopUp(2, {1: 11, 2: 12}))
    assert result.steps[1].clients == [1, 2] and result.steps[1].topped_up == [2]
    norm_1 = float(store.read_update(2, 1)["w"].norm())
    before = federaser(store, [0], answers).model["w"]  # the same first step, then client 1 alone
    start = before - norm_1 * direction
    # client 2 borrows client 1's norm: the step is norm_1 in the same direction either way
    assert torch.allclose(result.model["w"], start + norm_1 * direction, atol=1e-5)


def test_every_client_every_round_is_unchanged_bit_for_bit(tmp_path):
    store = _handmade_store(tmp_path, rounds=(1, 3, 5, 7), clients=(0, 1, 2, 3))
    g = torch.Generator().manual_seed(4)
    answers = {t: {k: {"w": torch.randn(4, generator=g)} for k in (1, 2, 3)} for t in (3, 5, 7)}
    calls = {}

    def calibrate(name):
        def ask(t, model, clients):
            calls.setdefault(name, []).append((t, list(clients)))
            return {k: answers[t][k] for k in clients}

        return ask

    paper = federaser(store, [0], calibrate("paper"))
    topped = federaser(
        store, [0], calibrate("topped"), top_up=TopUp(10, {k: 10 + k for k in range(4)})
    )
    assert calls["paper"] == calls["topped"]
    assert torch.equal(paper.model["w"], topped.model["w"])
    assert all(step.topped_up == [] for step in topped.steps)


def test_the_trajectory_records_a_topped_up_client_with_its_borrowed_norm(tmp_path):
    store = _sampled_store(tmp_path, {1: [1, 2], 3: [0, 1, 2], 5: [0, 1]})
    trajectory = UpdateStore(tmp_path / "trajectory")
    answers = lambda t, m, c: {k: {"w": torch.ones(4) * k} for k in c}  # noqa: E731
    federaser(store, [0], answers, top_up=TopUp(2, {1: 11, 2: 12, 3: 13}, seed=1),
              trajectory=trajectory)  # fmt: skip
    fifth = trajectory.read_round(5)
    extra = [k for k in fifth.clients if k != 1]
    assert len(extra) == 1 and extra[0] in (2, 3)
    assert fifth.squares[extra[0]]["w"] == pytest.approx(store.read_round(5).squares[1]["w"])
    assert fifth.num_examples[extra[0]] == {2: 12, 3: 13}[extra[0]]  # its own N_k


def test_top_up_with_the_average_order_is_refused(tmp_path):
    store = _handmade_store(tmp_path)
    with pytest.raises(ConfigError, match="calibration-clients"):
        federaser(store, [1], lambda t, m, c: {}, calibration_order="average",
                  top_up=TopUp(3, POOL))  # fmt: skip


def test_the_config_refuses_a_top_up_of_the_average_order_and_a_negative_count():
    from fedunlearn.config import ExperimentConfig

    assert ExperimentConfig.from_run_config({}).calibration_clients == 0  # the paper's rule
    config = ExperimentConfig.from_run_config({"calibration-clients": 9})
    assert config.calibration_clients == 9
    with pytest.raises(ConfigError, match="calibration-clients"):
        ExperimentConfig.from_run_config({"calibration-clients": 3, "calibration-order": "average"})
    with pytest.raises(ConfigError, match="calibration-clients"):
        ExperimentConfig.from_run_config({"calibration-clients": -1})
