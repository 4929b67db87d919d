"""fedunlearn.preflight: what needs the data or the disk is refused before a run starts, read-only,
and agrees with what the server would do later."""

from __future__ import annotations

import json

import pytest
import torch

from fedunlearn import preflight as pf
from fedunlearn.config import MODELS, SAMPLE_SHAPES, ExperimentConfig, model_problem
from fedunlearn.data.federated_data import load_federated_data
from fedunlearn.errors import ConfigError
from fedunlearn.store.run_directory import (
    HISTORY_JOURNAL,
    HISTORY_LOG,
    UNLEARNING_LOG,
    RunDirectory,
)
from fedunlearn.store.update_store import UpdateStore
from fedunlearn.training.models import DEFAULT_MODEL, build_model


def _config(tmp_path, **values) -> ExperimentConfig:
    values = {"num-clients": 10, "output-dir": str(tmp_path / "out"), **values}
    return ExperimentConfig.from_run_config(values)


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_the_copies_of_server_constants_are_the_servers():
    from server.unlearning.request import LOG_NAME

    assert UNLEARNING_LOG == LOG_NAME


def test_a_cohort_that_takes_every_sample_is_refused(tmp_path):
    config = _config(
        tmp_path,
        **{"num-clients": 1, "unlearn-clients": "", "scrub": True, "scrub-forget": "client:0"},
    )
    with pytest.raises(ConfigError, match="leaves data to retain"):
        pf.check_data(config)


@pytest.mark.parametrize("removed", ["", "0", "1,3"])
def test_certified_removals_stop_one_short_of_the_pool(tmp_path, removed):
    values = {"num-clients": 4, "certified-head": True, "certified-remove-clients": removed}
    data = load_federated_data(_config(tmp_path, **values))
    whole = {int(c) for c in removed.split(",") if c}
    pool = sum(len(part) for p, part in enumerate(data.partitions) if p not in whole)
    assert pf.check_data(_config(tmp_path, **values, **{"certified-removals": pool - 1}))
    with pytest.raises(ConfigError) as info:
        pf.check_data(_config(tmp_path, **values, **{"certified-removals": pool}))
    assert info.value.parameter == "certified-removals" and f"[0, {pool - 1}]" in str(info.value)
    # Without the certified head the key is unused, and not checked against the data.
    assert pf.check_data(_config(tmp_path, **{"num-clients": 4, "certified-removals": 10**9}))


def test_every_dataset_default_model_fits_and_the_meta_check_agrees_with_a_real_forward():
    for dataset, model in DEFAULT_MODEL.items():
        assert model_problem(model, SAMPLE_SHAPES[dataset]) == ""
    for model in MODELS[1:]:
        for shape in SAMPLE_SHAPES.values():
            try:
                build_model(model, shape, 2).eval()(torch.zeros((1, *shape)))
                fits = True
            except (ConfigError, RuntimeError):
                fits = False
            assert fits == (model_problem(model, shape) == ""), (model, shape)


def test_the_sample_shapes_are_the_loaded_ones(tmp_path, shared_data):
    digits = load_federated_data(_config(tmp_path))
    assert tuple(digits.splits.input_shape) == SAMPLE_SHAPES["digits"]
    for dataset in ("mnist", "fashion-mnist"):
        loaded = load_federated_data(
            _config(tmp_path, dataset=dataset, **{"data-root": str(shared_data)})
        )
        assert tuple(loaded.splits.input_shape) == SAMPLE_SHAPES[dataset]


def test_download_true_on_an_empty_root_defers_the_data_checks_and_creates_nothing(tmp_path):
    root = tmp_path / "data"
    config = _config(tmp_path, dataset="mnist", download=True, **{"data-root": str(root)})
    assert pf.preflight(config) is None
    assert not root.exists() and not (tmp_path / "out").exists()
    root.mkdir()
    assert pf.preflight(config) is None and _tree(root) == []
    with pytest.raises(ConfigError) as info:  # without download the same root is an error
        pf.preflight(config.replace(download=False))
    assert info.value.parameter == "data-root" and "MNIST" in str(info.value)


