"""``fedunlearn-run``: launch a run configuration on the local simulation with the right federation.

It is ``flwr run <app> --stream`` plus what that command cannot do for you:

* validates the configuration first (a bad value exits with status 2 and the error, and nothing is
  started or written);
* resolves ``data-root`` and ``output-dir`` against *your* working directory (the ServerApp runs in
  the SuperLink's process, whose working directory is not yours);
* sizes the federation to ``num-clients`` and sets the client resources (CPU and GPU fractions);
* exits non-zero when the run fails (``flwr run`` itself exits 0), quoting the failure.

Examples
--------
    fedunlearn-run                                   # digits, 10 clients (the defaults)
    fedunlearn-run simulations/mnist.toml --data-root ../shared/data
    fedunlearn-run simulations/mnist.toml --set rounds=5 --set retain=false --num-gpus 0.25
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib

from fedunlearn.config import ExperimentConfig
from fedunlearn.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PATH_KEYS = ("data-root", "output-dir")


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` with the value read as TOML when it parses (numbers, booleans), else a string."""
    if "=" not in text:
        raise ConfigError("--set", text, "key=value, e.g. --set rounds=5")
    key, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def load_run_config(path: Path | None, assignments: Sequence[str] = ()) -> dict[str, Any]:
    """A run config from a flat TOML file (the format of ``flwr run --run-config FILE``) + overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError("config", str(path), "an existing TOML run-config file")
        try:
            values = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("config", str(path), f"valid TOML ({error})") from None
        nested = [k for k, v in values.items() if isinstance(v, dict)]
        if nested:
            raise ConfigError(
                "config", str(path), f"flat key = value pairs; found a table [{nested[0]}]"
            )
    for text in assignments:
        key, value = parse_assignment(text)
        values[key] = value
    return values


def resolve_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make path values absolute against ``base`` (``~`` and ``$VARS`` expanded)."""
    resolved = dict(values)
    for key in PATH_KEYS:
        raw = resolved.get(key)
        if isinstance(raw, str) and raw:
            path = Path(os.path.expandvars(raw)).expanduser()
            resolved[key] = str((base / path).resolve() if not path.is_absolute() else path)
    return resolved


def build_flwr_command(
    app: Path, config_file: Path, num_supernodes: int, num_cpus: float, num_gpus: float
) -> list[str]:
    federation = (
        f"num-supernodes={num_supernodes} client-resources-num-cpus={num_cpus:g} "
        f"client-resources-num-gpus={num_gpus:g}"
    )
    return [
        "flwr",
        "run",
        str(app),
        "--stream",
        "--run-config",
        str(config_file),
        "--federation-config",
        federation,
    ]


def _run_status(run_id: str, env: dict[str, str]) -> tuple[str, str]:
    """(status, details) of a finished run, from ``flwr ls``."""
    out = subprocess.run(
        ["flwr", "ls", "--run-id", run_id, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
    )
    try:
        run = json.loads(out.stdout)["runs"][0]
        return run.get("status", "unknown"), run.get("status-details", "")
    except (ValueError, KeyError, IndexError):
        return "unknown", (out.stdout + out.stderr).strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedunlearn-run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "config", nargs="?", type=Path, help="run-config TOML (default: the app's defaults)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one key"
    )
    parser.add_argument("--data-root", help="dataset root in torchvision's layout")
    parser.add_argument("--output-dir", help="parent folder of the run directory")
    parser.add_argument(
        "--num-cpus", type=float, default=1.0, help="CPUs per virtual client (default 1)"
    )
    parser.add_argument(
        "--num-gpus", type=float, default=0.0, help="GPU fraction per virtual client (e.g. 0.25)"
    )
    parser.add_argument(
        "--app", type=Path, default=PROJECT_ROOT, help="the Flower App folder (pyproject.toml)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and print the flwr command only"
    )
    args = parser.parse_args(argv)

    try:
        values = load_run_config(args.config, args.set)
        if args.data_root:
            values["data-root"] = args.data_root
        if args.output_dir:
            values["output-dir"] = args.output_dir
        values = resolve_paths(values, Path.cwd())
        config = ExperimentConfig.from_run_config(values)
        if args.num_cpus <= 0:
            raise ConfigError("--num-cpus", args.num_cpus, "a number > 0")
        if not 0 <= args.num_gpus <= 1:
            raise ConfigError("--num-gpus", args.num_gpus, "a GPU fraction in [0, 1]")
        if not (args.app / "pyproject.toml").is_file():
            raise ConfigError(
                "--app", str(args.app), "a folder holding the Flower App's pyproject.toml"
            )
    except ConfigError as error:
        print(f"fedunlearn-run: error: {error}", file=sys.stderr)
        return 2

    # Prefer the Flower of this interpreter's environment, and put its bin folder first on PATH so
    # the SuperLink that `flwr run` may spawn uses the same environment.
    search_path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    if shutil.which("flwr", path=search_path) is None:
        print(
            "fedunlearn-run: error: the `flwr` command was not found (pip install -e .)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        config_file = Path(tmp) / "run-config.toml"
        # Only the keys the user set: the app's pyproject supplies the rest.
        config_file.write_text(
            "".join(f"{k} = {json.dumps(v)}\n" for k, v in sorted(values.items()))
        )
        command = build_flwr_command(
            args.app, config_file, config.num_clients, args.num_cpus, args.num_gpus
        )
        print("fedunlearn-run:", " ".join(command), flush=True)
        if args.dry_run:
            print(config_file.read_text(), end="")
            return 0
        env = {
            **os.environ,
            "PATH": search_path,
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        }
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        run_id = None
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = re.search(r"started run (\d+)", line)
            if match:
                run_id = match.group(1)
        code = process.wait()
    if code != 0:
        return code
    if run_id is None:
        print("fedunlearn-run: error: flwr did not start a run", file=sys.stderr)
        return 1
    status, details = _run_status(run_id, env)
    if status != "finished:completed":
        print(f"fedunlearn-run: run {run_id} {status}: {details}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
