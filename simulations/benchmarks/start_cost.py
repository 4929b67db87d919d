"""The fixed cost of a run: where the main job's seconds go before round 1 and after its results,
this checkout next to a baseline checkout, cold (every run starts its own SuperLink and Ray) and
warm (one SuperLink and one Ray serve many runs).

Each run is ``python -m simulations.run CONFIG --verbose`` (the ``fedunlearn-run`` of the checkout,
with the checkout first on ``PYTHONPATH``) with a fresh ``--output-dir``. The benchmark stamps every
line the launcher prints when it arrives, and splits the run into phases at these lines:

==================  ==================================================================
phase               from the line ... to the line ...
==================  ==================================================================
check               start of the command -> ``fedunlearn-run: flwr run`` (validation, preflight)
superlink+submit    -> ``Successfully started run`` (local SuperLink up, ``flwr run`` sent the app)
simulation start    -> ``Starting Flower Simulation`` (the SuperLink's ``flwr-simulation`` process)
ray+serverapp       -> ``[fedunlearn] run directory:`` (Ray; the ServerApp imported, its preflight;
                    the ClientApp actors started; discovery: every client describes its partition)
round 1             -> ``[fedunlearn] round 1/`` (the first training round)
rounds 2..R         -> ``[fedunlearn] trained in``
unlearning          -> ``[fedunlearn] results in`` (the request, its comparison and adoption)
shutdown            -> the command's exit (Ray's actors stopped, ``flwr ls``)
==================  ==================================================================

Flower streams the run's log every 0.5 s (``LOG_STREAM_INTERVAL``): the phase ends inside the run
are known to within half a second. ``to round 1`` is the first four phases and round 1 (the end of
round 1: its line); ``to round 1 start`` ends at round 0's line (the initial model evaluated, round
1's messages go out); ``total`` the whole command.

``--local N`` also runs this checkout N times a round with ``--engine local`` (the ServerApp and
ClientApp in the command's own processes: no SuperLink, no Ray; :mod:`simulations.local_engine`),
whose phases are ``check`` (to ``fedunlearn-run: local engine:``), ``engine start`` (to the run
directory line: the ServerApp imported, the workers started, discovery) and the same rounds,
unlearning and shutdown. Its models are hashed with the others: ``same models`` then also says
whether the local engine's models equal Flower's simulation's, bit for bit.

Cold runs each go through ``--wrap`` (e.g. ``/work/shared/tools/isolated-flwr``: an own network
namespace, ``FLWR_HOME`` and Ray folder, so each starts its SuperLink and Ray). Warm runs: one
``--wrap`` per checkout and round runs ``ray start --head`` once (timed as ``shared start``), then
``--warm`` runs one after another with ``RAY_ADDRESS`` set: the first starts the SuperLink, which the
others reuse, and every run's ``flwr-simulation`` attaches to that Ray instead of starting one.
Checkouts alternate (the first of a round goes second in the next). Every run's model files are
hashed (their tensors): ``same models`` says whether each model is equal, bit for bit, in every run.

``--imports N`` also imports the ServerApp's and the ClientApp's modules N times per checkout,
alternating, each in a fresh interpreter, and writes ``start_imports.csv`` / ``start_imports.md``
(median wall and CPU seconds; ``--rounds 0``: only these).

Writes ``start_cost.csv`` (one row per run: each phase's seconds, the load average) and
``start_cost.md`` (the median per phase, checkout and mode, side by side) in ``--output-dir``; each
run's output under ``--output-dir``/logs.

Usage (a few minutes per round; the baseline: ``git archive eedd342 | tar -x -C ../baseline``)::

    FEDUNLEARN_DATA_ROOT=PATH python -m simulations.benchmarks.start_cost --baseline ../baseline \\
        --rounds 2 --warm 3 --local 1 --wrap /work/shared/tools/isolated-flwr \\
        --output-dir simulations/benchmarks/results/start_cost
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from simulations.local_superlink import LOCAL_ADDRESSES, LocalSuperLink, listening_process
from simulations.run_parser import PROJECT_ROOT

#: (phase, the line that ends it), in the order a run prints them; "exit" ends the last phase.
PHASES = (
    ("check", r"fedunlearn-run: flwr run "),
    ("superlink+submit", r"Successfully started run "),
    ("simulation start", r".*Starting Flower Simulation"),
    ("ray+serverapp", r"\[fedunlearn\] run directory: "),
    ("round 1", r"\[fedunlearn\] round 1/"),
    ("rounds 2..R", r"\[fedunlearn\] trained in "),
    ("unlearning", r"\[fedunlearn\] results in "),
    ("shutdown", None),
)
#: The phases of a ``--engine local`` run (``--local``): no SuperLink, no Ray; the engine is a
#: fork of the launcher, its workers load the ClientApp while the ServerApp is imported.
LOCAL_PHASES = (
    ("check", r"fedunlearn-run: local engine: "),
    ("engine start", r"\[fedunlearn\] run directory: "),
    *PHASES[4:],
)
#: The line a run prints once round 0 (the initial model's evaluation) is done: round 1 starts.
ROUND_1_STARTS = r"\[fedunlearn\] round 0/"
#: The port of the warm batches' Ray (its GCS).
RAY_PORT = 6379


def phase_times(
    stamped: Sequence[tuple[float, str]], exit_time: float, phases=PHASES
) -> dict[str, float]:
    """Each phase's seconds from ``(seconds since the start, line)`` pairs, with ``to round 1``
    (to the end of round 1: its line), ``to round 1 start`` (round 0's line) and ``total``; the
    phases from the first whose end line never came are missing."""
    ends: dict[str, float] = {}
    lines = iter(stamped)
    for name, pattern in phases:
        found = (
            exit_time
            if pattern is None
            else next((t for t, line in lines if re.match(pattern, line)), None)
        )
        if found is None:
            break
        ends[name] = found
    times, last = {}, 0.0
    for name, end in ends.items():
        times[name], last = round(end - last, 3), end
    if "round 1" in ends:
        times["to round 1"] = round(ends["round 1"], 3)
    starts = next((t for t, line in stamped if re.match(ROUND_1_STARTS, line)), None)
    if starts is not None:
        times["to round 1 start"] = round(starts, 3)
    times["total"] = round(exit_time, 3)
    return times


def model_hashes(output_dir: Path) -> dict[str, str]:
    """sha256 of the tensors of each model file the run wrote (its name -> digest): names,
    dtypes, shapes and bytes, not the file's metadata (which names the run)."""
    from safetensors.numpy import load_file

    hashes = {}
    for path in sorted(output_dir.glob("*/model_*.safetensors")):
        digest = hashlib.sha256()
        for name, array in sorted(load_file(path).items()):
            digest.update(f"{name} {array.dtype} {array.shape}".encode())
            digest.update(array.tobytes())
        hashes[path.name] = digest.hexdigest()
    return hashes


def run_job(
    checkout: Path,
    config: str,
    output_dir: Path,
    log: Path,
    prefix: Sequence[str] = (),
    engine: str = "flower",
):
    """One ``fedunlearn-run CONFIG --verbose`` of ``checkout`` (``engine``: ``--engine``'s value;
    flower: the option is not given, as the baseline knows none): (exit status, phase seconds)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [*prefix, sys.executable, "-m", "simulations.run", config, "--verbose"]
    command += ["--engine", engine] if engine != "flower" else []
    command += ["--output-dir", str(output_dir)]
    stamped = []
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (
        subprocess.Popen(
            command,
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as process,
        log.open("w", encoding="utf-8") as out,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            now = time.perf_counter() - start
            stamped.append((now, line.rstrip("\n")))
            out.write(f"{now:8.3f} {line}")
    phases = LOCAL_PHASES if engine == "local" else PHASES
    return process.returncode, phase_times(stamped, time.perf_counter() - start, phases)


def warm_batch(args: argparse.Namespace) -> int:
    """Inside one ``--wrap``: start Ray once, run ``--warm`` jobs attached to it, print each as a
    JSON line; then stop that Ray and the SuperLink the first job started, by their process ids."""
    ray = str(Path(sys.executable).parent / "ray")
    superlink_before = superlink_process()
    temp = os.environ.get("RAY_TMPDIR") or tempfile.mkdtemp()
    start = time.perf_counter()
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", "--include-dashboard=false", "--disable-usage-stats",
         "--port", str(RAY_PORT), "--temp-dir", temp],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        for line in head.stdout or ():
            if "Ray runtime started" in line:
                break
        shared = round(time.perf_counter() - start, 3)
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{RAY_PORT}"
        for number in range(1, args.warm + 1):
            folder = args.output_dir / f"{args.label}-{number}"
            code, times = run_job(args.checkout, args.config, folder / "out", folder / "log.txt")
            row = {"run": number, "exit": code, "shared start": shared if number == 1 else 0.0}
            row["ray sessions"] = len(list(Path(temp).glob("session_2*")))  # 1: all attached
            print(json.dumps(row | times | {"models": model_hashes(folder / "out")}), flush=True)
    finally:
        if superlink_before is None:  # the first job started it: stop it
            stop_superlink()
        head.terminate()  # `ray start --block` stops the processes it started
        head.wait()
    return 0


def superlink_process() -> int | None:
    """The process id of this environment's local SuperLink, None when none is up."""
    superlink = LocalSuperLink.of(os.environ, LOCAL_ADDRESSES[0])
    found = listening_process(superlink.control_port)
    return None if found is None else found[0]


def stop_superlink() -> None:
    """Stop the local SuperLink of this environment (the one the first warm run started)."""
    pid = superlink_process()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)