def test_every_client_gets_data_or_the_split_is_refused(tmp_path):
    ok = _config(tmp_path, partitioning="dirichlet", alpha=0.1, **{"num-clients": 20})
    sizes = [len(p) for p in pf.check_data(ok).partitions]
    assert len(sizes) == 20 and min(sizes) >= 1
    for values in (
        {"num-clients": 1348},
        {"num-clients": 300, "partitioning": "shards", "shards-per-client": 5},
        {"num-clients": 30, "train-samples": 40, "partitioning": "shards", "shards-per-client": 2},
    ):
        with pytest.raises(ConfigError) as info:
            pf.check_data(_config(tmp_path, **values))
        assert info.value.parameter in ("num-clients", "shards-per-client")


def _finished(tmp_path, name="done", targets=(), **values) -> ExperimentConfig:
    config = _config(tmp_path, **{"run-name": name, "num-clients": 4, **values})
    path = config.run_directory()
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config.to_run_config()))
    for file in pf.FINISHED_RUN_FILES[1:]:
        if file.endswith(".safetensors"):  # sealed stand-ins: a request checks every record
            RunDirectory(path).save_model(file.removesuffix(".safetensors"), {"w": torch.zeros(2)})
        else:
            (path / file).write_text("x")
    _fedeaser_trajectory(path / "store")
    if targets:
        log = "".join(json.dumps({"targets": list(t)}) + "\n" for t in targets)
        (path / UNLEARNING_LOG).write_text(log)
        adopted = "".join(
            json.dumps({"request": n, "targets": list(t)}) + "\n" for n, t in enumerate(targets, 1)
        )
        (path / HISTORY_LOG).write_text(adopted)
    return config


def _fedeaser_trajectory(path, rounds=(1, 3)) -> None:
    """A store as FedEraser's adopted trajectory leaves it: its Δt rounds, no retention record."""
    store = UpdateStore(path)
    for t in rounds:
        store.write_round(t, {"w": torch.zeros(2)}, {k: ({"w": torch.ones(2)}, 5) for k in (1, 2)})
    store.close()


def test_a_later_request_is_refused_a_method_the_adopted_history_cannot_serve(tmp_path):
    trained = _finished(tmp_path, **{"unlearn-methods": "federaser,fedrecover,fedretrain"})
    path = trained.run_directory()
    (path / UNLEARNING_LOG).write_text(json.dumps({"targets": [0]}) + "\n")
    (path / HISTORY_LOG).write_text(json.dumps({"request": 1, "adopted": "federaser"}) + "\n")
    before = {p: p.stat().st_mtime_ns for p in path.rglob("*")}
    with pytest.raises(ConfigError) as info:
        pf.check_run_directory(_request(trained, "1"))
    assert info.value.parameter == "unlearn-methods" and info.value.value == "fedrecover"
    assert "needs round-history" in str(info.value)
    # what the history serves still runs, and nothing was written
    pf.check_run_directory(_request(trained, "1", unlearn_methods="federaser,fedretrain"))
    assert {p: p.stat().st_mtime_ns for p in path.rglob("*")} == before


def _request(trained: ExperimentConfig, clients: str, **changes) -> ExperimentConfig:
    return trained.replace(unlearn_only=True, unlearn_clients=clients, **changes)


@pytest.mark.parametrize("missing", pf.FINISHED_RUN_FILES)
def test_unlearn_only_needs_every_file_of_a_finished_run(tmp_path, missing):
    trained = _finished(tmp_path)
    (trained.run_directory() / missing).unlink()
    with pytest.raises(ConfigError) as info:
        pf.check_run_directory(_request(trained, "1"))
    assert info.value.parameter == "run-name" and missing in str(info.value)


