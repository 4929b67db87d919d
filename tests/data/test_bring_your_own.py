"""A researcher's own dataset and model, brought without editing the package: ``dataset =
"module:function"`` and ``model = "module:function"`` from a module in a temporary folder
(``code-path``), checked at launch with one line naming what is wrong, then trained, unlearned
and certified like a built-in one; and the built-in registries' promises (one line adds one)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.datasets import load_dataset
from fedunlearn.dataset_registry import DATASETS
from fedunlearn.dataset_spec import DataSource, as_splits
from fedunlearn.errors import ConfigError
from fedunlearn.model_registry import MODELS
from fedunlearn.training.models import BodyHeadNet, as_body_head, build_model

USER_DATA = '''
import numpy as np


def load(source):
    """Four Gaussian blobs in 20 dimensions, 600 + 200 samples, seeded by the run."""
    rng = np.random.default_rng(source.seed)
    centres = rng.normal(size=(4, 20)) * 1.5
    y = rng.integers(0, 4, size=800)
    x = (centres[y] + rng.normal(size=(800, 20))).astype(np.float32)
    return x[:600], y[:600], x[600:], y[600:]


def two_arguments(root, seed):
    return None


def nan_inputs(source):
    x = np.full((50, 3), np.nan, dtype=np.float32)
    y = np.arange(50) % 2
    return x, y, x, y


def one_class(source):
    x = np.ones((50, 3), dtype=np.float32)
    y = np.zeros(50, dtype=np.int64)
    return x, y, x, y


def float_labels(source):
    x = np.ones((50, 3), dtype=np.float32)
    y = np.linspace(0, 1, 50)
    return x, y, x, y
'''

USER_MODELS = '''
from torch import nn


def build(input_shape, num_classes):
    """An MLP whose last layer is the linear head."""
    (features,) = input_shape
    return nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, num_classes))


class Parts(nn.Module):
    def __init__(self, features, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 16), nn.Tanh())
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def with_parts(input_shape, num_classes):
    return Parts(input_shape[0], num_classes)


class Detour(Parts):
    def forward(self, x):  # not head(body(x)): the certified head would act on another model
        return self.head(self.body(x) * 2)


def detour(input_shape, num_classes):
    return Detour(input_shape[0], num_classes)


def headless(input_shape, num_classes):
    return nn.Sequential(nn.Linear(input_shape[0], num_classes), nn.ReLU())


def one_argument(input_shape):
    return None
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch) -> Path:
    """A folder outside the package holding ``usr_data.py`` and ``usr_models.py``."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "usr_data.py").write_text(textwrap.dedent(USER_DATA))
    (folder / "usr_models.py").write_text(textwrap.dedent(USER_MODELS))
    monkeypatch.setattr(sys, "path", list(sys.path))  # code-path's insertion is undone after
    for name in ("usr_data", "usr_models"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return folder


def _config(folder: Path, **keys) -> ExperimentConfig:
    run = {
        "code-path": str(folder),
        "num-clients": 3,
        **{k.replace("_", "-"): v for k, v in keys.items()},
    }
    return ExperimentConfig.from_run_config(run)


# ---------------------------------------------------------------------- what launch refuses
@pytest.mark.parametrize(
    ("keys", "key", "says"),
    [
        (
            {"dataset": "usr_data:two_arguments"},
            "dataset",
            "taking 1 argument(s); its signature is (root, seed)",
        ),
        ({"dataset": "usr_data:missing"}, "dataset", "a function of module 'usr_data'"),
        ({"dataset": "no_such_module:load"}, "dataset", "importing 'no_such_module' failed"),
        (
            {"dataset": "usr_data:load", "model": "usr_models:one_argument"},
            "model",
            "taking 2 argument(s)",
        ),
        ({"dataset": "Not A Reference"}, "dataset", "module:function"),
    ],
)
def test_a_wrong_loader_or_builder_is_refused_at_validation_naming_the_key(
    user_code, keys, key, says
):
    with pytest.raises(ConfigError) as caught:
        _config(user_code, **keys)
    assert caught.value.parameter == key
    assert says in str(caught.value)


def test_a_code_path_missing_here_is_named_when_the_module_does_not_import(tmp_path):
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path / "absent", dataset="nowhere_but_there:load")
    assert caught.value.parameter == "code-path" and "on this machine" in str(caught.value)


