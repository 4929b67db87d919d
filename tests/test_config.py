"""Bad input gets a clear error that names the parameter, the value and what is allowed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fedunlearn import cli
from fedunlearn.config import ExperimentConfig, MethodKey
from fedunlearn.config.fields import AT_LEAST_1
from fedunlearn.config.pyproject import BEGIN, END, method_keys_block, with_method_keys
from fedunlearn.errors import ConfigError
from fedunlearn.registry import UNLEARNING

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_defaults_match_the_flower_app_config():
    app_config = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    assert set(app_config) == set(ExperimentConfig.keys())
    parsed = ExperimentConfig.from_run_config(app_config)
    assert parsed == ExperimentConfig()


def test_the_method_keys_of_pyproject_are_the_registrys():
    """flwr run refuses a key the app config does not list: the built-in methods' keys stand
    there as the registry declares them, in the block `fedunlearn pyproject` writes."""
    text = PYPROJECT.read_text(encoding="utf-8")
    assert text == with_method_keys(text), (
        "pyproject.toml's method keys are stale: run python -m fedunlearn.cli pyproject"
    )
    assert "crab-window = 0  # Crab: " in method_keys_block()


def test_the_pyproject_command_writes_the_block_and_check_finds_a_stale_one(tmp_path, capsys):
    copy = tmp_path / "pyproject.toml"
    copy.write_text(PYPROJECT.read_text(encoding="utf-8"), encoding="utf-8")
    assert cli.main(["pyproject", str(copy), "--check"]) == 0
    toy = MethodKey("toy-every", 2, AT_LEAST_1, "rounds between the toy's snapshots")
    with UNLEARNING.registered("toy", lambda context, name: None, default=False, keys=(toy,)):
        assert cli.main(["pyproject", str(copy), "--check"]) == 1
        assert "run fedunlearn pyproject" in capsys.readouterr().out
        assert cli.main(["pyproject", str(copy)]) == 0
        block = copy.read_text(encoding="utf-8").split(BEGIN)[1].split(END)[0]
        assert "toy-every = 2  # rounds between the toy's snapshots" in block
    copy.write_text("[tool.flwr.app.config]\nrounds = 2\n", encoding="utf-8")
    assert cli.main(["pyproject", str(copy)]) == 2
    assert "BEGIN method keys" in capsys.readouterr().err


def test_the_main_job_is_the_app_defaults_with_ten_clients():
    """simulations/digits.toml (README's main job) sets K = 10 and otherwise the app defaults."""
    main_job = tomllib.loads((PYPROJECT.parent / "simulations" / "digits.toml").read_text())
    assert ExperimentConfig.from_run_config(main_job) == ExperimentConfig(num_clients=10)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("dataset", "imagenet", "one of digits, mnist"),
        ("partitioning", "random", "one of iid, dirichlet, shards"),
        ("retain-interval", 0, ">= 1"),
        ("rounds", 0, ">= 1"),
        ("num-clients", -1, "[0, 1000000]"),
        ("local-epochs", -1, ">= 1"),
        ("batch-size", 0, ">= 1"),
        ("lr", 0.0, "> 0"),
        ("alpha", -0.5, "(0, 1e+06]"),
        ("store-dtype", "bfloat16", "one of float32, float16"),
        ("device", "tpu", "one of auto, cpu, cuda"),
        ("momentum", 1.0, "[0.0, 1.0)"),
        ("fraction-evaluate", 1.5, "[0.0, 1.0]"),
        ("rounds", 2.5, "whole number"),
        ("rounds", "ten", "whole number"),
        ("retain", "maybe", "true or false"),
        ("lr", "fast", "a number"),
        ("run-name", "a/b", "without path separators"),
        ("train-samples", -1, ">= 0"),
        ("resume", "yes", "true or false"),
        ("max-update-ratio", 0.5, "0.0 (off) or a number in [1.0, 1e+12]"),
    ],
)
def test_each_bad_value_names_parameter_value_and_what_is_allowed(key, value, fragment):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({key: value})
    message = str(info.value)
    assert info.value.parameter == key
    assert key in message and repr(value) in message and fragment in message


