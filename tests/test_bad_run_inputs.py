"""Hundreds of bad run configurations through ``fedunlearn-run --dry-run``: each one exits 2 with an
error naming its key, before any file is written and before any federation is started.

Every case runs ``simulations.run.main`` in-process in a sandbox (its own HOME, working directory and
output-dir), with everything that could start Flower replaced by a recorder that fails the test; the
sandbox is snapshotted before and after. A few good configurations must still pass, so the table
cannot pass by refusing everything.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from flwr.common.config import parse_config_args

from fedunlearn.config import ExperimentConfig, parameter_table
from fedunlearn.store.run_directory import RunDirectory
from fedunlearn.store.update_store import UpdateStore
from simulations import run as runner

# ----------------------------------------------------------------------------- the sandbox


@dataclass
class Sandbox:
    root: Path
    home: Path
    work: Path
    out: Path
    launched: list
    temporary: list

    def format(self, text: str) -> str:
        for name in ("out", "home", "root", "work"):
            text = text.replace("{" + name + "}", str(getattr(self, name)))
        return text

    def snapshot(self) -> dict[str, tuple]:
        found = {}
        for path in sorted(self.root.rglob("*")):
            stat = path.lstat()
            found[str(path.relative_to(self.root))] = (stat.st_mode, stat.st_size, stat.st_mtime_ns)
        return found


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """HOME, the working directory and output-dir under ``tmp_path``; Flower cannot be started."""
    # Matplotlib lists the system's fonts once per process (it runs fc-list) into HOME's cache: let
    # it do so before HOME moves and Popen is refused, whichever test of a worker comes first.
    import matplotlib.font_manager  # noqa: F401

    box = Sandbox(tmp_path, tmp_path / "home", tmp_path / "work", tmp_path / "out", [], [])
    box.home.mkdir()
    box.work.mkdir()
    monkeypatch.setenv("HOME", str(box.home))
    monkeypatch.delenv("FLWR_HOME", raising=False)
    monkeypatch.chdir(box.work)

    def refuse(*args, **kwargs):
        box.launched.append(args)
        raise AssertionError(f"nothing may be started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    monkeypatch.setattr(runner, "_run_status", refuse)
    real_temporary_directory = tempfile.TemporaryDirectory

    def temporary_directory(*args, **kwargs):
        made = real_temporary_directory(*args, **kwargs)
        box.temporary.append(Path(made.name))
        return made

    monkeypatch.setattr(runner.tempfile, "TemporaryDirectory", temporary_directory)
    return box


def _run(box: Sandbox, argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = runner.main([box.format(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------- setups


def _finished_run(box: Sandbox, name: str = "done", forgotten=((1,),), **values) -> Path:
    """A run directory whose training finished (files as the server leaves them; models are tiny
    stand-ins, sealed as the server seals them: the launcher checks every record of the run)."""
    config = ExperimentConfig.from_run_config(
        {"output-dir": str(box.out), "run-name": name, "num-clients": 4, **values}
    )
    path = config.run_directory()
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config.to_run_config()))
    for name_ in ("model_initial", "model_final"):  # tiny, but sealed: the launcher checks them
        RunDirectory(path).save_model(name_, {"w": torch.zeros(2)})
    (path / "metrics.csv").write_text("round,test_accuracy\n0,0.1\n")
    (path / "summary.json").write_text("{}")
    lines = [json.dumps({"targets": list(t), "methods": ["federaser"]}) for t in forgotten]
    (path / "unlearning_log.jsonl").write_text("".join(line + "\n" for line in lines))
    adopted = [json.dumps({"request": n, "targets": list(t)}) for n, t in enumerate(forgotten, 1)]
    (path / "history_log.jsonl").write_text("".join(line + "\n" for line in adopted))
    if forgotten:  # the adopted FedEraser trajectory: its Δt rounds, the remaining clients
        with UpdateStore(path / "store") as store:
            for t in (1, 3):
                updates = {k: ({"w": torch.ones(2)}, 5) for k in (2, 3)}
                store.write_round(t, {"w": torch.zeros(2)}, updates)
    return path


def _setup_existing_run(box):
    (box.out / "taken").mkdir(parents=True)
    (box.out / "taken" / "metrics.csv").write_text("round\n")


def _setup_unfinished_run(box):
    path = _finished_run(box, "half")
    (path / "model_final.safetensors").unlink()
    (path / "summary.json").unlink()


def _setup_bad_log(box):
    path = _finished_run(box)
    (path / "unlearning_log.jsonl").write_text('{"targets": [1]}\nnot json\n')


def _setup_bad_saved_config(box):
    path = _finished_run(box)
    (path / "config.json").write_text("[1, 2")


def _setup_resume_without_config(box):
    (box.out / "stray").mkdir(parents=True)
    (box.out / "stray" / "notes.txt").write_text("mine")


def _setup_resume_started(box):
    config = ExperimentConfig.from_run_config(
        {"output-dir": str(box.out), "run-name": "started", "rounds": 5}
    )
    config.run_directory().mkdir(parents=True)
    (config.run_directory() / "config.json").write_text(json.dumps(config.to_run_config()))


def _setup_output_file(box):
    box.out.parent.mkdir(parents=True, exist_ok=True)
    box.out.write_text("a file, not a folder")


def _setup_run_dir_file(box):
    box.out.mkdir(parents=True)
    (box.out / "plain").write_text("a file")


def _setup_empty_data_root(box):
    (box.root / "data").mkdir()


def _setup_config_files(box):
    (box.root / "nested.toml").write_text("[tool]\nrounds = 2\n")
    (box.root / "broken.toml").write_text("rounds = = 2\n")
    (box.root / "latin1.toml").write_bytes("run-name = 'J\xfcrgen'\n".encode("latin-1"))
    (box.root / "bad-value.toml").write_text("seed = -1\nrounds = 3\n")
    (box.root / "emoji.toml").write_text('run-name = "party-\U0001f389"\n', encoding="utf-8")


SETUPS = {
    "existing-run": _setup_existing_run,
    "finished-run": lambda box: _finished_run(box),
    "finished-run-8": lambda box: _finished_run(box, forgotten=((0, 1),)),
    "unfinished-run": _setup_unfinished_run,
    "bad-log": _setup_bad_log,
    "bad-saved-config": _setup_bad_saved_config,
    "retain-off-run": lambda box: _finished_run(
        box, retain=False, **{"unlearn-methods": "fedretrain"}
    ),
    "resume-without-config": _setup_resume_without_config,
    "resume-started": _setup_resume_started,
    "output-file": _setup_output_file,
    "run-dir-file": _setup_run_dir_file,
    "empty-data-root": _setup_empty_data_root,
    "config-files": _setup_config_files,
}

# ----------------------------------------------------------------------------- the table


def _set(*assignments: str) -> list[str]:
    return [x for a in assignments for x in ("--set", a)]


#: The main job's K (simulations/digits.toml). The checks that need K run in the launcher only when
#: it is set; with num-clients = 0 the server runs them once it adopted the federation's size.
K10 = "num-clients=10"


def _generic_cases():
    """Every key of the table (a registered method's own too) gets values of the wrong type, and
    numbers that are not finite or not whole."""
    bad = {
        bool: ["1", "0", "'yes'", "0.5"],
        int: ["5.0", "1e9", "true", "'many'", "[1]", str(2**63), str(-(2**63) - 1)],
        float: ["nan", "inf", "-inf", "true", "'fast'", "'nan'", "[1.0]"],
        str: ["[1]", "true", "{a=1}"],
    }
    for row in parameter_table():
        key = row.key
        for value in bad[row.kind]:
            yield pytest.param(_set(f"{key}={value}"), key, None, id=f"{key}={value}")
    for key in ENUM_KEYS:  # empty, and a near miss in case and spacing
        for value in ("''", "' '", "'AUTO'", "'x,y'"):
            yield pytest.param(_set(f"{key}={value}"), key, None, id=f"{key}={value}")


ENUM_KEYS = (
    "dataset",
    "model",
    "partitioning",
    "store-dtype",
    "device",
    "calibration-order",
    "unlearn-adopt",
    "certified-loss",
    "certified-noise",
    "certified-mode",
    "certified-bound",
    "certified-gamma",
)


# (id, argv, key named in the error, setup)
SPECIFIC = [
    # ---- the adversarial review's list
    ("emoji-run-name", _set("run-name='party-\U0001f389'"), "run-name", None),
    ("emoji-run-name-file", ["{root}/emoji.toml"], "run-name", "config-files"),
    ("emoji-output-dir", _set("output-dir='{root}/runs-\U0001f389'"), "output-dir", None),
    ("emoji-output-dir-flag", ["--output-dir", "{root}/\U0001f600"], "output-dir", None),
    ("seed-negative", _set("seed=-1"), "seed", None),
    ("seed-2^32", _set(f"seed={2**32}"), "seed", None),
    ("seed-in-config-file", ["{root}/bad-value.toml"], "seed", "config-files"),
    ("certified-delta-0", _set("certified-delta=0"), "certified-delta", None),
    (
        "certified-delta-0-head",
        _set("certified-head=true", "certified-delta=0.0"),
        "certified-delta",
        None,
    ),
    ("mnist-cnn-on-digits", _set("model='mnist-cnn'"), "model", None),
    ("cifar10-cnn-on-digits", _set("model='cifar10-cnn'"), "model", None),
    ("adult-mlp-on-digits", _set("model='adult-mlp'"), "model", None),
    ("num-clients-100000", _set("num-clients=100000"), "num-clients", None),
    ("num-clients-beyond-digits", _set("num-clients=2000"), "num-clients", None),
    ("train-samples-beyond", _set(K10, "train-samples=5000"), "train-samples", None),
    ("train-samples-1348", _set(K10, "train-samples=1348"), "train-samples", None),
    ("scrub-class-99", _set(K10, "scrub=true", "scrub-forget='class:99'"), "scrub-forget", None),
    (
        "scrub-more-than-held",
        _set(K10, "scrub=true", "scrub-forget='samples:0:500'"),
        "scrub-forget",
        None,
    ),
    (
        "scrub-class-more-than-held",
        _set(K10, "scrub=true", "scrub-forget='samples:0:500:5'"),
        "scrub-forget",
        None,
    ),
    ("nul-run-name", ["--set", "run-name=a\x00b"], "run-name", None),
    ("nul-run-name-escaped", _set('run-name="a\\u0000b"'), "run-name", None),
    (
        "certified-removals-1e9",
        _set("certified-head=true", "certified-removals=1e9"),
        "certified-removals",
        None,
    ),
    (
        "certified-removals-10^9",
        _set(K10, "certified-head=true", "certified-removals=1000000000"),
        "certified-removals",
        None,
    ),
    (
        "certified-removals-whole-pool",
        _set(K10, "certified-head=true", "certified-removals=1347"),
        "certified-removals",
        None,
    ),
    (
        "certified-removals-pool-after-clients",
        _set(K10, "certified-head=true", "certified-remove-clients='0'", "certified-removals=1300"),
        "certified-removals",
        None,
    ),
    ("dry-run-existing-run", _set("run-name='taken'"), "run-name", "existing-run"),
    (
        "dry-run-already-forgotten",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='1'", "num-clients=4"),
        "unlearn-clients",
        "finished-run",
    ),
    (
        "dry-run-partly-forgotten",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='1,2'", "num-clients=4"),
        "unlearn-clients",
        "finished-run",
    ),
    # ---- run directories
    (
        "unlearn-only-missing-run",
        _set("run-name='ghost'", "unlearn-only=true", "unlearn-clients='1'"),
        "run-name",
        None,
    ),
    (
        "unlearn-only-unfinished",
        _set("run-name='half'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=4"),
        "run-name",
        "unfinished-run",
    ),
    (
        "unlearn-only-other-num-clients",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=10"),
        "num-clients",
        "finished-run",
    ),
    (
        "unlearn-only-other-seed",
        _set(
            "run-name='done'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=4", "seed=1"
        ),
        "seed",
        "finished-run",
    ),
    (
        "unlearn-only-other-partitioning",
        _set(
            "run-name='done'",
            "unlearn-only=true",
            "unlearn-clients='2'",
            "num-clients=4",
            "partitioning='shards'",
        ),
        "partitioning",
        "finished-run",
    ),
    (
        "unlearn-only-nobody-left",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2,3'", "num-clients=4"),
        "unlearn-clients",
        "finished-run-8",
    ),
    (
        "unlearn-only-bad-log",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=4"),
        "run-name",
        "bad-log",
    ),
    (
        "unlearn-only-bad-saved-config",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=4"),
        "run-name",
        "bad-saved-config",
    ),
    (
        "unlearn-only-federaser-without-retention",
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=4"),
        "retain",
        "retain-off-run",
    ),
    (
        "resume-stray-folder",
        _set("run-name='stray'", "resume=true"),
        "run-name",
        "resume-without-config",
    ),
    (
        "resume-other-rounds",
        _set("run-name='started'", "resume=true", "rounds=7"),
        "rounds",
        "resume-started",
    ),
    ("output-dir-is-a-file", [], "output-dir", "output-file"),
    ("run-dir-is-a-file", _set("run-name='plain'"), "run-name", "run-dir-file"),
    # ---- data
    (
        "mnist-without-files",
        _set("dataset='mnist'", "data-root='{root}/data'"),
        "data-root",
        "empty-data-root",
    ),
    (
        "mnist-missing-root",
        _set("dataset='mnist'", "data-root='{root}/nowhere'"),
        "data-root",
        None,
    ),
    ("mnist-without-root", _set("dataset='mnist'"), "data-root", None),
    (
        "adult-without-files",
        _set("dataset='adult'", "data-root='{root}/data'"),
        "data-root",
        "empty-data-root",
    ),
    (
        "cifar10-without-files",
        _set("dataset='cifar10'", "data-root='{root}/data'"),
        "data-root",
        "empty-data-root",
    ),
    (
        "dirichlet-starves-clients",
        _set("partitioning='dirichlet'", "alpha=0.001", "num-clients=600"),
        ("alpha", "num-clients"),
        None,
    ),
    (
        "shards-too-many",
        _set(K10, "partitioning='shards'", "shards-per-client=200"),
        "shards-per-client",
        None,
    ),
    (
        "shards-too-many-subset",
        _set(K10, "partitioning='shards'", "shards-per-client=40", "train-samples=300"),
        "shards-per-client",
        None,
    ),
    (
        "num-clients-beyond-subset",
        _set("train-samples=20", "num-clients=30"),
        "train-samples",
        None,
    ),
    (
        "scrub-client-absent",
        _set(K10, "scrub=true", "scrub-forget='client:10'"),
        "scrub-forget",
        None,
    ),
    ("scrub-zero-samples", _set("scrub=true", "scrub-forget='samples:0:0'"), "scrub-forget", None),
    ("scrub-no-cohort", _set("scrub=true"), "scrub-forget", None),
    ("scrub-malformed", _set("scrub=true", "scrub-forget='row:1'"), "scrub-forget", None),
    ("scrub-negative-class", _set("scrub=true", "scrub-forget='class:-1'"), "scrub-forget", None),
    (
        "scrub-class-absent-from-client",
        _set(K10, "scrub=true", "scrub-forget='samples:0:1:10'"),
        "scrub-forget",
        None,
    ),
    (
        "scrub-everything",
        _set(
            "scrub=true",
            "scrub-forget='class:0'",
            "num-clients=2",
            "partitioning='shards'",
            "shards-per-client=1",
            "train-samples=2",
        ),
        ("scrub-forget", "train-samples"),
        None,
    ),
    # ---- ranges
    ("num-clients-negative", _set("num-clients=-1"), "num-clients", None),
    ("num-clients-1000001", _set("num-clients=1000001"), "num-clients", None),
    ("train-samples-negative", _set("train-samples=-1"), "train-samples", None),
    ("train-samples-below-clients", _set(K10, "train-samples=5"), "train-samples", None),
    ("shards-per-client-0", _set("shards-per-client=0"), "shards-per-client", None),
    ("alpha-0", _set("alpha=0"), "alpha", None),
    ("alpha-negative", _set("alpha=-0.5"), "alpha", None),
    ("alpha-huge", _set("alpha=1e308"), "alpha", None),
    ("rounds-0", _set("rounds=0"), "rounds", None),
    ("local-epochs-0", _set("local-epochs=0"), "local-epochs", None),
    ("batch-size-0", _set("batch-size=0"), "batch-size", None),
    ("retain-interval-0", _set("retain-interval=0"), "retain-interval", None),
    ("lr-0", _set("lr=0"), "lr", None),
    ("lr-negative", _set("lr=-0.1"), "lr", None),
    ("momentum-1", _set("momentum=1.0"), "momentum", None),
    ("momentum-negative", _set("momentum=-0.1"), "momentum", None),
    ("weight-decay-negative", _set("weight-decay=-1e-4"), "weight-decay", None),
    ("fraction-evaluate-1.5", _set("fraction-evaluate=1.5"), "fraction-evaluate", None),
    ("fraction-evaluate-negative", _set("fraction-evaluate=-0.1"), "fraction-evaluate", None),
    ("node-wait-seconds-0", _set("node-wait-seconds=0"), "node-wait-seconds", None),
    ("calibration-ratio-0", _set("calibration-ratio=0"), "calibration-ratio", None),
    ("calibration-ratio-1.5", _set("calibration-ratio=1.5"), "calibration-ratio", None),
    ("max-refusals-0", _set("max-refusals=0"), "max-refusals", None),
    ("min-reply-fraction-0", _set("min-reply-fraction=0"), "min-reply-fraction", None),
    ("min-reply-fraction-1.01", _set("min-reply-fraction=1.01"), "min-reply-fraction", None),
    ("certified-lambda-0", _set("certified-lambda=0"), "certified-lambda", None),
    ("certified-sigma-0", _set("certified-sigma=0"), "certified-sigma", None),
    ("certified-epsilon-0", _set("certified-epsilon=0"), "certified-epsilon", None),
    ("certified-delta-1", _set("certified-delta=1"), "certified-delta", None),
    ("certified-delta-negative", _set("certified-delta=-1e-4"), "certified-delta", None),
    (
        "certified-refresh-ratio-0",
        _set("certified-refresh-ratio=0"),
        "certified-refresh-ratio",
        None,
    ),
    ("certified-removals-negative", _set("certified-removals=-1"), "certified-removals", None),
    ("certified-eval-every-0", _set("certified-eval-every=0"), "certified-eval-every", None),
    ("dp-noise-multiplier-negative", _set("dp-noise-multiplier=-1"), "dp-noise-multiplier", None),
    ("dp-clipping-norm-0", _set("dp-clipping-norm=0"), "dp-clipping-norm", None),
    ("dp-delta-1", _set("dp-delta=1"), "dp-delta", None),
    ("dp-delta-negative", _set("dp-delta=-0.5"), "dp-delta", None),
    ("scrub-newton-lambda-0", _set("scrub-newton-lambda=0"), "scrub-newton-lambda", None),
    ("scrub-fisher-lambda-0", _set("scrub-fisher-lambda=0"), "scrub-fisher-lambda", None),
    (
        "scrub-fisher-sqrt-lambda-0",
        _set("scrub-fisher-sqrt-lambda=0"),
        "scrub-fisher-sqrt-lambda",
        None,
    ),
    (
        "scrub-fisher-reference-lambda-neg",
        _set("scrub-fisher-reference-lambda=-1"),
        "scrub-fisher-reference-lambda",
        None,
    ),
    ("scrub-sigma-h-0", _set("scrub-sigma-h=0"), "scrub-sigma-h", None),
    ("scrub-damping-negative", _set("scrub-damping=-1"), "scrub-damping", None),
    ("scrub-fisher-floor-negative", _set("scrub-fisher-floor=-1"), "scrub-fisher-floor", None),
    ("scrub-fisher-samples-0", _set("scrub-fisher-samples=0"), "scrub-fisher-samples", None),
    ("scrub-time-negative", _set("scrub-time=-1"), "scrub-time", None),
    ("scrub-baseline-rounds-0", _set("scrub-baseline-rounds=0"), "scrub-baseline-rounds", None),
    ("scrub-baseline-epochs-0", _set("scrub-baseline-epochs=0"), "scrub-baseline-epochs", None),
    (
        "scrub-relearn-threshold-0",
        _set("scrub-relearn-threshold=0"),
        "scrub-relearn-threshold",
        None,
    ),
    ("scrub-relearn-epochs-0", _set("scrub-relearn-epochs=0"), "scrub-relearn-epochs", None),
    ("mia-reference-models-1", _set("mia-reference-models=1"), "mia-reference-models", None),
    # ---- enums and text
    ("dataset-unknown", _set("dataset='imagenet'"), "dataset", None),
    ("dataset-empty", _set("dataset=''"), "dataset", None),
    ("dataset-case", _set("dataset='Digits'"), "dataset", None),
    ("model-unknown", _set("model='resnet'"), "model", None),
    ("partitioning-unknown", _set("partitioning='random'"), "partitioning", None),
    ("store-dtype-unknown", _set("store-dtype='bfloat16'"), "store-dtype", None),
    ("device-unknown", _set("device='tpu'"), "device", None),
    ("calibration-order-unknown", _set("calibration-order='random'"), "calibration-order", None),
    ("unlearn-adopt-unknown", _set("unlearn-adopt='magic'"), "unlearn-adopt", None),
    ("unlearn-adopt-fedaccum", _set("unlearn-adopt='fedaccum'"), "unlearn-adopt", None),
    ("certified-loss-unknown", _set("certified-loss='hinge'"), "certified-loss", None),
    ("certified-noise-unknown", _set("certified-noise='laplace'"), "certified-noise", None),
    ("certified-mode-unknown", _set("certified-mode='slow'"), "certified-mode", None),
    ("certified-bound-unknown", _set("certified-bound='x'"), "certified-bound", None),
    ("certified-gamma-unknown", _set("certified-gamma='x'"), "certified-gamma", None),
    ("unlearn-methods-unknown", _set("unlearn-methods='federaser,magic'"), "unlearn-methods", None),
    ("unlearn-methods-empty", _set("unlearn-methods=''"), "unlearn-methods", None),
    ("scrub-methods-unknown", _set("scrub-methods='newton,foo'"), "scrub-methods", None),
    ("scrub-lambda-factors-text", _set("scrub-lambda-factors='a,b'"), "scrub-lambda-factors", None),
    ("scrub-lambda-factors-zero", _set("scrub-lambda-factors='0,1'"), "scrub-lambda-factors", None),
    ("scrub-lambda-factors-nan", _set("scrub-lambda-factors='nan'"), "scrub-lambda-factors", None),
    (
        "scrub-lambda-factors-inf",
        _set("scrub-lambda-factors='1,inf'"),
        "scrub-lambda-factors",
        None,
    ),
    ("unlearn-clients-text", _set("unlearn-clients='x'"), "unlearn-clients", None),
    ("unlearn-clients-out-of-range", _set(K10, "unlearn-clients='10'"), "unlearn-clients", None),
    ("unlearn-clients-negative", _set("unlearn-clients='-1'"), "unlearn-clients", None),
    ("unlearn-clients-float", _set("unlearn-clients=1.5"), "unlearn-clients", None),
    (
        "unlearn-clients-everyone",
        _set(K10, "unlearn-clients='0,1,2,3,4,5,6,7,8,9'"),
        "unlearn-clients",
        None,
    ),
    (
        "certified-remove-clients-out",
        _set(K10, "certified-remove-clients='12'"),
        "certified-remove-clients",
        None,
    ),
    (
        "certified-remove-clients-all",
        _set("num-clients=2", "unlearn-clients='0'", "certified-remove-clients='0,1'"),
        "certified-remove-clients",
        None,
    ),
    ("run-name-hidden", _set("run-name='.hidden'"), "run-name", None),
    ("run-name-option", _set("run-name='-rf'"), "run-name", None),
    ("run-name-slash", _set("run-name='a/b'"), "run-name", None),
    ("run-name-dotdot", _set("run-name='..'"), "run-name", None),
    ("run-name-space", _set("run-name='a b'"), "run-name", None),
    ("run-name-newline", _set('run-name="a\\nb"'), "run-name", None),
    ("run-name-trailing-newline", _set('run-name="ab\\n"'), "run-name", None),
    ("run-name-101", _set("run-name='" + "r" * 101 + "'"), "run-name", None),
    ("run-name-non-ascii", _set("run-name='j\u00fcrgen'"), "run-name", None),
    ("run-name-rtl-override", _set("run-name='a\u202eb'"), "run-name", None),
    ("output-dir-empty", _set("output-dir=''"), "output-dir", None),
    ("output-dir-nul", ["--set", "output-dir={root}/a\x00b"], "output-dir", None),
    ("output-dir-newline", _set('output-dir="{root}/a\\nb"'), "output-dir", None),
    ("output-dir-tab", _set('output-dir="{root}/a\\tb"'), "output-dir", None),
    ("output-dir-escape", _set('output-dir="{root}/a\\u001bb"'), "output-dir", None),
    ("output-dir-zero-width-joiner", _set("output-dir='{root}/a\u200db'"), "output-dir", None),
    ("output-dir-bidi", _set("output-dir='{root}/a\u202eb'"), "output-dir", None),
    ("output-dir-variation-selector", _set("output-dir='{root}/a\ufe0f'"), "output-dir", None),
    ("output-dir-flag-emoji", _set("output-dir='{root}/\U0001f1e9\U0001f1ea'"), "output-dir", None),
    ("output-dir-skin-tone", _set("output-dir='{root}/x\U0001f3fd'"), "output-dir", None),
    ("output-dir-private-use", _set("output-dir='{root}/\ue000'"), "output-dir", None),
    ("output-dir-line-separator", _set("output-dir='{root}/a\u2028b'"), "output-dir", None),
    ("output-dir-too-long", _set("output-dir='{root}/" + "d/" * 1600 + "'"), "output-dir", None),
    ("output-dir-long-name", _set("output-dir='{root}/" + "n" * 256 + "'"), "output-dir", None),
    ("data-root-emoji", _set("data-root='{root}/\U0001f4be'"), "data-root", None),
    ("data-root-nul", ["--data-root", "{root}/d\x00"], "data-root", None),
    # ---- keys against each other
    ("mia-two-targets", _set("mia=true", "unlearn-clients='0,1'"), "unlearn-clients", None),
    ("mia-no-target", _set("mia=true", "unlearn-clients=''"), "unlearn-clients", None),
    (
        "mia-without-fedretrain",
        _set("mia=true", "unlearn-methods='federaser,fedaccum'"),
        "unlearn-methods",
        None,
    ),
    (
        "mia-other-scrub-cohort",
        _set("mia=true", "scrub=true", "scrub-forget='client:3'"),
        "scrub-forget",
        None,
    ),
    (
        "mia-certified-other-client",
        _set("mia=true", "certified-head=true", "certified-remove-clients='2'"),
        "certified-remove-clients",
        None,
    ),
    (
        "adopt-not-among-methods",
        _set("unlearn-adopt='federaser'", "unlearn-methods='fedretrain'"),
        "unlearn-adopt",
        None,
    ),
    ("no-adoptable-method", _set("unlearn-methods='fedaccum'"), "unlearn-methods", None),
    (
        "unlearn-only-resume-of-no-run",
        _set("resume=true", "unlearn-only=true", "run-name='r'", "unlearn-clients='1'"),
        "run-name",
        None,
    ),
    ("resume-without-run-name", _set("resume=true"), "resume", None),
    ("unlearn-only-without-run-name", _set("unlearn-only=true"), "unlearn-only", None),
    (
        "unlearn-only-without-targets",
        _set("unlearn-only=true", "run-name='r'", "unlearn-clients=''"),
        "unlearn-only",
        None,
    ),
    ("retain-off-with-federaser", _set("retain=false"), "retain", None),
    ("dp-without-delta", _set("dp-noise-multiplier=1.0", "dp-delta=0"), "dp-delta", None),
    ("noise-none-logistic", _set("certified-noise='none'"), "certified-noise", None),
    (
        "two-targets-of-two-clients",
        _set("num-clients=2", "unlearn-clients='0,1'"),
        "unlearn-clients",
        None,
    ),
    # ---- the launcher's own input
    ("unknown-key", _set("colour=1"), "run-config", None),
    ("typo-key", _set("retain-intervall=2"), "run-config", None),
    ("set-without-equals", ["--set", "rounds"], "--set", None),
    ("num-gpus-2", ["--num-gpus", "2"], "--num-gpus", None),
    ("num-gpus-nan", ["--num-gpus", "nan"], "--num-gpus", None),
    ("num-cpus-0", ["--num-cpus", "0"], "--num-cpus", None),
    ("num-cpus-nan", ["--num-cpus", "nan"], "--num-cpus", None),
    ("num-cpus-inf", ["--num-cpus", "inf"], "--num-cpus", None),
    ("num-cpus-half", ["--num-cpus", "0.5"], "--num-cpus", None),
    ("app-without-pyproject", ["--app", "{root}"], "--app", None),
    ("config-file-missing", ["{root}/absent.toml"], "config", None),
    ("config-file-nested", ["{root}/nested.toml"], "config", "config-files"),
    ("config-file-broken", ["{root}/broken.toml"], "config", "config-files"),
    ("config-file-not-utf8", ["{root}/latin1.toml"], "config", "config-files"),
]


def _specific_cases():
    for name, argv, key, setup in SPECIFIC:
        yield pytest.param(argv, key, setup, id=name)


BAD = [*_generic_cases(), *_specific_cases()]


def test_the_table_is_large_and_covers_every_key():
    assert len(BAD) >= 150
    named = {p.values[1] for p in BAD if isinstance(p.values[1], str)}
    assert set(ExperimentConfig.keys()) <= named


@pytest.mark.parametrize(("argv", "key", "setup"), BAD)
def test_bad_input_exits_2_names_its_key_and_touches_nothing(sandbox, capsys, argv, key, setup):
    if setup:
        SETUPS[setup](sandbox)
    if not any("output-dir" in a for a in argv):
        argv = [*argv, "--output-dir", "{out}"]
    before = sandbox.snapshot()
    code, out, err = _run(sandbox, ["--dry-run", *argv], capsys)
    assert code == 2, f"exit {code}; stdout {out!r}; stderr {err!r}"
    keys = key if isinstance(key, tuple) else (key,)
    assert any(f"invalid {k}=" in err for k in keys), err
    assert err.startswith("fedunlearn-run: error: ") and "flwr run" not in out
    assert sandbox.snapshot() == before
    assert not sandbox.launched and not sandbox.temporary  # not even the run-config file


# ----------------------------------------------------------------------------- good input

GOOD = [
    pytest.param([], None, id="defaults"),
    pytest.param(_set("num-clients=7", "rounds=3"), None, id="seven-clients"),
    pytest.param(_set("scrub=true", "scrub-forget='class:5'"), None, id="scrub-class"),
    pytest.param(_set("scrub=true", "scrub-forget='samples:0:10:5'"), None, id="scrub-samples"),
    pytest.param(_set("certified-head=true", "certified-removals=1346"), None, id="removals-max"),
    pytest.param(_set("certified-head=true", "certified-delta=1e-9"), None, id="tiny-delta"),
    pytest.param(_set("seed=4294967295", "run-name='" + "r" * 100 + "'"), None, id="bounds"),
    pytest.param(_set("run-name='a.b_c-1'", "model='digits-cnn'"), None, id="explicit-model"),
    pytest.param(
        _set("train-samples=300", "num-clients=4", "partitioning='shards'"), None, id="subset"
    ),
    pytest.param(
        _set(
            "mia=true",
            "num-clients=4",
            "train-samples=400",
            "scrub=true",
            "scrub-forget='client:0'",
        ),
        None,
        id="mia",
    ),
    pytest.param(["--output-dir", "{root}/J\u00fcrgen M\u00fcller/runs"], None, id="umlaut-home"),
    pytest.param(
        ["--output-dir", "{root}/Jos\u0065\u0301/\u65e5\u672c/runs"], None, id="accents-cjk"
    ),
    pytest.param(["--output-dir", '{root}/"quoted" \\ back'], None, id="quotes-backslash"),
    pytest.param(["--output-dir", "{root}/\U00020000\U0001d400"], None, id="beyond-the-bmp"),
    pytest.param(_set("unlearn-clients='0 ,\u2003 5'"), None, id="odd-spaces-in-ids"),
    pytest.param(_set("scrub=true", 'scrub-forget="class:5\\n"'), None, id="newline-in-cohort"),
    pytest.param(
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2'", "num-clients=4"),
        "finished-run",
        id="unlearn-only",
    ),
    pytest.param(
        _set("run-name='done'", "unlearn-only=true", "unlearn-clients='2'"),
        "finished-run",
        id="unlearn-only-short-recipe",
    ),
    pytest.param(
        _set("run-name='started'", "resume=true", "rounds=5"), "resume-started", id="resume"
    ),
    pytest.param(_set("run-name='fresh'", "resume=true"), None, id="resume-nothing-yet"),
]


@pytest.mark.parametrize(("argv", "setup"), GOOD)
def test_good_input_passes_and_its_run_config_is_toml_that_reads_back(sandbox, capsys, argv, setup):
    if setup:
        SETUPS[setup](sandbox)
    if not any("output-dir" in a for a in argv):
        argv = [*argv, "--output-dir", "{out}"]
    before = sandbox.snapshot()
    code, out, err = _run(sandbox, ["--dry-run", *argv], capsys)
    assert code == 0, err
    assert sandbox.snapshot() == before and not sandbox.launched
    assert sandbox.temporary == []  # the printed command holds the run config: it runs again
    command, toml_text = out.split("\n", 1)
    assert command.startswith("fedunlearn-run: flwr run ")
    written = tomllib.loads(toml_text)
    # ... and Flower reads from it what the launcher validated, or it names the file to save
    inline = shlex.split(command)[shlex.split(command).index("--run-config") + 1]
    if inline == "FILE.toml":
        assert any('"' in str(v) for v in written.values()) and "FILE.toml: save" in toml_text
    else:
        assert parse_config_args([inline]) == written
    # What the ServerApp will parse is what the launcher validated.
    config = ExperimentConfig.from_run_config(written)
    formatted = [sandbox.format(a) for a in argv]
    if "--output-dir" in formatted:
        assert written["output-dir"] == formatted[formatted.index("--output-dir") + 1]
    if config.num_clients:
        assert f"num-supernodes={config.num_clients} " in command
    else:  # not set: the connection's federation keeps its size, which the app adopts
        assert "num-supernodes" not in command
