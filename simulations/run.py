"""``fedunlearn-run``: launch a run configuration on the local simulation with the right federation.

It is ``flwr run <app> --stream`` plus what that command cannot do for you:

* validates the configuration first, then what needs the data or the disk
  (:func:`fedunlearn.preflight.preflight`: the dataset is loaded and partitioned read-only, the run
  directory only read): a bad value exits with status 2 and the error naming the key, the value and
  what is allowed, and nothing is started or written (``--dry-run`` checks the same);
* resolves ``data-root`` and ``output-dir`` against *your* working directory (the ServerApp runs in
  the SuperLink's process, whose working directory is not yours);
* sizes the federation to ``num-clients`` and sets the client resources (CPU and GPU fractions);
  with ``num-clients`` = 0 (not set) it runs :data:`DEFAULT_NUM_CLIENTS` (the main job's K), so
  that ``fedunlearn-run`` with or without ``simulations/digits.toml`` trains the same federation
  (plain ``flwr run`` keeps the app's default: adopt the federation's size);
* exits non-zero when the run fails (``flwr run`` itself exits 0), quoting the failure;
* shows our progress lines only: Flower's log lines and Ray's warnings with ``--verbose``
  (:mod:`simulations.console`), and no ANSI colour codes unless the output is a terminal;
* draws the ServerApp's progress (training rounds, methods, calibration) as bars with an ETA on
  a terminal (:mod:`simulations.progress_display`; ``FEDUNLEARN_PROGRESS=0``: none).

Examples
--------
    fedunlearn-run simulations/digits.toml           # the main job: digits, 10 clients
    fedunlearn-run                                   # the app defaults: the main job
    fedunlearn-run simulations/mnist.toml --data-root ~/data
    fedunlearn-run simulations/mnist.toml --set rounds=5 --set retain=false --num-gpus 0.25
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from fedunlearn.config import ADOPT_FEDERATION_SIZE, ExperimentConfig, check_path_text
from fedunlearn.config.paths import expand_path
from fedunlearn.errors import ConfigError, FedUnlearnError, did_you_mean
from simulations.attempts import run_until_started
from simulations.console import ConsoleFilter, use_color
from simulations.local_superlink import (
    StartFailure,
    ensure_local_superlink,
    launch_environment,
    start_timeout,
)
from simulations.run_parser import PROJECT_ROOT, parser
from simulations.run_stream import (  # noqa: F401  (the launcher's names, as before)
    INTERRUPTED,
    RunInterrupted,
    _without_run_location,
    say_continue,
    stop_interrupted,
    stream_process,
    stream_run,
)

PATH_KEYS = ("data-root", "output-dir", "code-path")


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` with the value read as TOML when it parses (numbers, booleans), else a string."""
    if "=" not in text:
        raise ConfigError("--set", text, "KEY=VALUE with no spaces, e.g. --set rounds=5")
    key, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # a text; the key's own check judges it
        value = raw
    return key, value


#: The largest run-config file read: a run config is a few hundred ``key = value`` lines.
MAX_CONFIG_BYTES = 1 << 20


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at ``path``, or one :class:`ConfigError` naming it: larger than
    :data:`MAX_CONFIG_BYTES`, not UTF-8, not TOML, or nested deeper than Python's parser goes."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        allowed = f"a run-config file of at most {MAX_CONFIG_BYTES} bytes (this one: {size})"
        raise ConfigError("config", str(path), allowed)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError("config", str(path), f"valid UTF-8 TOML ({error})") from None
    except RecursionError:
        flat = "flat key = value pairs (this file nests deeper than the TOML parser can follow)"
        raise ConfigError("config", str(path), flat) from None