def test_a_request_on_a_run_never_created_says_so_and_names_the_closest_run(tmp_path):
    trained = _finished(tmp_path, name="digits-main")
    for name, closest in (("digits-mian", "; did you mean digits-main?"), ("other", "")):
        request = _request(trained, "1", run_name=name)
        with pytest.raises(ConfigError) as info:
            pf.check_run_directory(request)
        said = str(info.value)
        assert info.value.parameter == "run-name" and "was never created" in said, said
        assert said.endswith(closest) and "is missing" not in said, said
        assert not request.run_directory().exists()  # nothing made on the way


def test_unlearn_only_reads_the_log_and_writes_nothing(tmp_path):
    trained = _finished(tmp_path, targets=[(0,), (3,)])
    before = {p: p.stat().st_mtime_ns for p in trained.run_directory().iterdir()}
    pf.check_run_directory(_request(trained, "1"))
    assert pf.forgotten_clients(trained, trained.run_directory()) == {0, 3}
    for clients, fragment in (("3", "already were"), ("1,2", "leave someone")):
        with pytest.raises(ConfigError, match=fragment) as info:
            pf.check_run_directory(_request(trained, clients))
        assert info.value.parameter == "unlearn-clients"
    assert {p: p.stat().st_mtime_ns for p in trained.run_directory().iterdir()} == before


def test_the_same_request_again_finishes_an_interrupted_one_and_only_that(tmp_path):
    trained = _finished(tmp_path, targets=[(2,), (0,)])
    path = trained.run_directory()
    adopted = (path / HISTORY_LOG).read_text().splitlines()
    (path / HISTORY_LOG).write_text(adopted[0] + "\n")  # request 2 decided, not adopted
    pf.check_run_directory(_request(trained, "0"))  # the same request: the server finishes it
    for clients in ("0,1", "2"):  # another request naming a forgotten client
        with pytest.raises(ConfigError, match="already were"):
            pf.check_run_directory(_request(trained, clients))
    (path / HISTORY_LOG).write_text("\n".join(adopted) + "\n")  # finished
    with pytest.raises(ConfigError, match="already were"):
        pf.check_run_directory(_request(trained, "0"))
    pf.check_run_directory(_request(trained, "0", resume=True))  # resume: nothing left to do
    (path / HISTORY_JOURNAL).write_text("{}")  # killed mid-swap, model_final moved aside
    (path / "model_final.safetensors").unlink()
    pf.check_run_directory(_request(trained, "0", resume=True))


@pytest.mark.parametrize(
    "line", ["not json", "[1]", '{"targets": 1}', '{"methods": []}', '{"targets": ["x"]}']
)
def test_a_damaged_unlearning_log_is_refused_with_its_line(tmp_path, line):
    trained = _finished(tmp_path)
    (trained.run_directory() / UNLEARNING_LOG).write_text('{"targets": [0]}\n' + line + "\n")
    # not JSON objects: the log's own check names the line; JSON records without targets: the
    # preflight's reading of the targets does
    with pytest.raises(ConfigError, match=r"line 2(: not a JSON record| is not)") as info:
        pf.check_run_directory(_request(trained, "1"))
    assert info.value.parameter == "run-name"


def test_an_unlearn_request_takes_the_trained_data_settings_and_refuses_other_ones(tmp_path):
    trained = _finished(tmp_path, **{"train-samples": 400, "model": "digits-cnn", "seed": 3})
    short = {"run-name": trained.run_name, "output-dir": trained.output_dir, "unlearn-only": True,
             "unlearn-clients": "1"}  # fmt: skip
    completed = pf.complete_unlearn_request(short, ExperimentConfig.from_run_config(short))
    assert {k: completed[k] for k in ("train-samples", "seed", "num-clients", "model")} == {
        "train-samples": 400, "seed": 3, "num-clients": trained.num_clients, "model": "digits-cnn"
    }  # fmt: skip
    same = {**short, "model": "auto", "seed": 3}  # the same model, resolved
    pf.complete_unlearn_request(same, ExperimentConfig.from_run_config(same))
    for key, value in (
        ("train-samples", 0),
        ("seed", 7),
        ("alpha", 0.7),
        ("partitioning", "shards"),
    ):
        request = {**short, key: value}
        with pytest.raises(ConfigError) as info:
            pf.complete_unlearn_request(request, ExperimentConfig.from_run_config(request))
        assert info.value.parameter == key and "was trained with" in str(info.value)


