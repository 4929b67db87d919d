"""An image folder loads with no code: both layouts, sorted class names, one size, grayscale or RGB,
standardised with training statistics only; bad trees are refused in one line naming the files."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from fedunlearn.data.formats.image_folder import load_image_folder, read_image_folder
from fedunlearn.errors import ConfigError, DatasetNotFoundError


def _source(root, **changes):
    values = dict(root=root, download=False, seed=0, label_column="label", test_fraction=0.2)
    return SimpleNamespace(**{**values, **changes})


def _save(path, value, size=(6, 4), mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    color = value if mode == "L" else (value, 255 - value, value // 2)
    Image.new(mode, size, color).save(path)


def _tree(root, classes=("cat", "dog"), per_class=5, mode="L"):
    for code, name in enumerate(classes):
        for index in range(per_class):
            _save(root / name / f"{index}.png", 40 * code + 7 * index, mode=mode)
    return root


def test_a_train_test_tree_keeps_its_splits_and_sorts_the_class_names(tmp_path):
    _tree(tmp_path / "val", classes=("moth",), per_class=1)  # beside train/ and test/: ignored
    for split, count in (("train", 4), ("test", 2)):
        for name, value in (("zebra", 200), ("ant", 20)):
            for index in range(count):
                _save(tmp_path / split / name / f"{index}.png", value + index)
    splits, classes = read_image_folder(_source(tmp_path))
    assert classes == ["ant", "zebra"]
    assert splits.name == "image-folder" and splits.num_classes == 2
    assert splits.input_shape == (1, 4, 6)  # (C, H, W) of a 6-wide, 4-high image
    assert (len(splits.train), len(splits.test)) == (8, 4)
    assert (
        splits.train.y.dtype == torch.int64 and sorted(splits.train.y.tolist()) == [0] * 4 + [1] * 4
    )
    # Bright pixels are the zebras' (code 1), dark the ants' (code 0): codes follow the names.
    assert splits.train.x[splits.train.y == 1].mean() > splits.train.x[splits.train.y == 0].mean()


def test_pixels_are_standardised_with_training_statistics_only(tmp_path):
    for split, values in (("train", (10, 30, 50, 70)), ("test", (200, 220))):
        for index, value in enumerate(values):
            _save(tmp_path / split / ("a" if index % 2 else "b") / f"{index}.png", value)
    splits = load_image_folder(_source(tmp_path))
    assert splits.train.x.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert splits.train.x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    train_pixels = np.array([10, 30, 50, 70]) / 255
    expected = (200 / 255 - train_pixels.mean()) / train_pixels.std()
    assert splits.test.x.min().item() == pytest.approx(expected, rel=1e-4)  # not forced to 0


def test_a_flat_tree_is_split_stratified_and_seeded(tmp_path):
    _tree(tmp_path, classes=("a", "b", "c"), per_class=10)
    first = load_image_folder(_source(tmp_path, seed=3, test_fraction=0.2))
    again = load_image_folder(_source(tmp_path, seed=3, test_fraction=0.2))
    other = load_image_folder(_source(tmp_path, seed=4, test_fraction=0.2))
    assert (len(first.train), len(first.test)) == (24, 6)
    assert np.bincount(first.test.y.numpy()).tolist() == [2, 2, 2]
    assert np.array_equal(first.test.x.numpy(), again.test.x.numpy())
    assert not np.array_equal(first.test.x.numpy(), other.test.x.numpy())


def test_colour_images_give_three_channels_and_a_grayscale_one_is_converted(tmp_path):
    _tree(tmp_path, per_class=3, mode="RGB")
    _save(tmp_path / "cat" / "gray.png", 90, mode="L")
    splits = load_image_folder(_source(tmp_path, test_fraction=0.3))
    assert splits.input_shape == (3, 4, 6)


def test_two_image_sizes_are_refused_naming_a_file_of_each(tmp_path):
    _tree(tmp_path, per_class=3)
    _save(tmp_path / "dog" / "big.png", 5, size=(8, 8))
    with pytest.raises(DatasetNotFoundError, match=r"two sizes: .*\.png is 6x4, .*big\.png is 8x8"):
        load_image_folder(_source(tmp_path))


def test_a_broken_image_is_refused_by_name(tmp_path):
    _tree(tmp_path, per_class=3)
    (tmp_path / "cat" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(DatasetNotFoundError, match=r"broken\.png.*not a readable image"):
        load_image_folder(_source(tmp_path))


def test_sixteen_bit_images_are_refused_rather_than_scaled_wrongly(tmp_path):
    _tree(tmp_path, per_class=3)
    Image.new("I;16", (6, 4), 40000).save(tmp_path / "cat" / "deep.png")
    with pytest.raises(DatasetNotFoundError, match=r"deep\.png has mode 'I;16'"):
        load_image_folder(_source(tmp_path))


def test_a_test_class_unknown_to_training_is_refused(tmp_path):
    _tree(tmp_path / "train", per_class=2)
    _tree(tmp_path / "test", classes=("cat", "dog", "emu"), per_class=1)
    with pytest.raises(DatasetNotFoundError, match="test labels never seen in training: 'emu'"):
        load_image_folder(_source(tmp_path))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda root: _tree(root, classes=("only",)), "at least 2 are needed"),
        (lambda root: (root / "cat").mkdir(), "no valid file|no class folders"),
        (lambda root: root.mkdir(exist_ok=True), "no class folders"),
        (lambda root: _tree(root, per_class=1), "needs at least 2 of every class"),
    ],
    ids=["one class", "an empty class folder", "no class folder", "a class of one image"],
)
def test_a_tree_that_cannot_make_two_splits_is_refused(tmp_path, build, message):
    root = tmp_path / "data"
    root.mkdir()
    build(root)
    with pytest.raises(DatasetNotFoundError, match=message):
        load_image_folder(_source(root))


def test_the_data_root_and_the_test_fraction_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="data-root"):
        load_image_folder(_source(None))
    with pytest.raises(DatasetNotFoundError, match="nothing there"):
        load_image_folder(_source(tmp_path / "absent"))
    _tree(tmp_path / "data", per_class=3)
    for bad in (0, 1.0, -0.1, "0.2"):
        with pytest.raises(ConfigError, match="test-fraction"):
            load_image_folder(_source(tmp_path / "data", test_fraction=bad))