def test_a_code_path_missing_here_is_no_error_where_the_module_is_installed(user_code, tmp_path):
    """A deployment's SuperNode that installed the module has no folder at the server's path."""
    sys.path.insert(0, str(user_code))
    config = _config(tmp_path / "the-servers-folder", dataset="usr_data:load")
    assert config.dataset == "usr_data:load"


@pytest.mark.parametrize(
    ("loader", "says"),
    [
        ("nan_inputs", "finite float32 train inputs"),
        ("one_class", "at least 2 classes"),
        ("float_labels", "integer class labels"),
    ],
)
def test_what_a_user_loader_returns_is_checked(user_code, loader, says):
    _config(user_code, dataset=f"usr_data:{loader}")  # imports fine; the data itself is wrong
    with pytest.raises(ConfigError, match=says):
        load_dataset(f"usr_data:{loader}")


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("usr_models:headless", "a model with a linear head"),
        ("usr_models:detour", "output is head(body(x))"),
    ],
)
def test_preflight_refuses_a_model_without_a_usable_linear_head(user_code, model, says):
    from fedunlearn.preflight import check_dataset

    config = _config(user_code, dataset="usr_data:load", model=model)
    with pytest.raises(ConfigError) as caught:
        check_dataset(config)
    assert caught.value.parameter == "model" and says in str(caught.value)


def test_a_class_key_beyond_a_user_datasets_classes_is_refused_once_loaded(user_code):
    from fedunlearn.preflight import check_dataset

    config = _config(
        user_code,
        dataset="usr_data:load",
        judge_models=3,
        judge_backdoor=True,
        judge_backdoor_class=4,
    )
    with pytest.raises(ConfigError) as caught:
        check_dataset(config)
    assert caught.value.parameter == "judge-backdoor-class" and "[0, 3]" in str(caught.value)


# ---------------------------------------------------------------------- what is accepted
def test_a_user_loader_and_model_build_a_body_and_head_that_classify(user_code):
    config = _config(user_code, dataset="usr_data:load", model="usr_models:build")
    splits = load_dataset(config.dataset, seed=3)
    assert (splits.num_classes, splits.input_shape, len(splits.train)) == (4, (20,), 600)
    net = build_model(config.model, splits.input_shape, splits.num_classes, seed=1)
    again = build_model(config.model, splits.input_shape, splits.num_classes, seed=1)
    assert isinstance(net.head, nn.Linear) and net.feature_dim == 32
    x = splits.test.x[:7]
    assert torch.equal(net(x), net.head(net.features(x)))  # the certified head's split is exact
    for mine, theirs in zip(net.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)  # every party builds the same M^1 from the seed


def test_a_model_with_body_and_head_is_kept_as_it_is_split(user_code):
    _config(user_code, dataset="usr_data:load", model="usr_models:with_parts")
    net = build_model("usr_models:with_parts", (20,), 4, seed=0)
    assert set(net.state_dict()) == {"body.0.weight", "body.0.bias", "head.weight", "head.bias"}


def test_as_body_head_splits_a_sequential_at_its_last_linear_layer():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3))
    net = as_body_head(model, 3)
    assert isinstance(net, BodyHeadNet) and net.head is model[3] and net.feature_dim == 5
    x = torch.randn(4, 3, 4)
    assert torch.equal(net(x), model(x))


def test_as_splits_packages_arrays_and_refuses_a_label_outside_the_classes():
    x, y = np.zeros((10, 2), np.float32), np.arange(10) % 2
    splits = as_splits("mine", (x, y, x, y))
    assert splits.num_classes == 2 and splits.train.y.dtype == torch.int64
    from fedunlearn.data.splits import DatasetSplits, TensorSplit

    split = TensorSplit(torch.zeros(4, 2), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ConfigError, match=r"labels in \[0, 1\]"):
        as_splits("mine", DatasetSplits("mine", split, split, 2, (2,)))


