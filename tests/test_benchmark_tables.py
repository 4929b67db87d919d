"""The seed and suite tables: gaps are taken within each comparison, a verdict holds at the seeds
it held at, and a flag at any seed is counted."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simulations.benchmarks.repeat import comparison_summary, holds, mean_sd, with_gaps


def _long():
    rows = []
    for seed, (retrain, eraser, flag) in enumerate([(0.9, 0.88, ""), (0.8, 0.5, "gap")]):
        rows += [
            {"seed": seed, "method": "fedretrain", "test_accuracy": retrain, "client_epochs": 100,
             "flag": ""},
            {"seed": seed, "method": "federaser", "test_accuracy": eraser, "client_epochs": 25,
             "flag": flag},
        ]  # fmt: skip
    return pd.DataFrame(rows)


def test_gaps_are_to_fedretrain_of_the_same_seed():
    long = with_gaps(_long(), ["seed"])
    eraser = long[long["method"] == "federaser"]
    assert [round(g, 6) for g in eraser["gap_points"]] == [-2.0, -30.0]
    assert list(eraser["client_epochs_share"]) == [0.25, 0.25]


def test_the_summary_counts_flags_and_lists_every_seed():
    summary = comparison_summary(with_gaps(_long(), ["seed"])).set_index("method")
    assert summary.loc["federaser", "flagged"] == "1 of 2"
    assert summary.loc["federaser", "gap_per_seed"] == "s0: -2.00, s1: -30.00 FLAG"
    assert summary.loc["federaser", "gap_points"] == mean_sd([-2.0, -30.0])
    assert mean_sd([1.0]) == "1.0000"


def test_a_verdict_holds_at_the_seeds_it_held_at():
    rows = pd.DataFrame(
        {
            "seed": [0, 1, 2, 0, 1, 2],
            "method": ["a"] * 3 + ["b"] * 3,
            "verdict": ["indistinguishable from retraining"] * 2
            + ["distinguishable from retraining"]
            + ["distinguishable from retraining"] * 3,
            "backdoor_removed": [True, True, True, True, False, None],
        }
    )
    table = holds(rows).set_index("method")
    assert table.loc["a", "indistinguishable from retraining"] == "holds at 2 of 3 seeds"
    assert table.loc["b", "indistinguishable from retraining"] == "holds at 0 of 3 seeds"
    assert table.loc["b", "backdoor removed"] == "holds at 1 of 2 seeds"
    # a seed whose original never learned the backdoor is named, not counted as removed
    problem = ["", "", "", "", "", "the original did not learn the backdoor"]
    table = holds(rows.assign(backdoor_problem=problem)).set_index("method")
    assert table.loc["b", "backdoor removed"] == (
        "holds at 1 of 2 seeds; not measurable at 1 seed(s)"
    )
    assert table.loc["a", "backdoor removed"] == "holds at 3 of 3 seeds"
    unlearned = rows.assign(backdoor_removed=None, backdoor_problem="never learned")
    assert holds(unlearned).set_index("method").loc["a", "backdoor removed"] == (
        "not measurable at 3 seed(s)"
    )


def test_the_suite_names_refused_points_points_without_a_result_and_flagged_trainings():
    from simulations.benchmarks.suite import points
    from simulations.benchmarks.suite_tables import points_note

    chosen = list(points(["digits"], ["iid"], [0, 1, 2, 3]))
    long = pd.DataFrame(
        [
            {"regime": "short", "dataset": "digits", "partition": "iid", "seed": s,
             "method": "fedavg", "flag": f}
            for s, f in [(0, ""), (2, "training collapsed: final test accuracy 0.0982 ...")]
        ]
    )  # fmt: skip
    refused = {"short/digits-iid-s3": "not measurable: client 3 holds 1 sample(s), fewer than 20"}
    note = points_note(long, chosen, refused)
    assert "Refused (1 of 4 points), never a pass:" in note
    assert "- short/digits-iid-s3: not measurable: client 3 holds 1 sample(s)" in note
    assert "No result (1 of 4 points): short/digits-iid-s1." in note
    assert "short/digits-iid-s2: the original is flagged (training collapsed" in note
    assert "digits-iid-s0" not in note
    assert points_note(long[long["seed"] == 0], chosen[:1]) == ""


def _suite_long():
    rows = []
    for seed, (eraser, eraser_flag, forgot) in enumerate(
        [(0.88, "", "as fedretrain"), (0.5, "30.0 points below fedretrain (flag-gap 5)", "kept part"),
         (0.89, "kept the attack: success 0.3", "kept part")]
    ):  # fmt: skip
        keys = {"regime": "papers", "dataset": "digits", "partition": "shards", "seed": seed}
        rows += [
            {**keys, "method": "fedretrain", "test_accuracy": 0.9, "client_epochs": 100,
             "flag": "", "forgetting": "", "forgot_beyond_keep_training": 40.0},
            {**keys, "method": "federaser", "test_accuracy": eraser, "client_epochs": 25,
             "flag": eraser_flag, "forgetting": forgot,
             "forgot_beyond_keep_training": [30.0, 2.0, -1.0][seed]},
        ]  # fmt: skip
    long = with_gaps(pd.DataFrame(rows), ["regime", "dataset", "partition", "seed"])
    from simulations.benchmarks.suite_tables import flag_kind

    return long.assign(flag_kind=[flag_kind(f) for f in long["flag"]])


def test_the_suites_method_rows_count_flags_by_reason_forgetting_and_keep_training():
    from simulations.benchmarks.suite_tables import by_method

    table = by_method(_suite_long())
    row = table.set_index("method").loc["federaser"]
    assert row["regime"] == "papers"
    assert row["flagged"] == "2 of 3 (1 accuracy, 1 forgetting)"
    assert row["gap shards"] == "-14.33 (worst -40.0)"  # -2, -40, -1
    # over the runs that kept their accuracy: seeds 0 and 2 (seed 1 is 30 points below)
    assert row["forgot as fedretrain"] == "1 of 2"
    assert row["beyond keep-training"] == "1 of 2 (mean +14.5)"
    assert row["client-epochs share"] == "0.25"
    assert list(table["method"]) == ["federaser"]


@pytest.mark.parametrize(
    "flag, kind",
    [("", ""), ("12.7 points below fedretrain (flag-gap 5)", "accuracy"),
     ("kept the attack: success 0.1", "forgetting"), ("forgot nothing: backdoor", "forgetting"),
     ("forgetting not measurable: the target holds 1 sample(s)", "not measurable"),
     ("diverged: round 3", "diverged")],
)  # fmt: skip
def test_a_flag_is_counted_by_its_reason(flag, kind):
    from simulations.benchmarks.suite_tables import flag_kind

    assert flag_kind(flag) == kind


def test_the_pga_stop_table_reads_the_ascent_and_both_backdoor_measures(tmp_path):
    import json

    from simulations.benchmarks.pga_stop import figure, point

    run = tmp_path / "iid-pga-stopratio-seed0"
    run.mkdir()
    pd.DataFrame(
        [
            {
                "method": "fedavg",
                "test_accuracy": 0.984,
                "attack_success": 0.99,
                "client_epochs": 0,
                "flag": "",
            },
            {
                "method": "fedretrain",
                "test_accuracy": 0.98,
                "attack_success": 0.003,
                "client_epochs": 180,
                "flag": "",
            },
            {
                "method": "pga",
                "test_accuracy": 0.95,
                "attack_success": 0.04,
                "client_epochs": 23,
                "flag": "kept the attack: ...",
            },
        ]  # fmt: skip
    ).to_csv(run / "unlearning.csv", index=False)
    details = {"attack_success_after_unlearning": 0.0, "ascent": {"3": {"moved": 2.1}}}
    details["ascent"]["3"]["start_distance2"] = 2.0
    (run / "unlearning_log.jsonl").write_text(json.dumps({"details": {"pga": details}}) + "\n")
    row = point(run, "pga-stop=ratio", "iid", 0)
    assert row["backdoor_before_post"] == 0.0 and row["backdoor_after_post"] == 0.04
    assert row["backdoor_original"] == 0.99 and row["backdoor_fedretrain"] == 0.003
    assert round(row["gap_points"], 6) == -3.0 and round(row["client_epochs_share"], 4) == 0.1278
    assert row["moved"] == 2.1 and row["start_distance2"] == 2.0
    assert row["flag"].startswith("kept the attack")
    figure(pd.DataFrame([row, {**row, "partitioning": "shards"}]), tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_the_scale_matrix_table_reads_each_settings_run(tmp_path):
    from simulations.benchmarks import scale_matrix

    settings = [(1000, 1.0, 2), (10000, 0.1, 2)]
    for (clients, fraction, rounds), peak in zip(settings, (1600.0, 1650.0), strict=True):
        out = scale_matrix.folder(tmp_path, clients, fraction, rounds)
        out.mkdir(parents=True)
        summary = {
            "server_rss_mb_between_rounds_max": 1400.0,
            "server_round_peak_rss_mb_max": peak,
            "federaser_peak_rss_mb": 1500.0,
            "process_tree_peak_rss_mb_sampled": 5000.0,
            "mean_round_wall_seconds_after_round_1": 40.0,
            "mean_seconds_per_update_after_round_1": 0.04,
            "seconds": 300.0,
        }
        (out / "scale_summary.json").write_text(json.dumps(summary))
        pd.DataFrame(
            {
                "round": [1, 2],
                "server_rss_mb": [1390.0, 1400.0],
                "server_round_peak_rss_mb": [peak] * 2,
            }
        ).to_csv(out / "scale.csv", index=False)
    argv = ["--data-root", "x", "--output-dir", str(tmp_path), "--summarize-only", "--settings"]
    assert scale_matrix.main(argv + ["1000:1.0:2", "10000:0.1:2", "100:0.5:1"]) == 0
    table = pd.read_csv(tmp_path / "scale_matrix.csv")
    assert list(table["clients"]) == [1000, 10000]  # the setting that has not run: no row
    assert list(table["peak_over_between"]) == [round(1600 / 1400, 3), round(1650 / 1400, 3)]
    assert list(table["updates_per_round"]) == [1000, 1000]
    assert (tmp_path / "scale_matrix.png").stat().st_size > 0
    assert (tmp_path / "scale_against_k.png").stat().st_size > 0


def test_tiled_mnist_repeats_the_training_images_and_keeps_the_test_set(shared_data, tmp_path):
    import numpy as np

    from simulations.benchmarks.scale import tiled_mnist

    path = tiled_mnist(str(shared_data), 2, tmp_path)
    with np.load(path) as arrays:
        x, y, x_test = arrays["x_train"], arrays["y_train"], arrays["x_test"]
        assert x.shape == (120_000, 28, 28) and y.shape == (120_000,)
        assert (x[:60_000] == x[60_000:]).all() and (y[:60_000] == y[60_000:]).all()
        assert x_test.shape == (10_000, 28, 28) and x.dtype == np.uint8
    assert tiled_mnist(str(shared_data), 2, tmp_path) == path  # written once


def test_the_scale_benchmark_trains_one_tiled_image_a_client(shared_data, tmp_path):
    from simulations.benchmarks import scale

    args = scale.parse_args(
        ["--clients", "70000", "--tile-mnist", "2", "--data-root", str(shared_data)]
        + ["--output-dir", str(tmp_path)]
    )
    root, settings = scale.tiled_settings(args, tmp_path)
    assert root.endswith("mnist_x2.npz") and settings == ["dataset='npz'", "train-samples=70000"]
    with pytest.raises(SystemExit):  # more clients than tiled images
        scale.parse_args(["--clients", "130000", "--tile-mnist", "2", "--data-root", "x"])


def test_the_per_client_costs_name_each_cost_at_the_nodes_asked():
    from simulations.benchmarks.scale_matrix import per_client_costs

    costs = per_client_costs(64, 1)
    assert set(costs["measured_at"]) == {64}
    assert set(costs["cost"]) == {
        "link_state_node_seconds",
        "link_state_node_bytes",
        "node_context_seconds",
        "node_context_bytes",
        "partition_seconds",
        "partition_bytes",
        "engine_pass_seconds_flower",
        "engine_pass_seconds_indexed",
    }
    assert (costs.loc[costs["cost"].str.endswith("seconds"), "per_client"] > 0).all()


@pytest.mark.parametrize("bad", ["1000", "1000:1.5:2", "1:0.5:2", "1000:0.5:zero"])
def test_a_scale_matrix_setting_that_is_not_k_fraction_rounds_is_refused(bad, capsys):
    from simulations.benchmarks import scale_matrix

    with pytest.raises(SystemExit):
        scale_matrix.parse_args(["--data-root", "x", "--output-dir", "o", "--settings", bad])
    assert "--settings" in capsys.readouterr().err


def test_same_models_is_bit_for_bit_and_names_a_difference(tmp_path, capsys):
    import safetensors.torch
    import torch

    from simulations.benchmarks import same_models

    before, after = tmp_path / "before", tmp_path / "after"
    for run in (before, after):
        run.mkdir()
        safetensors.torch.save_file({"w": torch.ones(3)}, run / "model_final.safetensors")
    assert same_models.main([str(before), str(after)]) == 0
    nudged = torch.ones(3)
    nudged[1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))  # one ulp: not identical
    safetensors.torch.save_file({"w": nudged}, after / "model_final.safetensors")
    safetensors.torch.save_file({"w": torch.ones(3)}, before / "model_federaser.safetensors")
    assert same_models.main([str(before), str(after), "--output-dir", str(tmp_path / "t")]) == 1
    table = pd.read_csv(tmp_path / "t" / "same_models.csv").set_index("model")
    assert not table.loc["model_final.safetensors", "identical"]
    assert table.loc["model_federaser.safetensors", "max_abs_difference"] == "missing"


def test_the_suite_plants_the_backdoor_in_the_class_the_target_holds_fewest_of():
    import torch

    from fedunlearn.config import ExperimentConfig
    from fedunlearn.data.federated_data import load_federated_data
    from simulations.benchmarks.suite import points, signal_sets

    point = next(points(["digits"], ["dirichlet-0.1"], [1], ["short"]))
    sets, why = signal_sets(point, None)
    assert why == "" and sets[:2] == ["attack-clients='1'", "attack='backdoor'"]
    config = ExperimentConfig.from_run_config(
        {"dataset": "digits", "num-clients": 10, "partitioning": "dirichlet", "alpha": 0.1,
         "seed": 1, "unlearn-clients": "1"}
    )  # fmt: skip
    counts = torch.bincount(load_federated_data(config).client_split(1).y, minlength=10)
    assert sets[2] == f"attack-target-class={int(torch.argmin(counts))}"
    assert counts[int(torch.argmin(counts))] == counts.min()


def test_the_sensitivity_sweep_runs_the_base_once_and_each_knob_with_its_methods():
    from simulations.benchmarks.sensitivity import BASE, KNOBS, sweep

    chosen = list(sweep(list(KNOBS), ["iid"], [0]))
    labels = [p.label for _, _, p in chosen]
    distinct = set(labels)
    # one base run, reached by every knob; every other value its own run
    assert labels.count("base/digits-iid-s0") == len(KNOBS)
    assert len(distinct) == 1 + sum(len(v) - 1 for v, _ in KNOBS.values())
    for knob, value, point in chosen:
        assert f"{knob}={value}" in point.sets
        methods = next(s for s in point.sets if s.startswith("unlearn-methods=")).split("'")[1]
        expected = KNOBS["local-epochs"][1] if value == BASE[knob] else KNOBS[knob][1]
        assert methods.split(",") == [*expected, "fedretrain", "keep-training"]


def test_a_method_holds_at_a_value_only_when_every_seed_is_unflagged():
    from simulations.benchmarks.sensitivity import holds

    rows = []
    for value, flags in ((1, ["", "x"]), (10, ["", ""])):
        for seed, flag in enumerate(flags):
            rows.append({"method": "federaser", "partition": "iid", "knob": "local-epochs",
                         "value": value, "seed": seed, "flag": flag})  # fmt: skip
    row = holds(pd.DataFrame(rows)).iloc[0]
    assert row["local-epochs"] == "10"


def test_a_partial_sweep_says_nothing_of_the_knobs_it_did_not_run():
    from simulations.benchmarks.sensitivity import holds

    rows = [
        {"method": method, "partition": "iid", "knob": "retain-interval", "value": value,
         "seed": 0, "flag": "" if value < 4 else "x"}
        for method in ("federaser", "keep-training", "fedrecover") for value in (1, 2, 4)
    ]  # fmt: skip
    table = holds(pd.DataFrame(rows))
    assert list(table.columns) == ["method", "partition", "retain-interval"]
    # only the methods the knob is swept for; no "none" for local-epochs, which did not run
    assert table.to_dict("records") == [
        {"method": "federaser", "partition": "iid", "retain-interval": "1, 2"}
    ]


def test_a_benchmark_point_interrupted_before_its_result_is_resumed(tmp_path, monkeypatch):
    from simulations import run as runner
    from simulations.benchmarks.repeat import run_point

    seen = []
    monkeypatch.setattr(runner, "main", lambda argv: seen.append(argv) or 0)
    run_point(tmp_path / "c.toml", tmp_path, "fresh", ["seed=1"])
    assert "resume=true" not in seen[-1]
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_text("{}")
    run_point(tmp_path / "c.toml", tmp_path, "cut", ["seed=1"])
    assert seen[-1][-2:] == ["--set", "resume=true"]
    (tmp_path / "cut" / "unlearning.csv").write_text("method\n")
    run_point(tmp_path / "c.toml", tmp_path, "cut", ["seed=1"])
    assert len(seen) == 2  # a point with a result is not run again


def test_a_benchmark_point_runs_on_the_engine_it_is_given(tmp_path, monkeypatch):
    import argparse

    from simulations import run as runner
    from simulations.benchmarks.repeat import add_run_options, run_point

    parser = argparse.ArgumentParser()
    add_run_options(parser, "results/x")  # the suite's, repeat's and the sweeps' options
    seen = []
    monkeypatch.setattr(runner, "main", lambda argv: seen.append(argv) or 0)
    run_point(tmp_path / "c.toml", tmp_path, "flower", ["seed=1"])
    run_point(tmp_path / "c.toml", tmp_path, "local", ["seed=1"], engine="local")
    assert [argv[argv.index("--engine") + 1] for argv in seen] == ["flower", "local"]
    assert parser.parse_args(["--engine", "local"]).engine == "local"
    assert parser.parse_args([]).engine == "flower"


def _comparison(rows: dict[str, float], **extra) -> pd.DataFrame:
    """A comparison table: method -> test accuracy, client-epochs 10 (FedRetrain 40)."""
    return pd.DataFrame(
        [
            {
                "method": m,
                "test_accuracy": a,
                "client_epochs": 40 if m == "fedretrain" else 10,
                "flag": "",
                **extra,
            }
            for m, a in rows.items()
        ]
    )


def test_a_stacked_repeat_puts_each_members_single_runs_beside_its_stacked_rows(tmp_path):
    from simulations.benchmarks.repeat import summarize_stacked

    stack = pd.concat(
        [
            _comparison({"fedavg": 0.9, "federaser": 0.8, "fedretrain": 0.85}).assign(
                member=m, model_seed=seed
            )
            for m, seed in ((0, 11), (1, 22))
        ]
    )
    stack.loc[(stack["member"] == 1) & (stack["method"] == "fedretrain"), "test_accuracy"] = 0.95
    (tmp_path / "stack").mkdir()
    stack.to_csv(tmp_path / "stack" / "unlearning.csv", index=False)
    for member in (0, 1):
        (tmp_path / f"member-{member}").mkdir()
        single = _comparison({"fedavg": 0.5, "crab": 0.7 + member / 10})
        single.to_csv(tmp_path / f"member-{member}" / "unlearning.csv", index=False)
    summarize_stacked(tmp_path, 2)
    long = pd.read_csv(tmp_path / "seeds.csv")
    # the members' own fedavg rows are the stack's (a single run's duplicate is dropped)
    assert (long["method"] == "fedavg").sum() == 2 and set(long["model_seed"]) == {11, 22}
    crab = long[long["method"] == "crab"].set_index("seed")
    # each member's gap is to its own FedRetrain in the stack (0.85, then 0.95)
    assert crab.loc[0, "gap_points"] == pytest.approx(100 * (0.7 - 0.85))
    assert crab.loc[1, "gap_points"] == pytest.approx(100 * (0.8 - 0.95))
    assert crab.loc[1, "model_seed"] == 22
    assert "crab" in (tmp_path / "seeds.md").read_text()


def test_the_suite_floor_counts_each_regimes_training_and_every_methods_client_epochs(tmp_path):
    from simulations.benchmarks.suite_floor import method_client_epochs, training_client_epochs

    assert training_client_epochs("short") == 10 * 10 * 2
    assert training_client_epochs("papers") == 20 * 10 * 10
    for name, epochs in (("digits-iid-s0", 10), ("digits-iid-s1", 30), ("adult-iid-s0", 1000)):
        (tmp_path / "short" / name).mkdir(parents=True)
        table = _comparison({"fedavg": 0.9, "federaser": 0.8}).assign(client_epochs=[0, epochs])
        table.to_csv(tmp_path / "short" / name / "unlearning.csv", index=False)
    assert method_client_epochs(tmp_path, "short", "digits") == (20.0, 2)
    # a dataset with no point of its own reads the regime's mean over every point
    assert method_client_epochs(tmp_path, "short", "mnist") == (pytest.approx(1040 / 3), 3)
    with pytest.raises(SystemExit, match="papers"):
        method_client_epochs(tmp_path, "papers", "digits")