def record(rows: list[dict], base: dict, code: int, times: dict, models: dict) -> None:
    rows.append(base | {"exit": code, "load": round(os.getloadavg()[0], 2)} | times | {
        "models": json.dumps(models, sort_keys=True)})  # fmt: skip


def cold(args, checkout: Path, label: str, rows: list[dict], repeat: int, scratch: Path) -> None:
    folder = scratch / f"cold-{label}-{repeat}"
    folder.mkdir(parents=True)
    prefix = shlex.split(args.wrap) if args.wrap else []
    code, times = run_job(checkout, args.config, folder / "out", folder / "log.txt", prefix)
    base = {"round": repeat, "checkout": label, "mode": "cold", "run": 1, "shared start": 0.0}
    record(rows, base, code, times, model_hashes(folder / "out"))


def local(args, checkout: Path, label: str, rows: list[dict], repeat: int, scratch: Path) -> None:
    """One ``--engine local`` run of ``checkout`` (through ``--wrap`` too, for the same setting)."""
    number = 1 + sum(1 for r in rows if (r["round"], r["mode"]) == (repeat, "local"))
    folder = scratch / f"local-{label}-{repeat}-{number}"
    folder.mkdir(parents=True)
    prefix = shlex.split(args.wrap) if args.wrap else []
    code, times = run_job(
        checkout, args.config, folder / "out", folder / "log.txt", prefix, "local"
    )
    base = {"round": repeat, "checkout": label, "mode": "local", "run": 1, "shared start": 0.0}
    record(rows, base, code, times, model_hashes(folder / "out"))


