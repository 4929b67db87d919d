"""FedEraser on a ``retain-mode = norms`` history: the model full mode gives, bit for bit."""

from __future__ import annotations

import pytest
import torch

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.datasets import load_dataset
from fedunlearn.data.partitioning import partition_indices
from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING, norms_problem
from fedunlearn.seeding import derive_seed
from fedunlearn.store.retention import Selection
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.local import train_epochs
from fedunlearn.training.model_state import state_difference, state_sum
from fedunlearn.training.models import build_model
from fedunlearn.unlearning.federaser import (
    IntervalRetention,
    aggregate_updates,
    fedaccum,
    federaser,
)

CLIENTS, ROUNDS, INTERVAL = (0, 1, 2, 3), 5, 2


def _local(data, parts, start, k, t, epochs, salt):
    model = build_model("digits-cnn", data.input_shape, data.num_classes)
    model.load_state_dict(start)
    x, y = data.train.x[parts[k]], data.train.y[parts[k]]
    seed = derive_seed(7, salt, t, k)
    train_epochs(model, x, y, epochs=epochs, lr=0.05, batch_size=32, seed=seed)
    return state_difference(model.state_dict(), start)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A real digits FedAvg kept twice: whole updates (full) and t_1 whole, then norms."""
    root = tmp_path_factory.mktemp("norms")
    data = load_dataset("digits", seed=0)
    parts = [torch.as_tensor(p) for p in partition_indices(data.train.y, 4, "iid", seed=0)]
    model = build_model("digits-cnn", data.input_shape, data.num_classes, seed=1).state_dict()
    full, norms = UpdateStore(root / "full"), UpdateStore(root / "norms")
    policy = IntervalRetention(INTERVAL, "norms")
    for t in range(1, ROUNDS + 1):
        updates = {k: _local(data, parts, model, k, t, 1, "train") for k in CLIENTS}
        sizes = {k: len(parts[k]) for k in CLIENTS}
        kept = Selection.merge([policy.select(t, model, updates, sizes)])
        if kept is not None:
            full.write_round(t, model, {k: (updates[k], sizes[k]) for k in CLIENTS})
            with norms.begin_round(t, model if kept.keep_global else None) as writer:
                for k in sorted(kept.clients):
                    writer.add_update(k, updates[k], sizes[k])
                for k in sorted(kept.norms):
                    writer.add_norms(k, updates[k], sizes[k])
        model = state_sum(model, aggregate_updates(updates, sizes))

    def calibrate(t, start, clients):
        return {k: _local(data, parts, start, k, t, 1, "calibrate") for k in clients}

    return root, full, norms, calibrate


def test_norms_mode_keeps_t1_whole_and_norms_after(digits_run):
    _, full, norms, _ = digits_run
    assert norms.rounds() == full.rounds() == [1, 3, 5]
    assert norms.read_round(1).norms_only == [] and norms.read_round(3).norms_only == list(CLIENTS)
    sizes_full, sizes_norms = full.bytes_per_round(), norms.bytes_per_round()
    assert sizes_norms[1] == sizes_full[1]
    assert all(sizes_full[t] >= 100 * sizes_norms[t] for t in (3, 5))


@pytest.mark.parametrize("layerwise", [True, False])
def test_federaser_is_bit_identical_on_a_norms_history(digits_run, layerwise):
    root, full, norms, calibrate = digits_run
    kept = {}
    for name, store in (("full", full), ("norms", norms)):
        trajectory = UpdateStore(root / f"trajectory-{name}-{layerwise}")
        kept[name] = (federaser(store, [2], calibrate, layerwise=layerwise, trajectory=trajectory),)
        kept[name] += (trajectory,)
    (from_full, trajectory_full), (from_norms, trajectory_norms) = kept["full"], kept["norms"]
    assert from_full.model.keys() == from_norms.model.keys()
    assert all(torch.equal(from_full.model[k], from_norms.model[k]) for k in from_full.model)
    # a second request on each history (the reconstruction adopted) agrees bit for bit too
    assert trajectory_norms.read_round(3).norms_only == [0, 1, 3]
    again_full = federaser(trajectory_full, [0], calibrate, layerwise=layerwise).model
    again_norms = federaser(trajectory_norms, [0], calibrate, layerwise=layerwise).model
    assert all(torch.equal(again_full[k], again_norms[k]) for k in again_full)
    assert not all(torch.equal(again_full[k], from_full.model[k]) for k in again_full)


def test_what_needs_whole_updates_is_refused_on_a_norms_history(digits_run):
    _, _, norms, calibrate = digits_run
    with pytest.raises(ConfigError, match="only norms"):
        fedaccum(norms, [2])
    with pytest.raises(ConfigError, match="calibration-order"):
        federaser(norms, [2], calibrate, calibration_order="average")


def test_only_norms_reading_methods_pass_the_registry_check():
    assert norms_problem(UNLEARNING["federaser"]) is None
    assert norms_problem(UNLEARNING["fedretrain"]) is None
    assert norms_problem(UNLEARNING["sifu"]) is None  # global models and bounds, no updates
    for name, need in (("fedaccum", "retained-updates"), ("fedrecover", "round-history")):
        assert need in norms_problem(UNLEARNING[name])
    assert "selected-history" in norms_problem(UNLEARNING["crab"])


def _config(**values):
    base = {"unlearn-clients": "0", "retain-mode": "norms"}
    return ExperimentConfig.from_run_config({**base, **values})


def test_a_norms_run_with_a_full_history_method_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"retain-mode.*fedaccum needs retained-updates"):
        _config()  # the default methods include FedAccum
    with pytest.raises(ConfigError, match="calibration-order"):
        _config(**{"unlearn-methods": "federaser,fedretrain", "calibration-order": "average"})
    config = _config(**{"unlearn-methods": "federaser,fedretrain,sifu"})
    assert config.retain_mode == "norms"
    with pytest.raises(ConfigError, match="retain-mode"):
        _config(**{"retain-mode": "sparse"})


def test_a_request_on_a_norms_history_refuses_full_history_methods_before_running(digits_run):
    from fedunlearn.store.history import check_retained

    _, full, norms, _ = digits_run
    check_retained(norms, ["federaser", "fedretrain"])
    check_retained(full, ["fedaccum"])
    with pytest.raises(ConfigError, match="fedaccum needs retained-updates as whole updates"):
        check_retained(norms, ["federaser", "fedaccum"])
