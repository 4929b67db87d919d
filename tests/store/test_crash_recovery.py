"""Crash recovery end to end on digits: a training run stopped mid-round and resumed ends with the
same model and the same retained rounds as one never stopped; an interrupted unlearning is simply
run again; a damaged blob is reported and never used.

Crashes are injected at the two places that matter (before and after the store commits a round) by
a grid that raises where the ServerApp's process would die; a last test kills a real process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from fake_grid import DelegatingGrid
from flwr.serverapp import ServerApp
from safetensors.torch import load_file

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import StoreCorruptionError
from fedunlearn.store.run_directory import RunDirectory
from fedunlearn.store.update_store import UpdateStore
from server.training.loading import load_trained_run
from server.training.original import train_federated
from server.training.resume import RECOVERY_LOG
from server.unlearning.adoption import adopt
from server.unlearning.request import LOG_NAME, run_unlearning

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


class SimulatedCrash(Exception):
    """Where the ServerApp's process would have died."""


class CrashingGrid(DelegatingGrid):
    """Flower's grid, until the ``occurrence``-th send of ``message_type`` messages: then it raises
    before that send, or (``next_call``) before the send after it."""

    def __init__(self, grid, message_type: str, occurrence: int, *, next_call: bool = False):
        super().__init__(grid)
        self._type, self._occurrence, self._next = message_type, occurrence, next_call
        self._seen, self._armed = 0, False

    def push_messages(self, messages):
        messages = list(messages)
        if self._armed:
            raise SimulatedCrash("crash after the store committed the round")
        if any(m.metadata.message_type == self._type for m in messages):
            self._seen += 1
            if self._seen == self._occurrence:
                if not self._next:
                    raise SimulatedCrash(f"crash before {self._type} send #{self._seen}")
                self._armed = True
        return self._grid.push_messages(messages)


def quiet(_line: str) -> None:
    pass


def read_store(path: Path) -> dict:
    """Every retained blob of the store at ``path``, by (round, client); damaged ones as None."""
    with UpdateStore(path) as store:
        blobs = {}
        for round_number in store.rounds():
            blobs[(round_number, None)] = store.read_global(round_number)
            for client in store.clients(round_number):
                try:
                    blobs[(round_number, client)] = store.read_update(round_number, client)
                except StoreCorruptionError:
                    blobs[(round_number, client)] = None
        return blobs