def warm(args, checkout: Path, label: str, rows: list[dict], repeat: int, scratch: Path) -> None:
    folder = scratch / f"warm-{label}-{repeat}"
    folder.mkdir(parents=True)
    command = [*shlex.split(args.wrap or ""), sys.executable, "-m", __spec__.name]
    command += ["--warm-batch", "--checkout", str(checkout), "--label", label]
    command += ["--warm", str(args.warm), "--config", args.config, "--output-dir", str(folder)]
    done = subprocess.run(
        command, cwd=PROJECT_ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )  # fmt: skip
    (folder / "batch.txt").write_text(done.stdout + done.stderr, encoding="utf-8")
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            models = row.pop("models")
            code = row.pop("exit")
            base = {"round": repeat, "checkout": label, "mode": "warm"}
            record(rows, base | {"run": row.pop("run")}, code, row, models)


def summary(rows: list[dict]) -> str:
    """Median seconds per phase (rows) for each checkout and mode (columns); ``shared start``
    (a warm batch's ``ray start``, counted on its first run): the longest."""
    groups = list(dict.fromkeys((r["checkout"], r["mode"]) for r in rows))
    phases = [n for n, _ in PHASES] + [n for n, _ in LOCAL_PHASES]
    names = ["shared start", *dict.fromkeys(phases), "to round 1 start", "to round 1", "total"]
    head = "| phase | " + " | ".join(f"{c} {m} (median s)" for c, m in groups) + " |"
    lines = [head, "|---" * (len(groups) + 1) + "|"]
    for name in names:
        cells = []
        for group in groups:
            values = [r[name] for r in rows if (r["checkout"], r["mode"]) == group and name in r]
            pick = max if name == "shared start" else statistics.median  # once per batch
            cells.append(f"{pick(values):.2f}" if values else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    runs = [f"{sum(1 for r in rows if (r['checkout'], r['mode']) == g)}" for g in groups]
    lines.append("| runs | " + " | ".join(runs) + " |")
    return "\n".join(lines) + "\n"


def models_line(rows: list[dict]) -> str:
    """Whether every run wrote the same model files, bit for bit."""
    digests = {r["models"] for r in rows if r["exit"] == 0}
    failed = sum(1 for r in rows if r["exit"] != 0)
    same = "yes" if len(digests) == 1 else f"no ({len(digests)} different sets)"
    names = ", ".join(sorted(json.loads(next(iter(digests))))) if digests else "none"
    return f"Same models in every finished run ({names}): **{same}**; failed runs: {failed}.\n"


#: The modules a run imports at its start, each timed in a fresh interpreter (``--imports``).
APP_MODULES = ("server.server_app", "clients.client_app")


def time_import(checkout: Path, module: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of ``import module`` in a fresh interpreter run
    from ``checkout`` (CPU time counts what the import costs even on a busy machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=checkout, check=True,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(wall, 3), round(cpu, 3)


def import_table(checkouts: list[tuple[str, Path]], repeats: int) -> tuple[list[dict], str]:
    """Each app module imported ``repeats`` times per checkout, alternating: the rows and the
    markdown table of medians."""
    rows = []
    for repeat in range(repeats):
        for label, checkout in checkouts if repeat % 2 == 0 else checkouts[::-1]:
            for module in APP_MODULES:
                wall, cpu = time_import(checkout, module)
                load = round(os.getloadavg()[0], 2)
                rows.append({"module": module, "checkout": label, "wall": wall, "cpu": cpu,
                             "load": load})  # fmt: skip
    lines = ["| import | checkout | median wall s | median CPU s |", "|---|---|---|---|"]
    for module in APP_MODULES:
        for label, _ in checkouts:
            mine = [r for r in rows if (r["module"], r["checkout"]) == (module, label)]
            wall = statistics.median(r["wall"] for r in mine)
            cpu = statistics.median(r["cpu"] for r in mine)
            lines.append(f"| `{module}` | {label} | {wall:.2f} | {cpu:.2f} |")
    return rows, "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.benchmarks.start_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--baseline", type=Path, help="the checkout to compare with")
    parser.add_argument("--config", default="simulations/digits.toml", help="the run (main job)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every checkout (2)")
    parser.add_argument("--cold", type=int, default=1, help="cold runs per checkout and round (1)")
    parser.add_argument("--warm", type=int, default=3, help="warm runs per batch (3; 0: none)")
    parser.add_argument(
        "--local", type=int, default=0, help="--engine local runs of this checkout per round (0)"
    )
    parser.add_argument("--wrap", default="", help="command prefix of each cold run / warm batch")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument(
        "--imports", type=int, default=0, help="also time the app imports this many times (0)"
    )
    parser.add_argument("--warm-batch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkout", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.warm_batch:
        return warm_batch(args)
    checkouts = [("this", PROJECT_ROOT)]
    if args.baseline is not None:
        checkouts.insert(0, ("baseline", args.baseline.resolve()))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.imports:
        write_imports(args.output_dir, *import_table(checkouts, args.imports))
    if args.rounds == 0:
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="start-cost-"))
    rows: list[dict] = []
    for repeat in range(1, args.rounds + 1):
        order = checkouts if repeat % 2 else checkouts[::-1]
        for label, checkout in order:
            for _ in range(args.cold):
                cold(args, checkout, label, rows, repeat, scratch)
                write(args.output_dir, rows)  # the tables so far, after every run
            for _ in range(args.local if label == "this" else 0):
                local(args, checkout, label, rows, repeat, scratch)
                write(args.output_dir, rows)
        for label, checkout in order if args.warm else ():
            warm(args, checkout, label, rows, repeat, scratch)
            write(args.output_dir, rows)
    shutil.copytree(scratch, args.output_dir / "logs", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("out"))  # fmt: skip
    shutil.rmtree(scratch)
    return 0


def write_imports(output_dir: Path, rows: list[dict], table: str) -> None:
    with (output_dir / "start_imports.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    loads = [r["load"] for r in rows]
    table += f"\nLoad average (1 min) during the imports: {min(loads):.2f} to {max(loads):.2f}.\n"
    (output_dir / "start_imports.md").write_text(table, encoding="utf-8")
    print(table, end="")


def write(output_dir: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with (output_dir / "start_cost.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    loads = [r["load"] for r in rows]
    text = summary(rows) + "\n" + models_line(rows)
    sessions = [r["ray sessions"] for r in rows if "ray sessions" in r]
    if sessions:
        text += (
            f"\nRay sessions in a warm batch's Ray folder after its runs: at most {max(sessions)} "
            "(1: every warm run attached to the batch's Ray, none started its own).\n"
        )
    text += f"\nLoad average (1 min) at the runs' ends: {min(loads):.2f} to {max(loads):.2f}.\n"
    (output_dir / "start_cost.md").write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