def test_a_new_run_refuses_an_occupied_directory_but_not_an_empty_one(tmp_path):
    config = _config(tmp_path, **{"run-name": "r"})
    config.run_directory().mkdir(parents=True)
    pf.check_run_directory(config)
    (config.run_directory() / "x").write_text("")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        pf.check_run_directory(config)
    pf.check_run_directory(config.replace(resume=True, run_name="r2"))


def test_an_unwritable_output_dir_is_refused(tmp_path, monkeypatch):
    config = _config(tmp_path, **{"run-name": "r"})
    monkeypatch.setattr(pf.os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError) as info:
        pf.check_run_directory(config)
    assert info.value.parameter == "output-dir" and str(tmp_path) in str(info.value)


#: Values wrong for any federation size: refused with num-clients unset (0) as with K = 10.
WRONG_FOR_ANY_K = [
    ({"train-samples": 99999}, "train-samples"),
    ({"scrub": True, "scrub-forget": "class:99"}, "scrub-forget"),
    ({"scrub": True, "scrub-forget": "samples:0:5000:5"}, "scrub-forget"),
    ({"certified-head": True, "certified-removals": 10**9}, "certified-removals"),
]


@pytest.mark.parametrize(("values", "key"), WRONG_FOR_ANY_K)
def test_with_num_clients_unset_what_holds_for_any_k_is_checked_at_launch(tmp_path, values, key):
    unset = ExperimentConfig.from_run_config({"output-dir": str(tmp_path / "out"), **values})
    with pytest.raises(ConfigError) as info:
        pf.preflight(unset)
    assert info.value.parameter == key
    with pytest.raises(ConfigError) as known:
        pf.preflight(unset.with_federation_size(10))
    assert known.value.parameter == key
    assert not (tmp_path / "out").exists()


def test_with_num_clients_unset_what_needs_k_waits_for_the_federation(tmp_path):
    values = {
        "output-dir": str(tmp_path / "out"),
        "scrub": True,
        "scrub-forget": "samples:7:3",
        "train-samples": 500,
    }
    unset = ExperimentConfig.from_run_config(values)
    assert pf.preflight(unset) is None  # the partitions wait for the federation's size
    assert pf.preflight(unset.with_federation_size(10)) is not None
    with pytest.raises(ConfigError) as info:
        pf.preflight(unset.with_federation_size(5))  # client 7 does not exist
    assert info.value.parameter == "scrub-forget"
    root = tmp_path / "data"
    root.mkdir()
    missing = ExperimentConfig.from_run_config(
        {"output-dir": str(tmp_path / "out"), "dataset": "mnist", "data-root": str(root)}
    )
    with pytest.raises(ConfigError) as info:
        pf.preflight(missing)
    assert info.value.parameter == "data-root"
    assert not (tmp_path / "out").exists()


def test_an_auto_named_run_reopens_with_unlearn_only(tmp_path):
    # an auto-named run (run-name left empty) stores run-name = "" in its config.json
    trained = _finished(tmp_path, name="digits-20261126-061654")
    path = trained.run_directory()
    saved = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**saved, "run-name": ""}))
    effective = pf.check_run_directory(_request(trained, "3"))
    assert effective.run_name == "digits-20261126-061654"
    assert effective.run_directory() == path
    assert effective.unlearn_only and effective.unlearn_targets == [3]
