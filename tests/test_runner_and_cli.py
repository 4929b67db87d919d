"""``fedunlearn-run`` and ``fedunlearn``: bad input exits non-zero with a clear error and starts nothing."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn import cli
from fedunlearn.config import check_path_text
from fedunlearn.errors import ConfigError
from fedunlearn.store.update_store import UpdateStore
from simulations import run as runner

# Two files of the UCI Adult layout, small enough to write by hand (a fake download).
_ADULT_TRAIN_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, >50K",
    "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, Black, Female, 0, 0, 40, ?, <=50K",
    "53, Private, 234721, 11th, 7, Married-civ-spouse, Handlers-cleaners, Husband, Black, Male, 0, 0, 40, Cuba, >50K",
]
_ADULT_TEST_ROWS = [
    "25, Private, 226802, 11th, 7, Never-married, Adm-clerical, Husband, Black, Male, 0, 0, 40, United-States, <=50K.",
    "38, ?, 89814, HS-grad, 9, Divorced, ?, Not-in-family, White, Female, 0, 0, 50, ?, >50K.",
    "28, Never-worked, 336951, Bachelors, 13, Divorced, Exec-managerial, Husband, White, Male, 0, 0, 40, Atlantis, >50K.",
]


@pytest.fixture
def no_flower(monkeypatch):
    """Fail the test if the runner tries to start ``flwr``."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"flwr must not be started: {args}")

    monkeypatch.setattr(runner.subprocess, "Popen", refuse)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--set", "dataset='imagenet'"], "invalid dataset='imagenet'"),
        (["--set", "partitioning='random'"], "invalid partitioning='random'"),
        (["--set", "retain-interval=0"], "invalid retain-interval=0"),
        (["--set", "rounds=0"], "invalid rounds=0"),
        (["--set", "dataset='mnist'", "--data-root", "no/such/dir"], "invalid data-root="),
        (["--set", "colour=1"], "unknown key"),
        (["--num-gpus", "2"], "invalid --num-gpus=2.0"),
        (["--set", "rounds"], "invalid --set='rounds'"),
        (["--set", "resume=true"], "invalid resume=True: set together with run-name"),
    ],
)
def test_bad_input_exits_2_names_the_parameter_and_writes_nothing(
    argv, fragment, tmp_path, capsys, no_flower
):
    out = tmp_path / "runs"
    code = runner.main(argv + ["--output-dir", str(out)])
    assert code == 2
    assert fragment in capsys.readouterr().err
    assert not out.exists()


def test_missing_or_nested_config_file(tmp_path, capsys, no_flower):
    assert runner.main([str(tmp_path / "absent.toml")]) == 2
    assert "an existing TOML run-config file" in capsys.readouterr().err
    nested = tmp_path / "nested.toml"
    nested.write_text("[tool]\nrounds = 2\n")
    assert runner.main([str(nested)]) == 2
    assert "flat key = value pairs" in capsys.readouterr().err


def test_paths_resolve_against_the_callers_directory(tmp_path):
    values = runner.resolve_paths({"data-root": "data", "output-dir": "~/x", "rounds": 3}, tmp_path)
    assert values["data-root"] == str(tmp_path / "data")
    assert values["output-dir"].startswith("/") and not values["output-dir"].startswith("~")
    assert values["rounds"] == 3


