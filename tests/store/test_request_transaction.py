"""An unlearning request is a transaction (server.unlearning.journal): killed at any step — in a
method, between its decision and its log entry, inside the certified head, scrubbing and audit
phases, in the history swap — the same request run again ends with the models, tables, ledger and
logs of a request never interrupted, and no file that determines the forgotten client's updates.

Both entry points: ``unlearn-only`` on a trained run, and a run config that trains and unlearns
(its rerun is ``resume=true``; the first attempt resumes the same finished training, so that the
training is shared by every kill). A kill is an exception raised where the ServerApp's process
would die: before a message of each type the request sends (its first and its second), and
before or after each of the request's file steps.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from fake_grid import DelegatingGrid
from flwr.serverapp import ServerApp
from safetensors.torch import load_file

from fedunlearn.store.json_lines import read_jsonl
from fedunlearn.store.update_store import UpdateStore
from server import server_app
from server.server_app import serve
from server.unlearning import adoption as history
from server.unlearning import journal as request_journal
from server.unlearning.request import LOG_NAME

TARGET = 0
TRAINING = {
    "num-clients": 3,
    "rounds": 2,
    "train-samples": 300,
    "local-epochs": 1,
    "retain-interval": 1,
    "node-wait-seconds": 60,
    "unlearn-clients": "",
    "unlearn-methods": "federaser,fedaccum,sifu,fedretrain",  # what training retains for
}
REQUEST = {
    "unlearn-clients": str(TARGET),
    "unlearn-methods": "federaser,fedaccum,sifu,fedretrain",
    "unlearn-adopt": "federaser",
    "certified-head": True,
    "certified-removals": 2,
    "certified-remove-clients": str(TARGET),
    "certified-verify-central": False,
    "certified-loss": "least-squares",
    "scrub": True,
    "scrub-forget": f"client:{TARGET}",
    "scrub-methods": "newton",
    "scrub-lambda-factors": "1",
    "mia": True,
}
#: Models whose bytes a rerun reproduces (SIFU's noise and the certified head's b are drawn from
#: the operating system at every run; their models are compared by what the ledger says).
DETERMINISTIC = ("model_final", "model_initial", "model_federaser", "model_fedretrain")
#: The request's own file steps: (function, "before" or "after").
FILE_STEPS = [
    (request_journal, "begin", "after"),
    (request_journal, "decide", "before"),
    (request_journal, "decide", "after"),
    (server_app, "adopt", "before"),
    (history, "_forget_in_old_history", "before"),
    (history, "_forget_in_old_history", "after"),
    (request_journal, "close", "before"),
]


class Killed(BaseException):
    """Where the ServerApp's process died (BaseException: no handler of the product catches it)."""


class RecordingGrid(DelegatingGrid):
    """Flower's grid that records each push's message type(s) and raises :class:`Killed` before
    push ``offset`` (0-based) of its ``run``-th run of pushes of one type (a phase: the certified
    head's push count varies with its b, a phase's place does not)."""

    def __init__(self, grid, kill_at: tuple[int, int] | None = None):
        super().__init__(grid)
        self._kill_at = kill_at
        self.types: list[str] = []
        self.places: list[tuple[int, int]] = []  # (run, offset) of each push

    def push_messages(self, messages):
        messages = list(messages)
        if not messages:
            return self._grid.push_messages(messages)
        kind = ",".join(sorted({m.metadata.message_type for m in messages}))
        run, offset = self.places[-1] if self.places else (-1, 0)
        place = (run, offset + 1) if self.types and self.types[-1] == kind else (run + 1, 0)
        self.types.append(kind)
        self.places.append(place)
        if place == self._kill_at:
            raise Killed(f"before push {place} ({kind})")
        return self._grid.push_messages(messages)


def quiet(_line: str) -> None:
    pass