def test_a_run_folder_of_a_user_dataset_is_a_valid_name(user_code):
    config = _config(user_code, dataset="usr_data:load")
    assert config.run_directory(now=0).name.startswith("usr-data-load-")


# ---------------------------------------------------------------------- the registries
def test_one_registry_line_adds_a_dataset_the_config_accepts_and_lists(user_code):
    from fedunlearn.cli import main

    sys.path.insert(0, str(user_code))
    with DATASETS.registered(
        "blobs",
        "usr_data:load",
        num_classes=4,
        sample_shape=(20,),
        needs_root=False,
        default_model="adult-mlp",
    ):
        config = ExperimentConfig.from_run_config({"dataset": "blobs", "num-clients": 3})
        assert load_dataset(config.dataset).num_classes == 4
        assert main(["data", "list"]) == 0
        # a registered dataset's shape is checked before any data is loaded
        with pytest.raises(ConfigError) as caught:
            ExperimentConfig.from_run_config(
                {"dataset": "blobs", "model": "mnist-cnn", "num-clients": 3}
            )
        assert caught.value.parameter == "model" and "adult-mlp" in str(caught.value)
    with pytest.raises(ConfigError, match="blobs"):
        ExperimentConfig.from_run_config({"dataset": "blobs"})


def test_one_registry_line_adds_a_model(user_code):
    sys.path.insert(0, str(user_code))
    with MODELS.registered("tiny-mlp", "usr_models:build", input_rank=1):
        config = ExperimentConfig.from_run_config(
            {"dataset": "adult", "model": "tiny-mlp", "data-root": str(user_code)}
        )
        assert config.model == "tiny-mlp"
        with pytest.raises(ConfigError, match="rank 1"):
            build_model("tiny-mlp", (1, 8, 8), 10)


@pytest.mark.parametrize("name", ["Upper", "auto", "digits", "with space", ""])
def test_a_bad_or_taken_name_is_refused(name):
    registry = MODELS if name == "auto" else DATASETS
    with pytest.raises(ConfigError):
        registry.register(name, "usr_data:load")


def test_every_built_in_dataset_states_what_the_launch_checks():
    for spec in DATASETS:
        assert spec.description and spec.layout
        if spec.num_classes is not None:
            assert spec.default_model in MODELS
        if spec.name == "digits":
            splits = spec.load(DataSource(seed=0))
            assert (splits.num_classes, splits.input_shape) == (spec.num_classes, spec.sample_shape)


def test_an_installed_package_adds_a_dataset_and_a_model_by_entry_point(user_code, monkeypatch):
    """A package's ``[project.entry-points."fedunlearn.datasets"]`` (and ``.models``): its names
    are accepted, listed, checked at launch and loaded, with no line in the registries."""
    site = user_code.parent / "site"
    info = site / "blobs_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: blobs-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fedunlearn.datasets]\nblobs = usr_data:load\nbroken = usr_data:two_arguments\n"
        "digits = usr_data:load\n\n[fedunlearn.models]\nblob-mlp = usr_models:build\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(user_code))
    assert "blobs" in DATASETS and "blob-mlp" in MODELS
    assert DATASETS["digits"].loader == "fedunlearn.data.sources.digits:load"  # no override
    config = ExperimentConfig.from_run_config(
        {"dataset": "blobs", "model": "blob-mlp", "num-clients": 3}
    )
    assert load_dataset(config.dataset).num_classes == 4
    assert isinstance(build_model("blob-mlp", (20,), 4).head, nn.Linear)
    with pytest.raises(ConfigError) as caught:
        ExperimentConfig.from_run_config({"dataset": "broken", "num-clients": 3})
    assert caught.value.parameter == "dataset" and "its signature is (root, seed)" in str(
        caught.value
    )