def load_run_config(
    path: Path | None, assignments: Sequence[str] = (), keys: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A run config from a flat TOML file (the format of ``flwr run --run-config FILE``), then
    ``keys`` (values as they are), then the ``--set`` ``assignments``."""
    overrides = dict(parse_assignment(text) for text in assignments)  # `--set rounds 5` first
    values: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            bundled = PROJECT_ROOT / "simulations"
            names = sorted(p.name for p in bundled.glob("*.toml"))
            guess = did_you_mean(path.name, names).replace("mean ", f"mean {bundled}/")
            raise ConfigError(
                "config",
                str(path),
                f"an existing TOML run-config file (the bundled ones: {bundled}/*.toml){guess}",
            )
        values = _read_toml(path)
        nested = [k for k, v in values.items() if isinstance(v, dict)]
        if nested:
            raise ConfigError(
                "config", str(path), f"flat key = value pairs; found a table [{nested[0]}]"
            )
    return values | dict(keys or {}) | overrides


def resolve_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make path values absolute against ``base`` (``~`` and ``$VARS`` expanded)."""
    resolved = dict(values)
    for key in PATH_KEYS:
        raw = resolved.get(key)
        if isinstance(raw, str) and raw:
            check_path_text(key, raw)  # before the file system sees it (a NUL byte would crash it)
            resolved[key] = str(expand_path(key, raw, base))
    return resolved


_TOML_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def toml_value(key: str, value: Any) -> str:
    """``value`` as a TOML value: a basic string (UTF-8, every control character escaped), an
    integer, a finite float or a boolean. JSON is not TOML: ``json.dumps`` writes \\ud83d-style
    surrogate pairs for emoji, which TOML refuses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        out = []
        for char in value:
            if char in _TOML_ESCAPES:
                out.append(_TOML_ESCAPES[char])
            elif 0xD800 <= ord(char) <= 0xDFFF:
                raise ConfigError(key, value, "text without lone surrogates (not valid Unicode)")
            elif ord(char) < 0x20 or ord(char) == 0x7F:
                out.append(f"\\u{ord(char):04X}")
            else:
                out.append(char)
        return '"' + "".join(out) + '"'
    raise ConfigError(key, value, "a string, a whole number, a finite number or true/false")


#: The exit status when the local SuperLink or Ray did not start in time (EX_TEMPFAIL: try again).
START_FAILED = 75
#: The federation ``fedunlearn-run`` starts when ``num-clients`` is not set: the main job's
#: (``simulations/digits.toml``, "the app defaults with K = 10").
DEFAULT_NUM_CLIENTS = 10


def render_run_config(values: dict[str, Any]) -> str:
    """A flat run-config TOML document (``flwr run --run-config FILE``): ``key = value`` lines."""
    return "".join(f"{key} = {toml_value(key, v)}\n" for key, v in sorted(values.items()))


def inline_run_config(text: str) -> str | None:
    """The run config ``text`` (:func:`render_run_config`'s lines) as one ``--run-config`` argument,
    ``key=value`` pairs as ``flwr run`` reads them, or None when a value cannot be written so (a
    string holding a double quote: Flower's parser ends a quoted value at the first one). Unlike
    a temporary file, a printed command that holds it can be run again."""
    pairs = []
    for line in text.splitlines():
        key, value = line.split(" = ", 1)
        quoted = value.startswith('"')
        if (quoted and '"' in value[1:-1]) or (not quoted and any(c.isspace() for c in value)):
            return None
        pairs.append(f"{key}={value}")
    return " ".join(pairs)


def build_flwr_command(
    app: Path, run_config: str, num_supernodes: int, num_cpus: float, num_gpus: float
) -> list[str]:
    """``flwr run`` for ``app`` with ``run_config`` (a TOML file's path or ``key=value`` pairs);
    ``num_supernodes`` = 0 keeps the connection's federation size (``num-clients`` = 0: the app
    adopts it)."""
    size = f"num-supernodes={num_supernodes} " if num_supernodes else ""
    federation = (
        f"{size}client-resources-num-cpus={num_cpus:g} client-resources-num-gpus={num_gpus:g}"
    )
    return [
        "flwr",
        "run",
        str(app),
        "--stream",
        "--run-config",
        run_config,
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


def _unset_num_clients(config: ExperimentConfig) -> int:
    """The federation size when ``num-clients`` is not set: a resumed run's own (its
    ``config.json`` holds the size it adopted), else :data:`DEFAULT_NUM_CLIENTS`."""
    if config.resume and (config.run_directory() / "config.json").is_file():
        from fedunlearn.preflight import trained_config

        return trained_config(config, config.run_directory()).num_clients
    return DEFAULT_NUM_CLIENTS


def check_run(
    args: argparse.Namespace, keys: Mapping[str, Any] | None = None
) -> tuple[ExperimentConfig, str]:
    """Validate everything before anything starts: the keys, the launcher's flags, the data and
    the run directory (read-only). Returns the configuration and the run-config TOML to hand to
    ``flwr run``: the keys the user set, as validated (the app's pyproject supplies the rest).
    ``keys``: run-config values set over the config file's (:mod:`fedunlearn.api`'s keywords)."""
    values = load_run_config(args.config, args.set, keys)
    if args.data_root:
        values["data-root"] = args.data_root
    if args.output_dir:
        values["output-dir"] = args.output_dir
    values = resolve_paths(values, Path.cwd())
    config = ExperimentConfig.from_run_config(values)
    # Imported once the keys are valid: the data checks import PyTorch, a bad key needs not wait.
    from fedunlearn.preflight import complete_unlearn_request, preflight

    if config.unlearn_only:
        values = complete_unlearn_request(values, config)
        config = ExperimentConfig.from_run_config(values)
    if config.num_clients == ADOPT_FEDERATION_SIZE:
        values["num-clients"] = _unset_num_clients(config)
        config = ExperimentConfig.from_run_config(values)
    if not (math.isfinite(args.num_cpus) and args.num_cpus >= 1 and args.num_cpus % 1 == 0):
        # Flower's simulation config holds client-resources-num-cpus as an unsigned integer: a
        # fraction would pass here and fail inside `flwr run` with a bare TypeError.
        raise ConfigError(
            "--num-cpus", args.num_cpus, "a whole number >= 1 (Flower's CPUs per client)"
        )
    if not 0 <= args.num_gpus <= 1:
        raise ConfigError("--num-gpus", args.num_gpus, "a GPU fraction in [0, 1]")
    timeout = start_timeout(args.start_timeout, os.environ)
    if not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError("--start-timeout", timeout, "a finite number of seconds > 0")
    if not (args.app / "pyproject.toml").is_file():
        raise ConfigError(
            "--app", str(args.app), "a folder holding the Flower App's pyproject.toml"
        )
    preflight(config)
    if (
        config.resume
        and not config.unlearn_only
        and (config.run_directory() / "config.json").is_file()
    ):
        # Imported here: the server's recovery module owns the list of keys a resume must keep.
        from server.training.resume import check_resumable

        check_resumable(config, config.run_directory())
    validated = config.to_run_config()
    return config, render_run_config({key: validated[key] for key in values})


def main(argv: Sequence[str] | None = None) -> int:
    """``fedunlearn-run ARGS`` (the console script enters through :func:`simulations.run_args.main`,
    which answers ``--help`` and ``--version`` before this module's imports)."""
    return launch(parser().parse_args(argv), argv)


def launch(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """Check, then run, the parsed command line ``args`` (``argv``: as typed, for the resume hint)."""
    try:
        config, text = check_run(args)
    except FedUnlearnError as error:
        print(f"fedunlearn-run: error: {error}", file=sys.stderr)
        return 2
    if args.engine == "local":
        from simulations.local_launch import launch_local

        env = run_environment(args, flower_search_path())
        return launch_local(args, config, text, list(argv or sys.argv[1:]), env)

    search_path = flower_search_path()
    if shutil.which("flwr", path=search_path) is None:
        print(
            "fedunlearn-run: error: the `flwr` command was not found (pip install -e .)",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        return _dry_run(args, config, text)
    env = run_environment(args, search_path)
    try:
        outcome = run_checked(args, config, text, env, out=sys.stdout)
    except RunInterrupted as interrupted:
        return stop_interrupted(interrupted, list(argv or sys.argv[1:]), env)
    except StartFailure as failure:
        print(f"fedunlearn-run: error: {failure}", file=sys.stderr)
        return START_FAILED
    code, said = verdict(outcome, args.verbose)
    if said:
        print(f"fedunlearn-run: {said}", file=sys.stderr)
    return code


def flower_search_path() -> str:
    """``PATH`` with this interpreter's bin folder first: the Flower of this environment is
    preferred, and the SuperLink that ``flwr run`` may spawn uses the same environment."""
    return str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")


def _dry_run(args: argparse.Namespace, config: ExperimentConfig, text: str) -> int:
    """``--dry-run``: print the ``flwr run`` command and the run config, start nothing."""
    run_config = inline_run_config(text)
    command = build_flwr_command(
        args.app, run_config or "FILE.toml", config.num_clients, args.num_cpus, args.num_gpus
    )
    print("fedunlearn-run:", shlex.join(command), flush=True)
    if run_config is None:
        print("# FILE.toml: save these lines as a file and name it in --run-config")
    print(text, end="")
    return 0


def run_environment(
    args: argparse.Namespace, search_path: str, python_path: Sequence[str] = ()
) -> dict[str, str]:
    """The environment of ``flwr run`` and of the local SuperLink the launch may start (its
    ServerApp and its Ray workers inherit it): ``python_path`` folders first on ``PYTHONPATH``.
    A SuperLink already running keeps the environment it started with."""
    env = launch_environment(os.environ, start_timeout(args.start_timeout, os.environ))
    env |= {"PATH": search_path, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    folders = [str(folder) for folder in python_path]
    if folders:
        env["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_checked(
    args: argparse.Namespace, config: ExperimentConfig, text: str, env: dict[str, str], out: TextIO
):
    """Run the checked run config ``text`` (:func:`check_run`) with ``flwr run``, its lines shown
    on ``out``, tried again while the SuperLink or Ray did not start; returns the
    :class:`simulations.attempts.Outcome`. Raises :class:`RunInterrupted` (Ctrl-C) and
    :class:`~simulations.local_superlink.StartFailure`."""
    with tempfile.TemporaryDirectory() as tmp:
        run_config = inline_run_config(text)
        if run_config is None:  # a value Flower's key=value parser cannot read: a file then
            run_config = str(Path(tmp) / "run-config.toml")
            Path(run_config).write_text(text, encoding="utf-8")
        command = build_flwr_command(
            args.app, run_config, config.num_clients, args.num_cpus, args.num_gpus
        )
        print("fedunlearn-run:", shlex.join(command), file=out, flush=True)
        return run_until_started(
            command,
            env,
            timeout=start_timeout(args.start_timeout, os.environ),
            stream=stream_run,
            status=_run_status,
            ensure=ensure_local_superlink,
            new_console=lambda: ConsoleFilter(verbose=args.verbose, color=use_color(out)),
            out=out,
        )


def verdict(outcome, verbose: bool) -> tuple[int, str]:
    """The exit status of a launch that ended with ``outcome``
    (:class:`simulations.attempts.Outcome`) and why, when it is not 0 ("" when the status says
    it: ``flwr run``'s own non-zero exit)."""
    run_id = outcome.run_id
    if outcome.console.error is not None:
        hint = "" if verbose else " (--verbose shows Flower's traceback)"
        return 1, f"run {run_id} failed: {outcome.console.error}{hint}"
    if outcome.code != 0:
        return outcome.code, ""
    if run_id is None:
        return 1, "error: flwr did not start a run"
    status, details = outcome.status
    if status != "finished:completed":
        return 1, f"run {run_id} {status}: {details}"
    return 0, ""


if __name__ == "__main__":
    sys.exit(main())
