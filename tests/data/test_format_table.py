"""A CSV or Parquet table loads with no code: numbers standardised and text one-hot with training
statistics, labels coded in sorted order, missing values and wrong columns refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fedunlearn.data.formats import table
from fedunlearn.data.formats.table import load_table, read_table
from fedunlearn.errors import ConfigError, DatasetNotFoundError


def _source(root, **changes):
    values = dict(root=root, download=False, seed=0, label_column="label", test_fraction=0.2)
    return SimpleNamespace(**{**values, **changes})


def _frame(rows=20):
    return pd.DataFrame(
        {
            "age": np.arange(rows, dtype=float) * 3 + 20,
            "city": ["Oslo", "Rome", "Lima", "Oslo"] * (rows // 4),
            "label": ["yes", "no"] * (rows // 2),
        }
    )


def test_a_train_and_test_pair_is_encoded_with_training_statistics(tmp_path):
    train = pd.DataFrame(
        {"age": [10.0, 20, 30, 40], "city": ["b", "a", "b", "c"], "label": [7, 3, 7, 3]}
    )
    test = pd.DataFrame({"age": [100.0, 20], "city": ["a", "z"], "label": [3, 7]})
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    splits, classes = read_table(_source(tmp_path))
    assert classes == [3, 7] and splits.num_classes == 2 and splits.name == "table"
    assert splits.train.y.tolist() == [1, 0, 1, 0] and splits.test.y.tolist() == [0, 1]
    assert splits.input_shape == (4,)  # age, then city's training categories a, b, c
    mean, std = 25.0, np.std([10.0, 20, 30, 40])
    assert splits.test.x[:, 0].tolist() == pytest.approx([(100 - mean) / std, (20 - mean) / std])
    assert splits.train.x[:, 1:].tolist() == [[0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert splits.test.x[:, 1:].tolist() == [[1, 0, 0], [0, 0, 0]]  # 'z' unseen: all zeros


def test_one_file_is_split_stratified_and_seeded(tmp_path):
    _frame(40).to_csv(tmp_path / "data.csv", index=False)
    splits = load_table(_source(tmp_path / "data.csv", test_fraction=0.25, seed=1))
    again = load_table(_source(tmp_path / "data.csv", test_fraction=0.25, seed=1))
    assert (len(splits.train), len(splits.test)) == (30, 10)
    assert np.bincount(splits.test.y.numpy()).tolist() == [5, 5]
    assert np.array_equal(splits.test.x.numpy(), again.test.x.numpy())
    assert splits.train.x[:, 0].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert splits.train.x.dtype.is_floating_point and splits.train.x.shape[1] == 4


def test_a_parquet_file_reads_as_its_csv_does(tmp_path):
    pytest.importorskip("pyarrow")
    _frame().to_csv(tmp_path / "data.csv", index=False)
    _frame().to_parquet(tmp_path / "data.parquet")
    from_csv = load_table(_source(tmp_path / "data.csv"))
    from_parquet = load_table(_source(tmp_path / "data.parquet"))
    assert np.allclose(from_csv.train.x.numpy(), from_parquet.train.x.numpy())
    assert np.array_equal(from_csv.test.y.numpy(), from_parquet.test.y.numpy())


def test_parquet_without_pyarrow_names_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=r"needs pyarrow: pip install pyarrow"):
        load_table(_source(path))


def test_another_label_column_is_used_and_a_wrong_one_lists_the_columns(tmp_path):
    frame = _frame().rename(columns={"label": "outcome"})
    frame.to_csv(tmp_path / "data.csv", index=False)
    assert load_table(_source(tmp_path / "data.csv", label_column="outcome")).num_classes == 2
    with pytest.raises(ConfigError, match=r"label-column='label'.*'age', 'city', 'outcome'"):
        load_table(_source(tmp_path / "data.csv"))


def test_a_missing_value_is_refused_with_its_row_and_column(tmp_path):
    (tmp_path / "data.csv").write_text("age,city,label\n1,Oslo,a\n2,,b\n3,Rome,a\n4,NA,b\n")
    with pytest.raises(DatasetNotFoundError, match=r"missing value at data row 2, column 'city'"):
        load_table(_source(tmp_path / "data.csv"))


def test_text_such_as_na_is_a_category_not_a_missing_value(tmp_path):
    frame = _frame()
    frame.loc[0, "city"] = "NA"
    frame.to_csv(tmp_path / "data.csv", index=False)
    assert load_table(_source(tmp_path / "data.csv", seed=2)).input_shape == (5,)


def test_text_in_a_numeric_test_column_is_refused_with_its_row(tmp_path):
    pd.DataFrame({"age": [1.0, 2, 3, 4], "label": [0, 1, 0, 1]}).to_csv(
        tmp_path / "train.csv", index=False
    )
    pd.DataFrame({"age": ["5", "old"], "label": [0, 1]}).to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(
        DatasetNotFoundError,
        match=r"'age' is numeric but the test split holds 'old' at its data row 2",
    ):
        load_table(_source(tmp_path))


@pytest.mark.parametrize(
    "train, test, message",
    [
        ({"x": [1, 2], "label": ["a", "a"]}, {"x": [3], "label": ["a"]}, "at least 2 are needed"),
        (
            {"x": [1, 2], "label": ["a", "b"]},
            {"x": [3], "label": ["c"]},
            "never seen in training: 'c'",
        ),
        ({"x": [1, 2], "label": ["a", "b"]}, {"y": [3], "label": ["a"]}, "columns .* differ"),
        ({"label": ["a", "b"]}, {"label": ["a"]}, "no feature column"),
    ],
    ids=["one class", "unseen test class", "other columns", "no feature"],
)
def test_a_pair_that_cannot_train_a_classifier_is_refused(tmp_path, train, test, message):
    pd.DataFrame(train).to_csv(tmp_path / "train.csv", index=False)
    pd.DataFrame(test).to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(DatasetNotFoundError, match=message):
        load_table(_source(tmp_path))


def test_unreadable_or_misplaced_files_are_refused_in_one_line(tmp_path):
    (tmp_path / "data.csv").write_bytes(b"\xff\xfe\x00garbage\x00\n\x00")
    (tmp_path / "data.txt").write_text("a,b\n")
    (tmp_path / "empty.csv").write_text("age,label\n")
    for path, message in (
        (tmp_path / "data.csv", "unusable"),
        (tmp_path / "data.txt", "not a .csv or .parquet file"),
        (tmp_path / "empty.csv", "no data rows"),
        (tmp_path, "needs train.csv and test.csv"),
        (tmp_path / "absent.csv", "nothing there"),
    ):
        with pytest.raises(DatasetNotFoundError, match=message) as raised:
            load_table(_source(path))
        assert "\n" not in str(raised.value)
    assert table.NAME == "table"
