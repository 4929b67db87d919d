"""The judge's table on a synthetic run: the floor and ceiling rows always there and told apart,
a method that forgot sits with the ceiling, one that did not with the floor; the files are written
and say "no signal" when the floor and the ceiling overlap."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from judge_worlds import judge_world  # noqa: E402

from fedunlearn.errors import ConfigError  # noqa: E402
from fedunlearn.judge import (  # noqa: E402
    NO_SIGNAL,
    judge_figure,
    judge_markdown,
    judge_table,
    rmia_reference_sweep,
    separated,
    write_judge_report,
)
from fedunlearn.judge.metrics import reference_counts, rmia_metric  # noqa: E402
from fedunlearn.plots import method_colour  # noqa: E402
from fedunlearn.registry import JUDGE_METRICS  # noqa: E402


@pytest.fixture(scope="module")
def world_and_table():
    data = judge_world(0, models=6, examples=30)
    return data, judge_table(data, rng=np.random.default_rng(0))


def test_rows_are_ordered_and_every_registered_column_has_its_interval(world_and_table):
    data, table = world_and_table
    assert list(table["population"]) == [
        "original",
        "leaky",
        "exact",
        "fedretrain",
        "retrain-independent",
    ]
    for spec in JUDGE_METRICS:
        for column in spec.options["columns"]:
            assert {column, f"{column}-low", f"{column}-high"} <= set(table.columns)


def test_forgetting_shows_between_the_floor_and_the_ceiling(world_and_table):
    _, table = world_and_table
    rows = table.set_index("population")
    assert separated(table)
    assert rows.loc["original", "f"] < rows.loc["leaky", "f"] < rows.loc["exact", "f"]
    assert rows.loc["original", "ulira-accuracy"] > 0.9
    assert abs(rows.loc["exact", "ulira-accuracy"] - 0.5) < 0.1
    assert rows.loc["original", "rmia-auc"] > 0.9 and rows.loc["original", "lira-auc"] > 0.9
    assert abs(rows.loc["retrain-independent", "rmia-auc"] - 0.5) < 0.1
    assert (
        rows.loc["original", "backdoor-success"] > 0.9 > 0.1 > rows.loc["exact", "backdoor-success"]
    )
    for column in ("f", "ulira-accuracy", "rmia-auc", "test-accuracy"):
        assert np.all(table[f"{column}-low"] <= table[column])
        assert np.all(table[column] <= table[f"{column}-high"])


def test_markdown_ranks_methods_only_when_the_floor_and_ceiling_separate(world_and_table):
    _, table = world_and_table
    text = judge_markdown(table)
    assert "1. exact" in text and "2. leaky" in text and NO_SIGNAL not in text
    blurred = table.copy()
    floor = blurred["population"] == "original"
    blurred.loc[floor, ["f-low", "f-high"]] = [0.0, 1.0]
    assert not separated(blurred)
    text = judge_markdown(blurred)
    assert NO_SIGNAL in text and "ranked" not in text
    # A floor above the ceiling (the original no easier to tell from retraining than retraining
    # from itself) is no signal either, however narrow the intervals.
    inverted = table.copy()
    ceiling = inverted["population"] == "retrain-independent"
    inverted.loc[floor, ["f", "f-low", "f-high"]] = [0.30, 0.29, 0.31]
    inverted.loc[ceiling, ["f", "f-low", "f-high"]] = [0.13, 0.12, 0.14]
    assert not separated(inverted)


def test_the_report_files_are_written(world_and_table, tmp_path):
    data, table = world_and_table
    paths = write_judge_report(data, table, tmp_path)
    assert sorted(p.name for p in paths.values()) == [
        "judge.csv",
        "judge.md",
        "judge.png",
        "judge_rmia.csv",
    ]
    assert pd.read_csv(paths["judge.csv"]).shape == table.shape
    sweep = pd.read_csv(paths["judge_rmia.csv"])
    assert list(sweep[sweep["population"] == "original"]["reference-models"]) == [1, 2, 4, 6]
    fig = judge_figure(data, table)
    ax_eps, ax_backdoor, ax_roc = fig.axes[:3]
    assert ax_roc.get_xscale() == "log" and ax_roc.get_yscale() == "log"
    assert len(ax_backdoor.patches) == 5 and ax_eps.get_legend() is not None
    # Every population in its method's colour, the same as in the run's other figures.
    for line in ax_roc.get_lines():
        if line.get_label() != "chance":
            assert line.get_color() == method_colour(line.get_label())
    plt.close(fig)


def test_backdoor_is_missing_without_a_trigger_and_unknown_populations_are_refused():
    data = judge_world(1, models=4, examples=10, backdoor=False)
    table = judge_table(data, metrics=["backdoor", "utility"], rng=np.random.default_rng(0))
    assert table["backdoor-success"].isna().all() and (table["seconds"] == 2.0).all()
    with pytest.raises(ConfigError) as error:
        rmia_metric(data, "nobody", np.random.default_rng(0))
    assert error.value.parameter == "population"
    assert reference_counts(32) == (1, 2, 4, 8, 16, 32) and reference_counts(1) == (1,)
    rows = rmia_reference_sweep(data, "original", counts=(1, 4))
    assert [row["reference-models"] for row in rows] == [1, 4]


def test_the_verdicts_put_the_method_that_forgot_with_retraining(world_and_table):
    from fedunlearn.judge import DISTINGUISHABLE, INDISTINGUISHABLE, judge_verdicts

    _, table = world_and_table
    verdicts = judge_verdicts(table)
    assert set(verdicts) == {"leaky", "exact"}  # the floor and ceilings are not judged
    assert verdicts["exact"]["verdict"] == INDISTINGUISHABLE
    assert verdicts["leaky"]["verdict"] == DISTINGUISHABLE
    assert "- exact: indistinguishable from retraining" in judge_markdown(table)


def _interval_table(method_f, method_ulira, ceiling_f=(0.4, 0.5), floor_f=(0.0, 0.1)):
    rows = []
    for population, f, ulira in (
        ("original", floor_f, (0.7, 0.8)),
        ("m", method_f, method_ulira),
        ("fedretrain", ceiling_f, (0.45, 0.55)),
        ("retrain-independent", ceiling_f, (0.45, 0.55)),
    ):
        rows.append(
            {
                "population": population,
                "f": sum(f) / 2,
                "f-low": f[0],
                "f-high": f[1],
                "ulira-accuracy": sum(ulira) / 2,
                "ulira-accuracy-low": ulira[0],
                "ulira-accuracy-high": ulira[1],
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("f", "ulira", "expected", "closer"),
    [
        ((0.45, 0.6), (0.5, 0.6), "indistinguishable from retraining", False),
        ((0.2, 0.3), (0.5, 0.6), "distinguishable from retraining", False),  # F below the ceiling
        ((0.45, 0.6), (0.6, 0.7), "distinguishable from retraining", False),  # U-LiRA tells it
        # F above the ceiling, U-LiRA below chance: closer to FedRetrain than retraining is
        ((0.51, 0.6), (0.5, 0.6), "indistinguishable from retraining", True),
        ((0.45, 0.6), (0.3, 0.4), "indistinguishable from retraining", True),
        ((0.51, 0.6), (0.6, 0.7), "distinguishable from retraining", False),
    ],
)
def test_a_method_is_told_apart_only_when_the_attacks_beat_retraining_itself(
    f, ulira, expected, closer
):
    from fedunlearn.judge import judge_verdicts

    verdict = judge_verdicts(_interval_table(f, ulira))["m"]
    assert (verdict["verdict"], verdict["closer"]) == (expected, closer)


def test_without_signal_no_method_gets_a_verdict():
    from fedunlearn.judge import judge_verdicts

    table = _interval_table((0.45, 0.6), (0.5, 0.6), floor_f=(0.3, 0.45))
    assert judge_verdicts(table)["m"]["verdict"] == NO_SIGNAL


def _backdoored(table, original, retrained, method):
    """``table`` with backdoor success intervals (±0.01 around each value)."""
    values = {"original": original, "fedretrain": retrained, "retrain-independent": retrained}
    values["m"] = method
    success = table["population"].map(values)
    return table.assign(
        **{
            "backdoor-success": success,
            "backdoor-success-low": success - 0.01,
            "backdoor-success-high": success + 0.01,
        }
    )


@pytest.mark.parametrize(
    ("original", "retrained", "method", "removed"),
    [
        (0.95, 0.001, 0.002, True),  # learned, and the method is at retraining's level
        (0.95, 0.001, 0.60, False),  # learned, and the method kept it
        (0.0045, 0.0009, 0.017, None),  # never learned (the judge's Dirichlet(0.1) seed 0)
        (0.0045, 0.0009, 0.0010, None),  # never learned: "removed" would hold for any model
        (0.15, 0.001, 0.002, None),  # 14.9 points above FedRetrain: fewer than 20
    ],
)
def test_the_backdoor_verdict_needs_a_backdoor_the_original_learned(
    original, retrained, method, removed
):
    from fedunlearn.judge import judge_verdicts
    from fedunlearn.judge.report import backdoor_problem, judge_markdown

    table = _backdoored(_interval_table((0.45, 0.6), (0.5, 0.6)), original, retrained, method)
    verdict = judge_verdicts(table)["m"]
    assert verdict["backdoor_removed"] is removed
    assert bool(verdict["backdoor_problem"]) == (removed is None) == bool(backdoor_problem(table))
    text = judge_markdown(table)
    assert ("backdoor removed" in text) == (removed is True)
    assert ("backdoor NOT removed" in text) == (removed is False)
    assert ("cannot tell whether a method removed it" in text) == (removed is None)
