"""A NumPy .npz archive loads with no code: its shape rule (features, images channels-first or -last),
training statistics only, sorted label codes; an object array is refused, never unpickled."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from fedunlearn.data.formats.arrays import load_npz, read_npz
from fedunlearn.errors import ConfigError, DatasetNotFoundError


def _source(root, **changes):
    values = dict(root=root, download=False, seed=0, label_column="label", test_fraction=0.2)
    return SimpleNamespace(**{**values, **changes})


def _save(tmp_path, **arrays):
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "shape, input_shape",
    [
        ((7,), (7,)),
        ((5, 6), (1, 5, 6)),
        ((3, 5, 6), (3, 5, 6)),
        ((5, 6, 3), (3, 5, 6)),
        ((5, 6, 1), (1, 5, 6)),
        ((1, 5, 3), (1, 5, 3)),  # second axis 1: channels-first, though the last is 3
    ],
    ids=["features", "HxW", "CxHxW", "HxWx3", "HxWx1", "ambiguous"],
)
def test_the_shape_rule_decides_what_a_sample_is(tmp_path, shape, input_shape):
    rng = np.random.default_rng(0)
    path = _save(
        tmp_path,
        x_train=rng.normal(size=(8, *shape)),
        y_train=np.array([0, 1] * 4),
        x_test=rng.normal(size=(4, *shape)),
        y_test=np.array([1, 0, 1, 0]),
    )
    splits = load_npz(_source(path))
    assert splits.input_shape == input_shape and splits.name == "npz"
    assert tuple(splits.train.x.shape) == (8, *input_shape)


def test_channels_last_images_are_moved_not_reshaped(tmp_path):
    x = np.zeros((4, 2, 2, 3), dtype=np.uint8)
    x[..., 0], x[..., 1], x[..., 2] = 10, 100, 250  # each channel one constant before scaling
    x[0, 0, 0, :] = (11, 101, 251)  # so each channel's std is not zero
    path = _save(
        tmp_path, x_train=x, y_train=np.array([0, 1, 0, 1]), x_test=x[:2], y_test=np.array([0, 1])
    )
    splits = load_npz(_source(path))
    # Channels-first: pixel (0, 0) of sample 0 is above each channel's mean in every channel.
    assert (splits.train.x[0, :, 0, 0] > 0).all() and (splits.train.x[0, :, 1, 1] < 0).all()


def test_features_are_standardised_with_training_statistics_only(tmp_path):
    x_train = np.array([[1.0, 10], [3, 10], [5, 10], [7, 10]])
    x_test = np.array([[101.0, 10], [9, 12]])
    path = _save(
        tmp_path,
        x_train=x_train,
        y_train=np.array([0, 1, 0, 1]),
        x_test=x_test,
        y_test=np.array([1, 0]),
    )
    splits = load_npz(_source(path))
    mean, std = 4.0, np.std([1.0, 3, 5, 7])
    assert splits.test.x[:, 0].tolist() == pytest.approx([(101 - mean) / std, (9 - mean) / std])
    assert splits.test.x[:, 1].tolist() == pytest.approx(
        [0.0, 2.0]
    )  # constant feature: divided by 1


def test_text_labels_are_coded_in_sorted_order(tmp_path):
    x = np.arange(12.0).reshape(6, 2)
    path = _save(
        tmp_path,
        x_train=x,
        y_train=np.array(["owl", "cat", "owl", "cat", "emu", "emu"]),
        x_test=x[:2],
        y_test=np.array(["emu", "owl"]),
    )
    splits, classes = read_npz(_source(path))
    assert classes == ["cat", "emu", "owl"]
    assert splits.train.y.tolist() == [2, 0, 2, 0, 1, 1] and splits.test.y.tolist() == [1, 2]


def test_x_and_y_are_split_stratified_and_seeded(tmp_path):
    y = np.repeat([5, 9], 10)
    path = _save(tmp_path, x=np.arange(40.0).reshape(20, 2), y=y.astype(float))
    splits, classes = read_npz(_source(path, test_fraction=0.3, seed=2))
    other = load_npz(_source(path, test_fraction=0.3, seed=3))
    assert classes == [5, 9] and (len(splits.train), len(splits.test)) == (14, 6)
    assert np.bincount(splits.test.y.numpy()).tolist() == [3, 3]
    assert not np.array_equal(splits.test.x.numpy(), other.test.x.numpy())


def test_an_object_array_is_refused_and_never_unpickled(tmp_path):
    class Bomb:
        def __reduce__(self):
            return (exec, ("import pathlib; pathlib.Path('EXPLODED').touch()",))

    path = tmp_path / "hostile.npz"
    np.savez(path, x=np.array([Bomb(), Bomb()], dtype=object), y=np.array([0, 1]))
    with pytest.raises(DatasetNotFoundError, match=r"array 'x' is unreadable.*allow_pickle"):
        load_npz(_source(path))
    assert (
        not (tmp_path / "EXPLODED").exists() and not __import__("pathlib").Path("EXPLODED").exists()
    )


def test_a_pickle_renamed_npz_is_refused(tmp_path):
    path = tmp_path / "data.npz"
    path.write_bytes(pickle.dumps({"x": [1, 2]}))
    with pytest.raises(DatasetNotFoundError, match="not a readable .npz"):
        load_npz(_source(path))


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"x_train": np.zeros((4, 2)), "y_train": np.array([0, 1, 0, 1])},
            r"keys \['x_train', 'y_train'\]",
        ),
        ({"x": np.zeros((4, 2, 2, 2, 2)), "y": np.array([0, 1, 0, 1])}, r"shape \(4, 2, 2, 2, 2\)"),
        (
            {"x": np.array(["a", "b", "c", "d"]), "y": np.array([0, 1, 0, 1])},
            "inputs must be numbers",
        ),
        (
            {"x": np.array([[np.nan], [1], [2], [3]]), "y": np.array([0, 1, 0, 1])},
            "NaN or infinite",
        ),
        ({"x": np.zeros((4, 2)), "y": np.array([0, 1, 0])}, "one label per sample"),
        ({"x": np.zeros((4, 2)), "y": np.array([0.5, 1, 0, 1])}, "labels must be integers or text"),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, "at least 2 are needed"),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.array([0, 1, 0, 1]),
                "x_test": np.zeros((2, 3)),
                "y_test": np.array([0, 1]),
            },
            r"x_test's \(3,\)",
        ),
        (
            {
                "x_train": np.zeros((4, 2)),
                "y_train": np.array([0, 1, 0, 1]),
                "x_test": np.zeros((1, 2)),
                "y_test": np.array([2]),
            },
            "never seen in training: 2",
        ),
    ],
    ids=[
        "missing keys",
        "5-D",
        "text inputs",
        "NaN",
        "label count",
        "fractional labels",
        "one class",
        "sample shapes",
        "unseen test class",
    ],
)
def test_a_bad_archive_is_refused_in_one_line(tmp_path, arrays, message):
    with pytest.raises(DatasetNotFoundError, match=message) as raised:
        load_npz(_source(_save(tmp_path, **arrays)))
    assert "\n" not in str(raised.value)


def test_a_single_npy_array_or_no_file_is_refused(tmp_path):
    np.save(tmp_path / "data.npy", np.zeros(3))
    with pytest.raises(DatasetNotFoundError, match="not an .npz archive"):
        load_npz(_source(tmp_path / "data.npy"))
    with pytest.raises(DatasetNotFoundError, match="not a file"):
        load_npz(_source(tmp_path))
    with pytest.raises(ConfigError, match="data-root"):
        load_npz(_source(""))
