"""The commands that start nothing answer without importing what they do not need: a bad key or
value of ``fedunlearn-run`` imports neither PyTorch nor Flower (nor Ray, pandas, scikit-learn,
matplotlib), and ``--dry-run`` no Flower, Ray or matplotlib. Each runs in a fresh interpreter (a plain
Python subprocess) that reports what it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "flwr", "ray", "pandas", "sklearn", "scipy", "matplotlib", "safetensors")

_SCRIPT = """
import json, sys
from {module} import main
try:
    code = main(sys.argv[1:])
finally:
    sys.stdout.flush()
    heavy = sorted({{name.split(".")[0] for name in sys.modules}} & set({heavy!r}))
    print("IMPORTED " + json.dumps(heavy), file=sys.stderr)
sys.exit(code)
"""


def _imported(module: str, *arguments: str, cwd: Path = REPOSITORY) -> tuple[int, list[str], str]:
    """(exit status, heavy packages imported, stderr) of ``module``'s ``main(arguments)``."""
    script = _SCRIPT.format(module=module, heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", script, *arguments], cwd=cwd, capture_output=True, text=True
    )
    reported = [line for line in done.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert reported, done.stderr
    return done.returncode, json.loads(reported[-1].removeprefix("IMPORTED ")), done.stderr


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--set", "roudns=5"], "unknown key; did you mean rounds?"),
        (["--set", "rounds=abc"], "invalid rounds='abc'"),
        (["--set", "dataset='imagenet'"], "invalid dataset='imagenet'"),
        (["no/such/config.toml"], "invalid config='no/such/config.toml'"),
        (["--set", "rounds"], "invalid --set='rounds'"),
    ],
)
def test_a_bad_key_or_value_is_answered_without_torch_or_flower(arguments, said):
    code, heavy, stderr = _imported("simulations.run_args", *arguments)
    assert code == 2 and said in stderr
    assert heavy == [], f"fedunlearn-run {' '.join(arguments)} imported {heavy}"


def test_a_dry_run_loads_the_data_without_flower_ray_or_figures(tmp_path):
    code, heavy, stderr = _imported(
        "simulations.run_args",
        "--dry-run",
        "simulations/digits.toml",
        "--output-dir",
        str(tmp_path),
    )
    assert code == 0, stderr
    assert "torch" in heavy  # the data and the model check are PyTorch's
    assert not {"flwr", "ray", "matplotlib"} & set(heavy), heavy


def test_the_help_of_both_commands_imports_nothing_heavy():
    for module in ("simulations.run_args", "fedunlearn.cli"):
        code, heavy, _ = _imported(module, "--help")
        assert code == 0 and heavy == [], (module, heavy)


def test_fedunlearn_errors_import_neither_torch_nor_flower(tmp_path):
    code, heavy, stderr = _imported("fedunlearn.cli", "store", "info", str(tmp_path))
    assert code == 2 and "store.json" in stderr
    assert not {"torch", "flwr", "ray"} & set(heavy), heavy


def test_report_and_compare_answer_help_and_refusals_without_anything_heavy(tmp_path):
    """Their help, a folder that is no run, a run without its comparison: no PyTorch, Flower,
    pandas or matplotlib; nor the page of a run that holds only its configuration."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"run-name": "bare", "seed": 3}')
    for arguments, code_said in (
        (["report", "--help"], (0, "")),
        (["compare", "--help"], (0, "")),
        (["report", str(tmp_path)], (2, "a run directory holding config.json")),
        (["compare", str(run), str(tmp_path / "gone")], (2, f"invalid RUN='{tmp_path / 'gone'}'")),
        (["compare", str(run)], (2, "run directories holding an unlearning comparison")),
        (["report", str(run), "--out", str(tmp_path / "page.html")], (0, "")),
    ):
        code, heavy, stderr = _imported("fedunlearn.cli", *arguments)
        assert (code, heavy) == (code_said[0], []), (arguments, heavy, stderr)
        assert code_said[1] in stderr, stderr
    assert "bare" in (tmp_path / "page.html").read_text(encoding="utf-8")
