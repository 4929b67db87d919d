"""The console's comparison table: at most 120 characters wide for every registered method, the gap
to FedRetrain in points, the attack's column only where a model was attacked, the retained
megabytes always, a flagged row marked; the CSV keeps every column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedunlearn.console_table import CONSOLE_WIDTH, console_frame, console_table
from fedunlearn.registry import UNLEARNING


def comparison(methods, *, attacked: bool, rng) -> pd.DataFrame:
    n = len(methods)
    return pd.DataFrame(
        {
            "method": list(methods),
            "test_accuracy": rng.uniform(0, 1, n),
            "target_accuracy": rng.uniform(0, 1, n),
            "attack_success": rng.uniform(0, 1, n) if attacked else [float("nan")] * n,
            "seconds": rng.uniform(0, 1e5, n),
            "client_epochs": rng.integers(0, 10**6, n).astype(float),
            "communication_mb": rng.uniform(0, 1e5, n),
            "retained_mb": rng.uniform(0, 1e4, n),
            "did": ["x" * int(k) for k in rng.integers(0, 300, n)],
            "flag": ["5.3 points below fedretrain (flag-gap 5)" if k else "" for k in range(n)],
        }
    )


@pytest.mark.parametrize("attacked", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_every_registered_method_fits_120_columns_with_the_kept_megabytes(attacked, seed):
    rng = np.random.default_rng(seed)
    methods = ["fedavg", *UNLEARNING.names()]
    table = comparison(methods, attacked=attacked, rng=rng)
    text = console_table(table)
    assert max(len(line) for line in text.splitlines()) <= CONSOLE_WIDTH
    assert "kept MB" in text.splitlines()[0]
    assert ("attack" in text.splitlines()[0]) == attacked
    for method in methods:
        assert f"| {method} " in text


def test_a_long_method_name_gives_up_columns_not_the_width():
    table = comparison(
        ["a-method-with-a-name-of-thirty-ch", "fedretrain"],
        attacked=True,
        rng=np.random.default_rng(0),
    )
    text = console_table(table)
    assert max(len(line) for line in text.splitlines()) <= CONSOLE_WIDTH
    header = text.splitlines()[0]
    assert "comm MB" not in header and "kept MB" in header and "vs retrain" in header


def test_the_gap_is_in_points_against_fedretrain_and_flags_are_marked():
    table = pd.DataFrame(
        {
            "method": ["fedavg", "federaser", "fedretrain"],
            "test_accuracy": [0.98, 0.9, 0.95],
            "flag": ["", "5.0 points below fedretrain (flag-gap 5)", ""],
        }
    )
    frame = console_frame(table)
    assert frame["vs retrain"].tolist() == ["+3.00", "-5.00", "+0.00"]
    assert frame["flag"].tolist() == ["", "FLAGGED", ""]
    assert frame["kept MB"].tolist() == ["-", "-", "-"]  # absent: said, not hidden
    # Without a FedRetrain row there is no gap to give.
    assert console_frame(table[table["method"] != "fedretrain"])["vs retrain"].tolist() == [
        "-",
        "-",
    ]


def test_the_scrubbing_readouts_fit_and_an_unrelearned_model_says_so():
    from fedunlearn.console_table import SCRUBBING_COLUMNS
    from fedunlearn.registry import SCRUBBING

    methods = ["original", "retrain", *SCRUBBING.names()]
    rng = np.random.default_rng(0)
    n = len(methods)
    table = pd.DataFrame(
        {
            "method": methods,
            **{c: rng.uniform(0, 1, n) for c in ("error_f", "error_r", "error_test")},
            "error_test_class": rng.uniform(0, 1, n),
            "relearn_epochs": [float("nan")] + list(rng.uniform(0, 5, n - 1)),
            "relearn_reached": [False] + [True] * (n - 1),
            "relearn_budget_epochs": [5.0] * n,
            "information_nats": rng.uniform(0, 1e6, n),
            "seconds": rng.uniform(0, 1e4, n),
            "lam": rng.uniform(0, 1, n),  # in the CSV, not on the console
        }
    )
    text = console_table(table, SCRUBBING_COLUMNS)
    assert max(len(line) for line in text.splitlines()) <= CONSOLE_WIDTH
    assert "lam" not in text.splitlines()[0]
    frame = console_frame(table, SCRUBBING_COLUMNS)
    assert frame["relearn epochs"].iloc[0] == "> 5"  # never relearned: not a blank
    assert frame["relearn epochs"].iloc[1] != "-"
