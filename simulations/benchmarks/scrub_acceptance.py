"""The scrubbing acceptance readouts from a finished scrubbing run (``fedunlearn-run
simulations/scrub_mnist.toml``): re-measures the relearn time of every saved model at one-step
resolution and checks each acceptance criterion, per method.

    python -m simulations.benchmarks.scrub_acceptance RUN_DIR [--data-root ~/data]

Writes ``scrub_acceptance.csv/.md`` in RUN_DIR and prints them. The run's ``scrubbing.csv`` holds
the errors; this adds a finer relearn readout (every SGD step up to ``--max-epochs``) and the verdicts:
class cohorts: error on D_f >= 90% and other-class test error up <= 5 points; sample cohorts: error
on D_f within 10 points of the retrained model's; relearn time closer to retrain's than finetune's
and negative-gradient's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file

from fedunlearn.config import ExperimentConfig
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.scrubbing.readouts import relearn_time
from fedunlearn.seeding import derive_seed
from fedunlearn.store.run_directory import RunDirectory
from fedunlearn.training.models import build_dataset_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data-root", help="override the run's data root")
    parser.add_argument("--max-epochs", type=float, default=0.1)
    parser.add_argument(
        "--thresholds",
        default="",
        help="D_f loss thresholds for the relearn time, e.g. '0.3,0.1' (default: the run's, and 0.1)",
    )
    args = parser.parse_args(argv)
    run = args.run_dir
    values = json.loads((run / "config.json").read_text())
    if args.data_root:
        values["data-root"] = str(Path(args.data_root).resolve())
    config = ExperimentConfig.from_run_config(values)
    data = load_federated_data(config)
    forget = config.forget_set
    xs, ys, fs = [], [], []
    for p in range(config.num_clients):
        split = data.client_split(p)
        xs.append(split.x)
        ys.append(split.y)
        fs.append(torch.as_tensor(forget.mask(split.y.numpy(), p, config.seed)))
    x, y, f = torch.cat(xs), torch.cat(ys), torch.cat(fs)
    table = pd.read_csv(run / "scrubbing.csv").set_index("method")
    thresholds = [float(t) for t in args.thresholds.split(",") if t] or sorted(
        {config.scrub_relearn_threshold, 0.1}, reverse=True
    )
    rows = []
    for method in table.index:
        name = "model_final" if method == "original" else f"model_scrub_{method}"
        model = build_dataset_model(
            config.model, config.dataset, data.splits.input_shape, data.splits.num_classes
        )
        model.load_state_dict(load_file(run / f"{name}.safetensors"))
        relearn = relearn_time(
            model,
            x,
            y,
            x[f],
            y[f],
            threshold=min(thresholds),
            lr=config.lr,
            momentum=config.momentum,
            batch_size=config.batch_size,
            max_epochs=args.max_epochs,
            check_every=1,
            seed=derive_seed(config.seed, "relearn"),
        )
        # one run to the lowest threshold; the curve (every step) gives the others
        row = {"method": method}
        for threshold in thresholds:
            steps = next((step for step, loss in relearn.curve if loss <= threshold), None)
            row[f"relearn_steps@{threshold:g}"] = float("nan") if steps is None else steps
        rows.append(row)
        print(f"{method}: {row}", flush=True)
    out = pd.DataFrame(rows).set_index("method")
    out["error_f"] = table["error_f"]
    base = table.loc["original"]
    if forget.is_class:
        out["other_class_error_up_points"] = 100 * (
            table["error_test_other"] - base["error_test_other"]
        )
        out["meets_class_criterion"] = (out["error_f"] >= 0.9) & (
            out["other_class_error_up_points"] <= 5
        )
    else:
        out["error_f_gap_points"] = 100 * (out["error_f"] - out.loc["retrain", "error_f"]).abs()
        out["meets_sample_criterion"] = out["error_f_gap_points"] <= 10
    for threshold in thresholds:
        column = f"relearn_steps@{threshold:g}"
        gap = (out[column] - out.loc["retrain", column]).abs()
        out[f"relearn_gap@{threshold:g}"] = gap
        closest_baseline = min(gap[m] for m in ("finetune", "negative-gradient") if m in gap.index)
        out[f"relearn_closer_than_baselines@{threshold:g}"] = gap < closest_baseline
    out = out.reset_index()
    RunDirectory(run).write_table("scrub_acceptance", out, floatfmt=".4g")  # 0600, atomic
    print(out.to_markdown(index=False, floatfmt=".4g"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
