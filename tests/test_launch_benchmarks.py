"""The launch benchmarks read a run's output as it is: started once the run directory is printed,
finished on exit 0 with the results line, one retry per "trying again" line; the load generator
stops every process it started."""

from __future__ import annotations

import argparse
import os
import sys

from simulations.benchmarks import launch_speed, launch_under_load, load


def _args(tmp_path, script: str) -> argparse.Namespace:
    launcher = tmp_path / "fake-launcher"
    launcher.write_text(f"#!{sys.executable}\n{script}")
    launcher.chmod(0o755)
    return argparse.Namespace(
        wrap="", launcher=str(launcher), config=tmp_path / "c.toml", output_dir=tmp_path, runs=1
    )


def test_a_run_that_was_retried_then_finished_is_counted_so(tmp_path):
    script = (
        "print('fedunlearn-run: the local SuperLink did not start; trying again (attempt 2 of at most 4)')\n"
        "print('[fedunlearn] run directory: /x/digits-1')\n"
        "print('[fedunlearn] results in /x/digits-1')\n"
    )
    row = launch_under_load.one_run(_args(tmp_path, script), 1)
    assert (row["started"], row["finished"], row["retries"], row["exit_code"]) == (True, True, 1, 0)


def test_a_run_that_gave_up_neither_started_nor_finished(tmp_path):
    script = "import sys\nprint('fedunlearn-run: error: the local SuperLink did not start')\nsys.exit(75)\n"
    args = _args(tmp_path, script)
    row = launch_under_load.one_run(args, 1)
    assert (row["started"], row["finished"], row["exit_code"]) == (False, False, 75)
    args.load, args.nice = 8, 0
    assert "0 of 1 started, 0 of 1 finished" in launch_under_load.write_tables([row], args)


def test_the_speed_table_has_a_row_per_command_and_checkout():
    rows = [
        {"command": "a", "checkout": c, "seconds": s, "exit": 2, "imported": i}
        for c, s, i in (("baseline", 1.5, "torch"), ("this", 0.1, ""), ("this", 0.2, ""))
    ]
    table = launch_speed.summary(rows)
    assert "| `a` | baseline | 1.50 | 1.50 | 2 | torch |" in table
    assert "| `a` | this | 0.15 | 0.10 | 2 | none of them |" in table


def test_the_load_generator_stops_every_process_it_started():
    with load.busy(2) as pids:
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{pid}") for pid in pids)
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as stat:  # a zombie at most, never a running spinner
            assert stat.read().split()[2] == "Z"


def test_the_start_cost_phases_end_at_their_lines_and_a_missing_line_ends_the_count():
    from simulations.benchmarks import start_cost

    lines = [
        (1.0, "fedunlearn-run: flwr run /app --stream"),
        (3.0, "Successfully started run 42"),
        (4.5, "INFO :      Starting Flower Simulation"),
        (9.0, "[fedunlearn] run directory: /x/digits-1"),
        (9.5, "[fedunlearn] round 1/20  test accuracy 0.9"),
        (20.0, "[fedunlearn] trained in 10s: final test accuracy 0.98; results in /x/digits-1"),
        (30.0, "[fedunlearn] results in /x/digits-1"),
    ]
    times = start_cost.phase_times(lines, 33.0)
    assert times["check"] == 1.0 and times["ray+serverapp"] == 4.5 and times["round 1"] == 0.5
    assert times["unlearning"] == 10.0 and times["shutdown"] == 3.0
    assert (times["to round 1"], times["total"]) == (9.5, 33.0)
    failed = start_cost.phase_times(lines[:3], 5.0)
    assert set(failed) == {"check", "superlink+submit", "simulation start", "total"}


def test_the_start_cost_compares_models_by_their_tensors_not_their_files(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from simulations.benchmarks import start_cost

    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    for run, name in (("a", "run-a"), ("b", "run-b")):
        (tmp_path / run / name).mkdir(parents=True)
        save_file(weights, tmp_path / run / name / "model_final.safetensors", {"run": name})
    first, second = (start_cost.model_hashes(tmp_path / run) for run in ("a", "b"))
    assert first == second and set(first) == {"model_final.safetensors"}
    changed = {"w": weights["w"] + np.float32(1e-7)}
    save_file(changed, tmp_path / "b" / "run-b" / "model_final.safetensors")
    assert start_cost.model_hashes(tmp_path / "b") != first