def killing(module, name: str, when: str, monkeypatch) -> Callable[[], bool]:
    """Patch ``module.name`` to raise :class:`Killed` ``when`` it runs (once); returns whether it did."""
    original, fired = getattr(module, name), []

    def wrapper(*args, **kwargs):
        if when == "before" and not fired:
            fired.append(1)
            raise Killed(f"before {name}")
        result = original(*args, **kwargs)
        if when == "after" and not fired:
            fired.append(1)
            raise Killed(f"after {name}")
        return result

    monkeypatch.setattr(module, name, wrapper)
    return lambda: bool(fired)


def outcome_of(path: Path) -> dict:
    """What a finished request leaves: files, deterministic models, store, tables, ledger, logs."""
    files = sorted(p.name for p in path.iterdir())
    models = {
        name: load_file(str(path / f"{name}.safetensors"))
        for name in DETERMINISTIC
        if (path / f"{name}.safetensors").is_file()
    }
    with UpdateStore(path / "store", readonly=True) as store:
        blobs = {(t, k): store.read_update(t, k) for t in store.rounds() for k in store.clients(t)}
        blobs.update({(t, -1): store.read_global(t) for t in store.rounds()})
    table = pd.read_csv(path / "unlearning.csv").set_index("method")
    ledger = [
        record.get("method", record.get("kind"))
        for record in read_jsonl(path / "certified_removal.jsonl")
    ]
    return {
        "files": files,
        "models": models,
        "blobs": blobs,
        "table": table.loc[
            ["fedavg", "federaser", "fedaccum", "fedretrain"], ["test_accuracy", "target_accuracy"]
        ],
        "ledger": ledger,
        "requests": [
            (e["targets"], e["adopted"], e["deleted_blobs"]) for e in read_jsonl(path / LOG_NAME)
        ],
        "adopted": [(e["targets"], e["adopted"]) for e in read_jsonl(path / "history_log.jsonl")],
        "scrubbing": len(read_jsonl(path / "scrubbing.jsonl")),
    }


def assert_same(interrupted: dict, whole: dict, step: str) -> None:
    assert interrupted["files"] == whole["files"], step
    for name, state in whole["models"].items():
        other = interrupted["models"][name]
        assert sorted(other) == sorted(state) and all(
            torch.equal(other[k], state[k]) for k in state
        ), (step, name)
    assert sorted(interrupted["blobs"]) == sorted(whole["blobs"]), step
    for key, state in whole["blobs"].items():
        assert all(torch.equal(interrupted["blobs"][key][k], state[k]) for k in state), (step, key)
    pd.testing.assert_frame_equal(interrupted["table"], whole["table"], obj=step)
    for field in ("ledger", "requests", "adopted", "scrubbing"):
        assert interrupted[field] == whole[field], (step, field)


def determining_files(path: Path, before: Path) -> list[str]:
    """Files under ``path`` that determine the target's updates (the byte scan): any model-shaped
    tensor set equal to a pre-request global model of round >= 2 or the pre-request final model,
    any retained blob of the target, and the leftovers that hold the old history."""
    keys = sorted(load_file(str(before / "model_initial.safetensors")))
    flat = lambda state: np.concatenate([state[k].double().numpy().ravel() for k in keys])  # noqa: E731
    with UpdateStore(before / "store", readonly=True) as store:
        originals = [flat(store.read_global(t)) for t in store.rounds() if t >= 2]
    originals.append(flat(load_file(str(before / "model_final.safetensors"))))
    found = [
        str(p.relative_to(path))
        for p in path.iterdir()
        if p.name.startswith(("original-", ".discarded-", "store.request-"))
    ]
    for file in sorted(path.rglob("*.safetensors")):
        state = load_file(str(file))
        if sorted(state) == keys and any(
            np.allclose(flat(state), o, rtol=0, atol=1e-7) for o in originals
        ):
            found.append(str(file.relative_to(path)))
    with UpdateStore(path / "store", readonly=True) as store:
        if TARGET in store.clients():
            found.append("store (holds the target's updates)")
    return found