def states_equal(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


TRAINING = {
    "num-clients": 4,
    "rounds": 5,
    "local-epochs": 1,
    "retain-interval": 1,
    "unlearn-clients": "0",
    "unlearn-methods": "federaser",
    "node-wait-seconds": 60,
}


def test_training_killed_before_or_after_a_commit_resumes_to_the_same_model(tmp_path, simulate):
    overrides = {**TRAINING, "output-dir": str(tmp_path), "run-name": "straight"}
    seen: dict = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        base = ExperimentConfig.from_run_config(overrides)
        train_federated(grid, base, log=quiet)
        for case, crashing in (
            ("before-commit", CrashingGrid(grid, "train", 3)),
            ("after-commit", CrashingGrid(grid, "train", 3, next_call=True)),
        ):
            config = base.replace(run_name=case)
            try:
                train_federated(crashing, config, log=quiet)
            except SimulatedCrash as crash:
                seen[case, "crash"] = str(crash)
            path = tmp_path / case
            seen[case, "crashed rounds"] = UpdateStore(path / "store").rounds()
            seen[case, "checkpoint"] = RunDirectory(path).load_checkpoint()[0]
            if case == "after-commit":  # and the disk damaged one retained update meanwhile
                corrupt(path / "store" / "blobs" / "round_000001" / "client_000002.safetensors")
            lines: list[str] = []
            resumed = train_federated(grid, config.replace(resume=True), log=lines.append)
            seen[case, "log"] = lines
            seen[case, "store"] = read_store(path / "store")
            try:
                run_unlearning(grid, resumed, resumed.config.unlearn_targets, log=quiet)
            except StoreCorruptionError as error:
                seen[case, "unlearning error"] = str(error)
        # Resuming a finished run reopens it as it is, and still checks the store.
        corrupt(
            tmp_path / "before-commit" / "store" / "blobs" / "round_000002" / "global.safetensors"
        )
        lines = []
        reopened = train_federated(
            grid, base.replace(run_name="before-commit", resume=True), log=lines.append
        )
        seen["reopened"] = (lines, reopened.final_state)

    simulate(overrides, num_supernodes=4, server_app=app)

    straight = tmp_path / "straight"
    reference = read_store(straight / "store")
    metrics = pd.read_csv(straight / "metrics.csv")  # the server's memory and the store, per round
    assert (metrics["server_rss_mb"] > 0).all() and metrics["store_mb"].is_monotonic_increasing
    assert sorted({r for r, _ in reference}) == [1, 2, 3, 4, 5]
    for case, crashed_rounds in (("before-commit", [1, 2]), ("after-commit", [1, 2, 3])):
        path = tmp_path / case
        assert "crash" in seen[case, "crash"]
        assert seen[case, "crashed rounds"] == crashed_rounds
        assert seen[case, "checkpoint"] == 2
        # The resumed run ends with the uninterrupted run's model, bit for bit ...
        assert states_equal(
            load_file(str(path / "model_final.safetensors")),
            load_file(str(straight / "model_final.safetensors")),
        )
        # ... every round retained exactly once, with the same updates ...
        resumed = seen[case, "store"]
        assert set(resumed) == set(reference)
        for key, blob in resumed.items():
            assert blob is None or states_equal(blob, reference[key]), key
        # ... one metrics row per round, and no checkpoint left behind.
        assert pd.read_csv(path / "metrics.csv")["round"].tolist() == [0, 1, 2, 3, 4, 5]
        assert not (path / "checkpoint.safetensors").exists()
        recovery = RunDirectory(path).read_log(RECOVERY_LOG)[0]
        assert recovery["resumed_after_round"] == 2
        assert recovery["discarded_store_rounds"] == crashed_rounds[2:]
        assert any("resuming" in line and "after round 2" in line for line in seen[case, "log"])

    # Before the commit nothing was damaged: unlearning from the resumed run works as usual.
    assert json.loads((tmp_path / "before-commit" / LOG_NAME).read_text())["targets"] == [0]
    lines, final_state = seen["reopened"]
    assert any("already finished" in line for line in lines)
    assert any("round 2, global model" in line for line in lines if "damaged" in line)
    assert states_equal(final_state, load_file(str(straight / "model_final.safetensors")))
    finished = RunDirectory(tmp_path / "before-commit").read_log(RECOVERY_LOG)[-1]
    assert finished["training_finished"] and len(finished["store_problems"]) == 1
    # The damaged blob is reported on resume and refused by the unlearning that needs it:
    damaged = tmp_path / "after-commit"
    [problem] = RunDirectory(damaged).read_log(RECOVERY_LOG)[0]["store_problems"]
    assert "round 1, client 2" in problem and "sha256" in problem
    assert any("store damaged, never used" in line for line in seen["after-commit", "log"])
    assert "round 1, client 2" in seen["after-commit", "unlearning error"]
    assert not (damaged / "model_federaser.safetensors").exists()
    assert not (damaged / LOG_NAME).exists()


def test_unlearning_interrupted_halfway_is_run_again_to_the_same_result(tmp_path, simulate):
    overrides = {
        **TRAINING,
        "unlearn-methods": "federaser,fedretrain",
        "output-dir": str(tmp_path),
        "run-name": "whole",
    }
    seen: dict = {}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        config = ExperimentConfig.from_run_config(overrides)
        outcome = train_federated(grid, config, log=quiet)
        shutil.copytree(tmp_path / "whole", tmp_path / "interrupted")
        run_unlearning(grid, outcome, outcome.config.unlearn_targets, log=quiet)
        request = config.replace(run_name="interrupted", unlearn_only=True)
        reopened = load_trained_run(grid, request, log=quiet)
        try:  # dies in FedEraser's third calibration round
            run_unlearning(
                CrashingGrid(grid, "train.calibrate", 3),
                reopened,
                reopened.config.unlearn_targets,
                log=quiet,
            )
        except SimulatedCrash:
            seen["clients after crash"] = reopened.store.clients()
        seen["log after crash"] = (tmp_path / "interrupted" / LOG_NAME).exists()
        # a new process reopens the run and runs the same request again
        again = load_trained_run(grid, request, log=quiet)
        run_unlearning(grid, again, again.config.unlearn_targets, log=quiet)
        seen["clients before adoption"] = again.store.clients()  # deleted with the old history
        again.store.close()
        adopt(again.run, keep_original=False, log=quiet)
        seen["clients"] = UpdateStore(tmp_path / "interrupted" / "store").clients()

    simulate(overrides, num_supernodes=4, server_app=app)

    assert seen["clients after crash"] == [0, 1, 2, 3]  # nothing forgotten half-way
    assert seen["log after crash"] is False
    assert seen["clients before adoption"] == [0, 1, 2, 3]
    assert seen["clients"] == [1, 2, 3]
    whole, interrupted = tmp_path / "whole", tmp_path / "interrupted"
    for model in ("model_federaser", "model_fedretrain"):
        assert states_equal(
            load_file(str(interrupted / f"{model}.safetensors")),
            load_file(str(whole / f"{model}.safetensors")),
        ), model
    log = RunDirectory(interrupted).read_log(LOG_NAME)
    assert [entry["targets"] for entry in log] == [[0]]
    assert log[0]["deleted_blobs"] == 5


KILLED_RUN = """
import json, sys
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests"]
from federation_grid import serve_in_process
serve_in_process(json.loads(sys.argv[1]), num_supernodes=4)
"""


def test_serverapp_process_killed_mid_training_resumes_to_the_same_model(tmp_path, simulate):
    overrides = {
        **TRAINING,
        "rounds": 30,
        "unlearn-clients": "",
        "output-dir": str(tmp_path),
        "run-name": "killed",
    }
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, json.dumps(overrides), str(REPOSITORY_ROOT)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    metrics = tmp_path / "killed" / "metrics.csv"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 4:  # round 2 done
                break
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the ServerApp and its Ray processes, at once
        process.wait()
    assert not (tmp_path / "killed" / "model_final.safetensors").exists(), "killed too late"
    killed_at = len(pd.read_csv(metrics)) - 1

    simulate({**overrides, "resume": True}, num_supernodes=4)
    simulate({**overrides, "run-name": "straight"}, num_supernodes=4)

    run = tmp_path / "killed"
    assert states_equal(
        load_file(str(run / "model_final.safetensors")),
        load_file(str(tmp_path / "straight" / "model_final.safetensors")),
    )
    assert pd.read_csv(run / "metrics.csv")["round"].tolist() == list(range(31))
    [recovery] = RunDirectory(run).read_log(RECOVERY_LOG)
    assert recovery["resumed_after_round"] >= killed_at - 1
    assert recovery["store_problems"] == []
    with UpdateStore(run / "store") as store:
        assert store.rounds() == list(range(1, 31))
        assert all(store.clients(r) == [0, 1, 2, 3] for r in store.rounds())