def test_a_subset_smaller_than_the_federation_is_refused_set_or_adopted():
    with pytest.raises(ConfigError, match="at least num-clients=10") as info:
        ExperimentConfig.from_run_config({"train-samples": 5, "num-clients": 10})
    assert info.value.parameter == "train-samples"
    unset = ExperimentConfig.from_run_config({"train-samples": 5})
    with pytest.raises(ConfigError, match="at least num-clients=10") as info:
        unset.with_federation_size(10)
    assert info.value.parameter == "train-samples"


def test_num_clients_zero_adopts_the_federation_size_and_checks_ids_then():
    unset = ExperimentConfig.from_run_config({"unlearn-clients": "3", "attack-clients": ""})
    assert unset.num_clients == 0 and unset.unlearn_targets == [3]
    assert unset.with_federation_size(4).num_clients == 4
    with pytest.raises(ConfigError, match=r"partition ids in \[0, 2\]") as info:
        unset.with_federation_size(3)
    assert info.value.parameter == "unlearn-clients"
    with pytest.raises(ConfigError, match="fewer than all 3 clients") as info:
        ExperimentConfig.from_run_config({"unlearn-clients": "0,1,2"}).with_federation_size(3)
    assert info.value.parameter == "unlearn-clients"


def test_a_set_num_clients_must_equal_the_federation_size():
    config = ExperimentConfig.from_run_config({"num-clients": 10})
    assert config.with_federation_size(10) is config
    with pytest.raises(ConfigError, match=r"num-partitions \(2\)") as info:
        config.with_federation_size(2)
    assert info.value.parameter == "num-clients" and info.value.value == 10


def test_unknown_key_is_refused_with_the_nearest_known_key():
    with pytest.raises(ConfigError, match="unknown key; did you mean retain-interval\\?"):
        ExperimentConfig.from_run_config({"retain-intervall": 2})


@pytest.mark.parametrize(
    ("values", "suggested"),
    [
        ({"local-epoch": 3}, "local-epochs"),
        ({"unlearn_clients": "3"}, "unlearn-clients"),
        ({"Rounds": 3}, "rounds"),
        ({"unlearn-methods": "fedraser,crab"}, "federaser"),
        ({"unlearn-methods": "federaser,SIFU2"}, "sifu"),
        ({"partitioning": "dirichet"}, "dirichlet"),
        ({"dataset": "mnsit"}, "mnist"),
        ({"dataset": "fashion_mnist"}, "fashion-mnist"),
    ],
)
def test_a_misspelling_is_answered_with_the_right_word(values, suggested):
    with pytest.raises(ConfigError, match=f"did you mean {suggested}\\?"):
        ExperimentConfig.from_run_config(values)


def test_a_word_far_from_every_choice_gets_no_guess_and_no_list_of_every_key():
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"zzzz": 1})
    assert "did you mean" not in str(info.value) and "batch-size" not in str(info.value)
    assert "docs/configuration.md" in str(info.value)


def test_missing_data_root_directory(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"dataset": "mnist", "data-root": str(missing)})
    assert info.value.parameter == "data-root" and str(missing) in str(info.value)


def test_dataset_other_than_digits_needs_a_data_root():
    with pytest.raises(ConfigError, match="needs a data root"):
        ExperimentConfig.from_run_config({"dataset": "mnist"})


def test_strings_from_the_command_line_are_coerced():
    config = ExperimentConfig.from_run_config(
        {"rounds": "3", "lr": "0.1", "retain": "false", "unlearn-clients": ""}
    )
    assert (config.rounds, config.lr, config.retain) == (3, 0.1, False)