def kill_points(recording: RecordingGrid) -> list[tuple]:
    """Every file step, and before the first push of each phase (a run of pushes of one message
    type: FedEraser's calibration, SIFU's and FedRetrain's rounds, the certified head's queries,
    scrubbing's, the audit's reference trainings); with ``FEDUNLEARN_KILL_EVERY_PUSH=1``, before
    every push (minutes)."""
    points = [("file", *step) for step in FILE_STEPS]
    every = os.environ.get("FEDUNLEARN_KILL_EVERY_PUSH") == "1"
    for place, kind in zip(recording.places, recording.types):
        if kind == "query.describe":
            continue  # finding the federation: before the request starts
        if every or place[1] == 0:
            points.append(("push", place, kind))
    return points


def run_entry_point(grid, tmp_path: Path, base: Path, request: dict, monkeypatch) -> list[str]:
    """The whole request on a copy of ``base``, then each kill point on another copy, run again;
    returns the kill points (each one checked against the whole request)."""
    shutil.copytree(base, tmp_path / "whole")
    recording = RecordingGrid(grid)
    serve(recording, {**request, "run-name": "whole"}, log=quiet)
    whole = outcome_of(tmp_path / "whole")
    assert not determining_files(tmp_path / "whole", base)
    points = kill_points(recording)
    for number, point in enumerate(points):
        name = f"killed-{number}"
        shutil.copytree(base, tmp_path / name)
        config = {**request, "run-name": name}
        with monkeypatch.context() as patch:
            if point[0] == "file":
                fired = killing(*point[1:], patch)
                attempt = grid
            else:
                attempt = RecordingGrid(grid, kill_at=point[1])
            try:
                serve(attempt, config, log=quiet)
                killed = False
            except Killed:
                killed = True
        # A phase's first push is always reached; a later one may not be (the certified head's
        # count varies with b): that attempt finished, and is checked all the same.
        if not killed:
            assert point[0] == "push" and point[1][1] > 0, point
            print(f"{point[:2]}: not reached (the attempt finished; checked as it is)")
        else:
            assert point[0] == "push" or fired(), point
        started = time.perf_counter()
        if killed:
            serve(grid, config, log=quiet)  # the same request again
        assert_same(outcome_of(tmp_path / name), whole, f"{point}")
        assert not determining_files(tmp_path / name, base), point
        shutil.rmtree(tmp_path / name)
        print(f"{point[:2]} {point[2:]}: finished again in {time.perf_counter() - started:.1f}s")
    return [point if point[0] == "push" else (point[0], point[2], point[3]) for point in points]


def test_a_request_killed_at_any_step_is_finished_by_running_it_again(
    tmp_path, simulate, monkeypatch
):
    seen = {}
    trained = {**TRAINING, "output-dir": str(tmp_path / "runs"), "run-name": "base"}
    app = ServerApp()

    @app.main()
    def main(grid, context):
        serve(grid, trained, log=quiet)
        base = tmp_path / "runs" / "base"
        for entry_point, request in (
            ("unlearn-only", {**REQUEST, "unlearn-only": True}),
            ("after training", {**trained, **REQUEST, "resume": True}),
        ):
            folder = tmp_path / entry_point.replace(" ", "-")
            request = {**request, "output-dir": str(folder)}
            seen[entry_point] = run_entry_point(grid, folder, base, request, monkeypatch)

    simulate(trained, num_supernodes=3, server_app=app)
    print(seen)
    # every phase was killed: FedEraser's calibration, SIFU's and FedRetrain's rounds, the
    # certified head, scrubbing, and the audit's reference trainings (after scrubbing)
    phases = ["train.calibrate", "train", "query.certified_head", "query.scrub_stats", "train"]
    for entry_point in ("unlearn-only", "after training"):
        killed = iter([point[2] for point in seen[entry_point] if point[0] == "push"])
        assert all(phase in killed for phase in phases), (entry_point, seen[entry_point])
        assert len([p for p in seen[entry_point] if p[0] == "file"]) == len(FILE_STEPS)
