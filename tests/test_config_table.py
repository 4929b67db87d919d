"""The constraints table: one validator, rules across keys, group views, the page made from it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fedunlearn import cli
from fedunlearn.certified.certificate import CertifiedRemovalParams
from fedunlearn.config import (
    GROUPS,
    RULES,
    ExperimentConfig,
    Interval,
    constraints_markdown,
    parameter_table,
    request_rules,
    training_rules,
)
from fedunlearn.config import choices as choices_module
from fedunlearn.errors import ConfigError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_committed_configuration_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == constraints_markdown(), (
        "docs/configuration.md is stale: run python -m fedunlearn.cli config-docs"
    )


def test_config_docs_writes_the_page_and_check_finds_a_stale_one(tmp_path, capsys):
    page = tmp_path / "docs" / "configuration.md"
    assert cli.main(["config-docs", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == constraints_markdown()
    assert cli.main(["config-docs", str(page), "--check"]) == 0
    page.write_text(constraints_markdown().replace("reply-timeout", "reply-timeot"))
    assert cli.main(["config-docs", str(page), "--check"]) == 1
    assert "config-docs" in capsys.readouterr().out


def test_every_key_has_one_group_a_description_and_a_default_its_constraint_allows():
    rows = parameter_table()
    assert [row.key for row in rows] == list(ExperimentConfig.keys())
    assert {row.group for row in rows} == set(GROUPS)
    for row in rows:
        assert row.description and row.constraint.allowed, row.key
        row.constraint.check(row.key, row.default)
        assert f"| `{row.key}` |" in constraints_markdown()
    # The rows of a group are adjacent: the table reads group by group.
    order = [row.group for row in rows]
    assert order == sorted(order, key=list(GROUPS).index)


def test_group_views_hold_every_key_once_and_name_it_in_errors():
    config = ExperimentConfig.from_run_config({"certified-lambda": 0.01, "scrub-sigma-h": 2.0})
    seen = [config.group(group).key(name) for group in GROUPS for name in config.group(group)]
    assert sorted(seen) == sorted(ExperimentConfig.keys())
    assert config.certified.lam == config.certified_lambda == 0.01
    assert config.certified.key("lam") == "certified-lambda"
    assert config.scrubbing.sigma_h == 2.0 and config.scrubbing.enabled is False
    assert config.federation.reply_timeout == config.reply_timeout == 3600.0
    assert config.data.num_clients == config.num_clients
    with pytest.raises(AttributeError):
        _ = config.certified.certified_lambda
    with pytest.raises(ConfigError, match="one of data, training"):
        config.group("optimiser")


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [("reply-timeout", [1e-3, 1, 3600, 86_400], [0, -1.0, 86_400.5, 1e9])],
)
def test_reply_timeout_is_seconds_in_0_to_a_day(key, good, bad):
    for value in good:
        assert ExperimentConfig.from_run_config({key: value}).reply_timeout == float(value)
    for value in bad:
        with pytest.raises(ConfigError) as info:
            ExperimentConfig.from_run_config({key: value})
        assert info.value.parameter == key and "(0, 86400]" in str(info.value)


def test_each_interval_error_says_what_the_page_says():
    """Just outside each numeric key's range, the error's allowed text is the table's."""
    for row in parameter_table():
        constraint = row.constraint
        if not isinstance(constraint, Interval):
            continue
        outside = constraint.low if not constraint.closed_low else constraint.low - 1
        if outside == constraint.off:  # the value that turns it off is allowed: between them
            outside = (constraint.low + constraint.off) / 2
        with pytest.raises(ConfigError) as info:
            ExperimentConfig.from_run_config({row.key: outside, "unlearn-clients": ""})
        assert (info.value.parameter, info.value.allowed) == (row.key, constraint.allowed)


def test_certified_params_are_built_from_the_certified_group():
    config = ExperimentConfig.from_run_config(
        {"certified-sigma": 0.5, "certified-mode": "exact", "certified-gamma": "paper"}
    )
    params = CertifiedRemovalParams.from_group(config.certified)
    assert (params.sigma, params.mode, params.gamma, params.lam) == (0.5, "exact", "paper", 1e-3)
    assert params.max_rank == CertifiedRemovalParams().max_rank  # the engine's own setting


@pytest.mark.parametrize(
    ("config_values", "engine_values", "key", "name"),
    [
        ({"certified-noise": "none"}, {"noise": "none"}, "certified-noise", "noise"),
        ({"certified-sigma": 0.0}, {"sigma": 0.0}, "certified-sigma", "sigma"),
        ({"certified-lambda": -1.0}, {"lam": -1.0}, "certified-lambda", "lam"),
        ({"certified-delta": 1.0}, {"delta": 1.0}, "certified-delta", "delta"),
        ({"certified-mode": "slow"}, {"mode": "slow"}, "certified-mode", "mode"),
    ],
)
def test_one_rule_judges_the_run_config_and_the_engine(config_values, engine_values, key, name):
    with pytest.raises(ConfigError) as from_config:
        ExperimentConfig.from_run_config(config_values)
    with pytest.raises(ConfigError) as from_engine:
        CertifiedRemovalParams(**engine_values).validate()
    assert (from_config.value.parameter, from_engine.value.parameter) == (key, name)
    assert from_config.value.allowed == from_engine.value.allowed


def test_the_engine_keeps_checking_its_own_settings():
    for changes, name in (({"max_rank": 0}, "max_rank"), ({"tol": 1.0}, "tol")):
        with pytest.raises(ConfigError) as info:
            CertifiedRemovalParams(**changes).validate()
        assert info.value.parameter == name


def test_method_names_are_read_when_a_value_is_checked(monkeypatch):
    monkeypatch.setattr(choices_module, "UNLEARNING_METHODS", ("fedretrain", "toy"))
    config = ExperimentConfig.from_run_config({"unlearn-methods": "toy,fedretrain"})
    assert config.methods == ["toy", "fedretrain"]
    assert "a comma-separated subset of fedretrain, toy" in constraints_markdown()
    with pytest.raises(ConfigError, match="subset of fedretrain, toy"):
        ExperimentConfig.from_run_config({"unlearn-methods": "federaser"})


def test_every_rule_in_the_rules_modules_is_listed_and_runs_after_the_keys():
    defined = {
        name
        for module in (training_rules, request_rules)
        for name, function in inspect.getmembers(module, inspect.isfunction)
        if name.startswith("check_") and function.__module__ == module.__name__
    }
    assert defined == {rule.__name__ for _, rule in RULES}
    # A value bad alone is reported before a rule across keys that it would also break.
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_run_config({"num-clients": 1, "certified-delta": 0.0})
    assert info.value.parameter == "certified-delta"