@pytest.mark.parametrize(
    ("interval", "expected"), [(1, [1, 2, 3, 4, 5, 6, 7]), (2, [1, 3, 5, 7]), (5, [1, 6])]
)
def test_retention_schedule_is_t1_equals_1_then_every_delta_t(interval, expected):
    from fedunlearn.registry import run_retention

    config = ExperimentConfig.from_run_config({"retain-interval": interval})
    (policy,) = run_retention(config)
    kept = [t for t in range(1, 8) if policy.select(t, {}, {0: {}}, {0: 1}).keep_global]
    assert kept == expected
    assert run_retention(ExperimentConfig(retain=False)) == []


def test_run_directory_is_output_dir_slash_run_name(tmp_path):
    config = ExperimentConfig.from_run_config({"output-dir": str(tmp_path), "run-name": "r1"})
    assert config.run_directory() == tmp_path / "r1"
    auto = ExperimentConfig.from_run_config({"output-dir": str(tmp_path)}).run_directory()
    assert auto.parent == tmp_path and auto.name.startswith("digits-")


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"unlearn-clients": "x"}, "unlearn-clients"),
        ({"num-clients": 10, "unlearn-clients": "10"}, "unlearn-clients"),
        ({"unlearn-clients": "-1"}, "unlearn-clients"),
        ({"num-clients": 2, "unlearn-clients": "0,1"}, "unlearn-clients"),
        ({"unlearn-methods": "federaser,magic"}, "unlearn-methods"),
        ({"unlearn-methods": ""}, "unlearn-methods"),
        ({"calibration-ratio": 0.0}, "calibration-ratio"),
        ({"calibration-ratio": 1.5}, "calibration-ratio"),
        ({"retain": False}, "retain"),
    ],
)
def test_bad_unlearning_requests(values, key):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config(values)
    assert info.value.parameter == key


def test_unlearning_request_parsing():
    config = ExperimentConfig.from_run_config(
        {"unlearn-clients": " 5, 0,5", "unlearn-methods": "FedRetrain,federaser"}
    )
    assert config.unlearn_targets == [0, 5]
    assert config.methods == ["fedretrain", "federaser"]
    assert ExperimentConfig.from_run_config({"unlearn-clients": ""}).unlearn_targets == []
    train_only = {"retain": False, "unlearn-methods": "fedretrain"}
    assert ExperimentConfig.from_run_config(train_only).methods == ["fedretrain"]


def test_a_number_given_for_a_text_key_is_read_as_text():
    assert ExperimentConfig.from_run_config({"unlearn-clients": 3}).unlearn_targets == [3]
    with pytest.raises(ConfigError, match="a string"):
        ExperimentConfig.from_run_config({"dataset": ["mnist"]})


def test_resume_needs_the_run_name_and_may_finish_an_unlearn_only_request():
    with pytest.raises(ConfigError, match="resume.*set together with run-name"):
        ExperimentConfig.from_run_config({"resume": True})
    again = {"resume": True, "unlearn-only": True, "run-name": "r", "unlearn-clients": "1"}
    assert ExperimentConfig.from_run_config(again).unlearn_only
    assert ExperimentConfig.from_run_config({"resume": True, "run-name": "r"}).resume


@pytest.mark.parametrize("value", [5.0, 1e9, "5.0", "1e9", "0x10", True, [5], None, "\u0663"])
def test_an_integer_key_takes_integers_only(value):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"certified-removals": value})
    assert info.value.parameter == "certified-removals" and "whole number" in str(info.value)


def test_integer_keys_take_their_text_and_stop_at_64_bits():
    assert ExperimentConfig.from_run_config({"rounds": " +3 "}).rounds == 3
    assert ExperimentConfig.from_run_config({"certified-removals": 2**63 - 1}).certified_removals
    for value in (2**63, -(2**63) - 1, str(2**63)):
        with pytest.raises(ConfigError, match="64-bit"):
            ExperimentConfig.from_run_config({"certified-removals": value})