def test_dry_run_sizes_the_federation_to_num_clients(tmp_path, capsys, no_flower):
    code = runner.main(
        ["--dry-run", "--set", "num-clients=7", "--num-gpus", "0.25", "--output-dir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "num-supernodes=7" in out and "client-resources-num-gpus=0.25" in out
    assert "num-clients = 7" in out and f'output-dir = "{tmp_path}"' in out


def test_the_gpu_fraction_per_client_reaches_rays_client_resources():
    """--num-gpus G is what Ray reserves per ClientApp actor: the launcher's federation config,
    read by Flower's own parser and simulation settings (flwr 1.42), gives Ray's backend
    ``client_resources = {"num_cpus": C, "num_gpus": G}``."""
    from flwr.common.config import parse_config_args
    from flwr.simulation.app import _run_simulation_settings
    from flwr.supercore.utils import simulation_config_from_json

    command = runner.build_flwr_command(pathlib.Path("."), "run.toml", 100, 2, 0.25)
    federation = command[command.index("--federation-config") + 1]
    fields = {k.replace("-", "_"): v for k, v in parse_config_args([federation]).items()}
    supernodes, backend, config, _, _ = _run_simulation_settings(
        simulation_config_from_json(fields)
    )
    assert (supernodes, backend) == (100, "ray")
    assert config["client_resources"] == {"num_cpus": 2, "num_gpus": 0.25}


def test_without_num_clients_the_runner_trains_the_main_jobs_federation(
    tmp_path, capsys, no_flower
):
    # the README's sequential recipe has no config file: it must train digits.toml's K = 10, or
    # its second step (unlearn-clients=3) is refused on a federation of 2
    code = runner.main(["--dry-run", "--output-dir", str(tmp_path)])
    bare = capsys.readouterr().out
    assert code == 0
    assert "num-supernodes=10 client-resources-num-cpus=1" in bare and "num-clients = 10" in bare
    main_job = runner.PROJECT_ROOT / "simulations" / "digits.toml"
    assert runner.main([str(main_job), "--dry-run", "--output-dir", str(tmp_path)]) == 0
    assert "num-supernodes=10 " in capsys.readouterr().out


def test_a_resumed_run_keeps_the_federation_it_adopted(tmp_path, capsys, no_flower):
    import json

    from fedunlearn.config import ExperimentConfig

    started = ExperimentConfig.from_run_config(
        {"output-dir": str(tmp_path), "run-name": "adopted-2", "num-clients": 2}
    )
    started.run_directory().mkdir(parents=True)
    (started.run_directory() / "config.json").write_text(json.dumps(started.to_run_config()))
    argv = ["--dry-run", "--output-dir", str(tmp_path), "--set", "run-name='adopted-2'"]
    assert runner.main([*argv, "--set", "resume=true"]) == 0
    out = capsys.readouterr().out
    assert "num-supernodes=2 " in out and "num-clients = 2" in out


def test_a_failed_flower_run_makes_a_non_zero_exit(tmp_path, monkeypatch, capsys):
    """``flwr run`` exits 0 even when the ServerApp raised; the runner asks the SuperLink instead."""

    class FakeProcess:
        stdout = iter(["Successfully started run 123\n", "... traceback ...\n"])

        def wait(self):
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: FakeProcess())
    monkeypatch.setattr(runner, "ensure_local_superlink", lambda env, timeout: None)
    monkeypatch.setattr(runner, "_run_status", lambda run_id, env: ("finished:failed", "boom"))
    assert runner.main(["--output-dir", str(tmp_path)]) == 1
    assert "run 123 finished:failed: boom" in capsys.readouterr().err
    monkeypatch.setattr(runner, "_run_status", lambda run_id, env: ("finished:completed", ""))
    FakeProcess.stdout = iter(["Successfully started run 124\n"])
    assert runner.main(["--output-dir", str(tmp_path)]) == 0


def test_store_info_and_verify(tmp_path, capsys):
    store = UpdateStore(tmp_path / "run" / "store")
    store.write_round(
        1, {"w": torch.zeros(3)}, {0: ({"w": torch.ones(3)}, 5), 1: ({"w": torch.ones(3)}, 6)}
    )
    assert cli.main(["store", "info", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "1 retained round(s)" in out and "clients: [0, 1]" in out
    assert cli.main(["store", "verify", str(tmp_path / "run")]) == 0
    blob = next((tmp_path / "run" / "store" / "blobs").rglob("client_000001*"))
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert cli.main(["store", "verify", str(tmp_path / "run")]) == 1
    assert "1 problem(s)" in capsys.readouterr().out


def _store_with_two_rounds(root):
    store = UpdateStore(root)
    for round_number in (1, 2):
        store.write_round(round_number, {"w": torch.zeros(3)}, {0: ({"w": torch.ones(3)}, 5)})
    store.close()
    return sorted((path, path.read_bytes()) for path in (root / "blobs").rglob("*.safetensors"))


def test_store_verify_on_a_store_without_its_index_exits_1_and_deletes_nothing(tmp_path, capsys):
    blobs = _store_with_two_rounds(tmp_path / "run" / "store")
    (tmp_path / "run" / "store" / "index.sqlite").unlink()
    for _ in range(2):  # the second run finds the blobs the first one must not have deleted
        assert cli.main(["store", "verify", str(tmp_path / "run")]) == 1
        out = capsys.readouterr().out
        assert f"store {tmp_path / 'run' / 'store'}: its index" in out and "is missing" in out
        assert "4 blob file(s)" in out and "restore index.sqlite from a backup" in out
    assert cli.main(["store", "info", str(tmp_path / "run")]) == 1  # damaged: 1
    assert "left untouched" in capsys.readouterr().err
    assert sorted((p, p.read_bytes()) for p in (tmp_path / "run/store/blobs").rglob("*.*")) == blobs


@pytest.mark.parametrize(
    "garbage", [b"", b"SQLite format 3\x00" + b"\x00" * 200, b"\x89PNG not a database" * 300]
)
def test_store_verify_on_a_garbage_index_exits_1(tmp_path, capsys, garbage):
    blobs = _store_with_two_rounds(tmp_path / "store")
    (tmp_path / "store" / "index.sqlite").write_bytes(garbage)
    assert cli.main(["store", "verify", str(tmp_path / "store")]) == 1
    out = capsys.readouterr().out
    assert "index.sqlite" in out and "1 problem(s)" in out and "Traceback" not in out
    assert sorted((p, p.read_bytes()) for p in (tmp_path / "store/blobs").rglob("*.*")) == blobs


def _certified_head_with_a_ledger(folder, seed: int):
    """A fitted certified head of 30 samples writing its ledger into ``folder``."""
    from fedunlearn.certified.certificate import CertifiedRemovalParams
    from fedunlearn.certified.head_data import CentralHeadData
    from fedunlearn.certified.losses import normalize_features, one_vs_rest_targets
    from fedunlearn.certified.removal import CertifiedHead

    rng = np.random.default_rng(seed)
    x = normalize_features(rng.normal(size=(30, 3)) + 0.3)
    labels = (x[:, 0] > x[:, 1]).astype(int)
    ledger = folder / "certified_removal.jsonl"
    head = CertifiedHead(
        CentralHeadData("logistic", x, one_vs_rest_targets(labels, [0, 1])),
        CertifiedRemovalParams(sigma=0.1, lam=1e-2),
        ledger=ledger,
    )
    head.fit()
    return head, ledger


def test_certificates_with_a_torn_last_line_prints_the_table_and_a_warning(tmp_path, capsys):
    head, ledger = _certified_head_with_a_ledger(tmp_path, 1)
    head.remove([3])
    with open(ledger, "ab") as handle:
        handle.write(b'{"request": 2, "kind": "rem')
    assert cli.main(["certificates", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "2 certificate(s)" in captured.out and "| remove |" in captured.out.replace("  ", " ")
    assert f"fedunlearn: warning: {ledger}: skipped a torn last line" in captured.err
    from fedunlearn.store.durable_io import TornLineWarning

    with pytest.warns(TornLineWarning, match=f"{ledger}: cut off a torn last line"):
        head.remove([4])  # the next append cuts the torn line off: the ledger reads whole again
    assert cli.main(["certificates", str(ledger)]) == 0
    captured = capsys.readouterr()
    assert "3 certificate(s)" in captured.out and captured.err == ""


def test_cli_errors_exit_2(tmp_path, capsys):
    assert cli.main(["store", "info", str(tmp_path)]) == 2
    assert "holding store.json" in capsys.readouterr().err
    assert cli.main(["data", "check", "mnist", "--root", str(tmp_path)]) == 2
    assert str(tmp_path / "MNIST") in capsys.readouterr().err


def test_cli_checks_the_embedded_dataset():
    result = subprocess.run(
        [sys.executable, "-m", "fedunlearn.cli", "data", "check", "digits"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "1347 training and 450 test samples" in result.stdout


def test_data_download_fetches_into_home_data_by_default(tmp_path, monkeypatch, capsys):
    import urllib.request

    fetched = []

    def fake_retrieve(url, destination):  # the UCI archive, without the network
        fetched.append(url.rsplit("/", 1)[1])
        rows = _ADULT_TEST_ROWS if url.endswith("adult.test") else _ADULT_TRAIN_ROWS
        header = "|1x3 Cross validator\n" if url.endswith("adult.test") else ""
        pathlib.Path(destination).write_text(header + "\n".join(rows) + "\n")

    monkeypatch.setattr(urllib.request, "urlretrieve", fake_retrieve)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["data", "download", "adult"]) == 0
    assert fetched == ["adult.data", "adult.test"]
    assert sorted(p.name for p in (tmp_path / "data" / "adult").iterdir()) == fetched
    assert "adult: 4 training and 3 test samples" in capsys.readouterr().out
    assert cli.main(["data", "check", "adult"]) == 0  # check reads the same default root
    assert fetched == ["adult.data", "adult.test"]  # and never downloads


def test_roc_curves_figure_is_written_with_zero_rates_on_log_axes(tmp_path):
    import numpy as np

    from fedunlearn.plots import plot_roc_curves

    curves = {
        "original": (np.array([0.0, 0.001, 0.5, 1.0]), np.array([0.0, 0.2, 0.9, 1.0])),
        "fedretrain": (np.array([0.0, 1.0]), np.array([0.0, 1.0])),
    }
    path = plot_roc_curves(curves, tmp_path / "roc.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [(["--clients", "0"], "--clients must be >= 1"), (["--rounds", "-1"], "--rounds must be >= 1")],
)
def test_scale_benchmark_refuses_bad_sizes(tmp_path, capsys, argv, fragment):
    from simulations.benchmarks import scale

    with pytest.raises(SystemExit) as info:
        scale.main(["--output-dir", str(tmp_path / "out"), *argv])
    assert info.value.code == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the run-config TOML


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_every_text_reads_back_from_the_run_config_toml_or_is_refused(text):
    """JSON is not TOML (json.dumps writes emoji as \\ud83d\\ude00 surrogate pairs, which TOML
    refuses): the launcher writes TOML strings itself, and every text reads back as it was."""
    try:
        rendered = runner.render_run_config({"run-name": text})
    except ConfigError:
        assert any(0xD800 <= ord(c) <= 0xDFFF for c in text)  # lone surrogates: not Unicode
        return
    assert tomllib.loads(rendered) == {"run-name": text}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1))
def test_an_accepted_output_dir_is_printable_and_reads_back(text):
    try:
        check_path_text("output-dir", "/" + text)
    except ConfigError as error:
        assert error.parameter == "output-dir"
        return
    assert all(c.isprintable() or c == " " for c in text)
    assert tomllib.loads(runner.render_run_config({"output-dir": "/" + text}))["output-dir"] == (
        "/" + text
    )


@given(
    st.one_of(
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
    )
)
def test_numbers_and_booleans_read_back_exactly(value):
    read = tomllib.loads(runner.render_run_config({"k": value}))["k"]
    assert read == value and type(read) is type(value)


def test_non_finite_numbers_and_other_types_are_not_written():
    for value in (float("nan"), float("inf"), [1], {"a": 1}, None):
        with pytest.raises(ConfigError):
            runner.toml_value("k", value)


def test_the_dry_run_writes_the_validated_values_not_the_raw_ones(tmp_path, capsys, no_flower):
    code = runner.main(
        [
            "--dry-run",
            "--output-dir",
            str(tmp_path / "J\u00fcrgen \U00020000"),
            "--set",
            "unlearn-clients=3",
            "--set",
            "lr=1",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out.split("\n", 1)[1]
    written = tomllib.loads(text)
    assert written == {
        "output-dir": str(tmp_path / "J\u00fcrgen \U00020000"),
        "unlearn-clients": "3",
        "lr": 1.0,
        "num-clients": runner.DEFAULT_NUM_CLIENTS,  # the runner's federation, not Flower's 2
    }
    assert "\\u" not in text  # UTF-8 text, not escapes
    assert not (tmp_path / "J\u00fcrgen \U00020000").exists()


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["train-samples=99999"], "train-samples"),
        (["scrub=true", "scrub-forget=class:99"], "scrub-forget"),
        (["scrub=true", "scrub-forget=samples:0:5000:5"], "scrub-forget"),
        (["certified-head=true", "certified-removals=1000000000"], "certified-removals"),
    ],
)
def test_the_app_defaults_are_checked_with_their_federation_at_the_dry_run(
    tmp_path, capsys, no_flower, sets, key
):
    # without num-clients these passed the dry-run and failed ~40 s into the federation
    argv = ["--dry-run", "--output-dir", str(tmp_path)]
    assert runner.main([*argv, *[x for s in sets for x in ("--set", s)]]) == 2
    assert f"error: invalid {key}=" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("main", [cli.main, runner.main], ids=["fedunlearn", "fedunlearn-run"])
def test_both_commands_say_their_version(main, capsys):
    from fedunlearn import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip().endswith(__version__)


@pytest.mark.parametrize("module", ["simulations.run_args", "fedunlearn.cli"])
def test_help_and_version_import_no_pytorch(module):
    # `--help` answers at once: PyTorch alone takes 1.5 s to import on a 2-core machine
    script = (
        f"import sys, {module} as m\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n        m.main(argv)\n    except SystemExit:\n        pass\n"
        "print('torch loaded:', 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("torch loaded: False")


def test_certificates_flags_an_edited_entry_naming_its_line(tmp_path, capsys):
    head, ledger = _certified_head_with_a_ledger(tmp_path, 2)
    head.remove([3])
    head.remove([4])
    assert cli.main(["certificates", str(tmp_path)]) == 0
    capsys.readouterr()
    lines = ledger.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"certified": false', '"certified": true').replace(
        '"retrained": false', '"retrained": true'
    )
    assert lines[1] != ledger.read_text().splitlines(keepends=True)[1]  # the edit took
    ledger.write_text("".join(lines))
    assert cli.main(["certificates", str(tmp_path)]) == 1
    assert f"{ledger}, line 2" in capsys.readouterr().err
