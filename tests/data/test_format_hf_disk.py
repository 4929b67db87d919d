"""A Hugging Face save_to_disk folder loads with no code: an image column or scalar columns, a
DatasetDict's splits or a split of one Dataset; without ``datasets`` the error names the extra."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from fedunlearn.data.formats.hf_disk import load_hf_disk, read_hf_disk
from fedunlearn.errors import ConfigError, DatasetNotFoundError

datasets = pytest.importorskip("datasets")


def _source(root, **changes):
    values = dict(root=root, download=False, seed=0, label_column="label", test_fraction=0.2)
    return SimpleNamespace(**{**values, **changes})


def _images(labels, mode="L"):
    return [Image.new(mode, (5, 3), 30 + 50 * label) for label in labels]


def _image_set(labels, names=("bird", "cat", "dog")):
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=list(names))}
    )
    return datasets.Dataset.from_dict(
        {"img": _images(labels), "label": list(labels)}, features=features
    )


def test_an_image_dataset_dict_keeps_its_splits(tmp_path):
    saved = datasets.DatasetDict(
        train=_image_set([0, 1, 2, 0, 1, 2]), test=_image_set([2, 1]), validation=_image_set([0])
    )
    saved.save_to_disk(tmp_path / "saved")
    splits, classes = read_hf_disk(_source(tmp_path / "saved"))
    assert classes == [0, 1, 2] and splits.num_classes == 3 and splits.name == "hf-disk"
    assert splits.input_shape == (1, 3, 5) and (len(splits.train), len(splits.test)) == (6, 2)
    assert splits.test.y.tolist() == [2, 1]
    assert splits.train.x.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert splits.test.x[0].mean().item() > splits.test.x[1].mean().item()  # brighter class 2


def test_one_tabular_dataset_is_split_and_encoded_with_training_statistics(tmp_path):
    rows = 20
    dataset = datasets.Dataset.from_dict(
        {
            "height": np.linspace(1.0, 2.0, rows).tolist(),
            "colour": ["red", "blue"] * (rows // 2),
            "species": ["b", "a", "a", "b"] * (rows // 4),
        }
    )
    dataset.save_to_disk(tmp_path / "saved")
    splits, classes = read_hf_disk(_source(tmp_path / "saved", label_column="species", seed=1))
    assert classes == ["a", "b"] and splits.input_shape == (3,)  # height, blue, red
    assert (len(splits.train), len(splits.test)) == (16, 4)
    assert np.bincount(splits.test.y.numpy()).tolist() == [2, 2]
    assert splits.train.x[:, 0].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert set(splits.test.x[:, 1:].sum(axis=1).tolist()) == {1.0}


def test_a_train_only_dataset_dict_is_split(tmp_path):
    datasets.DatasetDict(train=_image_set([0, 1] * 5)).save_to_disk(tmp_path / "saved")
    splits = load_hf_disk(_source(tmp_path / "saved", test_fraction=0.2))
    assert (len(splits.train), len(splits.test)) == (8, 2) and splits.num_classes == 2


def test_a_wrong_label_column_lists_the_columns(tmp_path):
    _image_set([0, 1, 0, 1]).save_to_disk(tmp_path / "saved")
    with pytest.raises(ConfigError, match=r"label-column='class'.*'img', 'label'"):
        load_hf_disk(_source(tmp_path / "saved", label_column="class"))


def test_inputs_that_are_neither_an_image_nor_scalars_are_refused(tmp_path):
    datasets.Dataset.from_dict({"v": [[1, 2], [3, 4]] * 3, "label": [0, 1] * 3}).save_to_disk(
        tmp_path / "s"
    )
    with pytest.raises(DatasetNotFoundError, match="column 'v' is a (List|Sequence)"):
        load_hf_disk(_source(tmp_path / "s"))


def test_a_folder_that_is_not_a_saved_dataset_is_refused(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "state.json").write_text("{not json")
    with pytest.raises(DatasetNotFoundError, match="not a saved dataset"):
        load_hf_disk(_source(tmp_path / "junk"))
    datasets.DatasetDict(test=_image_set([0, 1])).save_to_disk(tmp_path / "no-train")
    with pytest.raises(DatasetNotFoundError, match=r"splits \['test'\]; a 'train' split"):
        load_hf_disk(_source(tmp_path / "no-train"))


def test_a_test_split_with_other_columns_is_refused(tmp_path):
    test = _image_set([0, 1]).rename_column("img", "picture")
    datasets.DatasetDict(train=_image_set([0, 1, 0, 1]), test=test).save_to_disk(tmp_path / "s")
    with pytest.raises(DatasetNotFoundError, match=r"test columns \['picture', 'label'\] differ"):
        load_hf_disk(_source(tmp_path / "s"))


def test_without_datasets_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match=r"pip install 'fedunlearn\[hf\]'"):
        load_hf_disk(_source(tmp_path))