@pytest.mark.parametrize("value", [10**400, "1e400", float("nan"), "-inf"])
def test_a_float_key_refuses_what_is_not_a_finite_number(value):
    with pytest.raises(ConfigError, match="invalid lr=.*finite"):
        ExperimentConfig.from_run_config({"lr": value})


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [
        ("seed", [0, 2**32 - 1], [-1, 2**32]),
        ("num-clients", [0, 1, 1_000_000], [-1, 1_000_001]),
        ("certified-delta", [1e-300, 0.999], [0.0, 1.0]),
        ("alpha", [1e-300, 1e6], [0.0, 1.000001e6]),
    ],
)
def test_bounds_are_where_the_documentation_says(key, good, bad):
    train_only = {"unlearn-clients": ""}
    for value in good:
        ExperimentConfig.from_run_config({**train_only, key: value})
    for value in bad:
        with pytest.raises(ConfigError) as info:
            ExperimentConfig.from_run_config({**train_only, key: value})
        assert info.value.parameter == key


@pytest.mark.parametrize(
    ("dataset", "model", "fits"),
    [
        ("digits", "digits-cnn", True),
        ("digits", "mnist-cnn", False),
        ("digits", "cifar10-cnn", False),
        ("digits", "adult-mlp", False),
        ("mnist", "mnist-cnn", True),
        ("mnist", "cifar10-cnn", True),
        ("cifar10", "digits-cnn", True),
        ("adult", "adult-mlp", True),
        ("adult", "digits-cnn", False),
        ("fashion-mnist", "adult-mlp", False),
    ],
)
def test_a_model_must_fit_the_dataset(tmp_path, dataset, model, fits):
    values = {"dataset": dataset, "model": model}
    if dataset != "digits":
        values["data-root"] = str(tmp_path)
    if fits:
        ExperimentConfig.from_run_config(values)
        return
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config(values)
    assert info.value.parameter == "model" and "fits" in str(info.value)


@pytest.mark.parametrize(
    "name", ["r1", "digits-20240101-120000", "_x", "A.b_c-9", "9", "r" * 100, "a.."]
)
def test_portable_run_names_are_accepted(name):
    assert ExperimentConfig.from_run_config({"run-name": name}).run_name == name


@pytest.mark.parametrize(
    "name",
    [
        ".",
        "..",
        ".x",
        "-x",
        "a/b",
        "a\\b",
        "a b",
        "a\x00b",
        "ab\n",
        "\u00e9",
        "\U0001f389",
        "r" * 101,
        "a:b",
        "a*b",
        "a\u200bb",
    ],
)
def test_other_run_names_are_refused(name):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"run-name": name})
    assert info.value.parameter == "run-name"


@pytest.mark.parametrize(
    "folder",
    [
        "/home/J\u00fcrgen/runs",
        "/home/Jose\u0301",
        "/\u65e5\u672c/\u0440\u0443\u043d",
        "/a b/c",
        "/x/(1) [2] {3} #4 $5 %6 & ' \" ~",
        "relative/dir",
        "~/runs",
    ],
)
def test_output_dirs_with_letters_of_any_script_are_accepted(folder):
    assert ExperimentConfig.from_run_config({"output-dir": folder}).output_dir == folder


@pytest.mark.parametrize(
    "folder",
    [
        "",
        "   ",
        "/a\x00b",
        "/a\nb",
        "/a\tb",
        "/a\x7fb",
        "/\U0001f600",
        "/a\u200db",
        "/a\u202eb",
        "/a\ufe0f",
        "/\u00a0x",
        "/\ud83d",
        "/" + "x" * 256,
        "/a/" * 1100,
    ],
)
def test_output_dirs_with_control_characters_emoji_or_odd_lengths_are_refused(folder):
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"output-dir": folder})
    assert info.value.parameter == "output-dir"


def test_an_output_dir_is_judged_after_expanding_its_variables(monkeypatch):
    monkeypatch.setenv("FEDUNLEARN_TEST_DIR", "/tmp/\U0001f389")
    with pytest.raises(ConfigError, match="U\\+1F389"):
        ExperimentConfig.from_run_config({"output-dir": "$FEDUNLEARN_TEST_DIR/runs"})
