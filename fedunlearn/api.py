"""A Python API for notebooks and scripts: :class:`Experiment` launches, :class:`Run` reads.

An :class:`Experiment` is a run config (a TOML file, as ``fedunlearn-run CONFIG`` reads, and/or
keywords: ``num_clients=10`` is the key ``num-clients``), validated when it is built exactly as
``fedunlearn-run`` validates it (:func:`simulations.run.check_run`: the keys, the data, the run
directory), so a bad key or value raises :class:`~fedunlearn.errors.ConfigError` naming it.
:meth:`Experiment.train` launches it through ``fedunlearn-run``'s own steps (the SuperLink,
``flwr run``, the retries, the streamed progress lines) and returns the finished :class:`Run`;
:meth:`Run.forget` sends an ``unlearn-only`` request to it the same way. A :class:`Run` reads a run
directory's tables as pandas DataFrames; :meth:`Run.open` opens one on disk after checking that it
is a run whose records pass their checks (:mod:`fedunlearn.store.run_check`).

Examples
--------
>>> from fedunlearn import Experiment
>>> run = Experiment(dataset="digits", num_clients=4, rounds=2, unlearn_clients="").train()
>>> run.metrics.test_accuracy.iloc[-1]          # doctest: +SKIP
>>> request = run.forget(clients=[1], methods="federaser,fedretrain")
>>> request.comparison[["method", "test_accuracy", "did"]]  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedunlearn.errors import ConfigError, FedUnlearnError

__all__ = ["Experiment", "Launch", "Run", "RunFailed", "run_config_keys"]

#: Files that make a folder a run directory (written first, by ``RunDirectory.create``).
RUN_FILES = ("identity.json", "config.json")
#: The largest table or JSON file a :class:`Run` reads (a run's tables are kilobytes).
MAX_TABLE_BYTES = 256 << 20


class RunFailed(FedUnlearnError, RuntimeError):
    """A launched run did not finish: the message says why (as ``fedunlearn-run`` says it)."""


def run_config_keys(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """Run-config keys for Python keywords: ``num_clients`` is ``num-clients``; a key already
    spelled with ``-`` stays as it is; every value passes through unchanged (validation judges
    it)."""
    return {str(name).replace("_", "-"): value for name, value in keywords.items()}


@dataclass(frozen=True)
class Launch:
    """How runs are launched: ``fedunlearn-run``'s options and the API's own.

    Parameters
    ----------
    quiet : bool, default False
        Show nothing of the run's progress (errors still raise, naming the cause).
    verbose : bool, default False
        Also show Flower's and Ray's lines (``fedunlearn-run --verbose``).
    python_path : tuple of str, default ()
        Folders put first on ``PYTHONPATH`` of ``flwr run`` and the local SuperLink it starts (its
        ServerApp and Ray workers inherit it), and on this process's ``sys.path``: where a module of
        yours that the run config names is found. A SuperLink already running keeps the environment
        it was started with.
    num_cpus, num_gpus : float, default 1.0, 0.0
        CPUs and GPU fraction per virtual client (``--num-cpus``, ``--num-gpus``).
    start_timeout : float or None, default None
        ``--start-timeout``: seconds to wait for the SuperLink and Ray on a busy machine.
    app : str or None, default None
        The Flower App folder (``--app``); None: this project.
    """

    quiet: bool = False
    verbose: bool = False
    python_path: tuple[str, ...] = field(default=())
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    start_timeout: float | None = None
    app: str | None = None

    def arguments(self, config: str | Path | None) -> argparse.Namespace:
        """``fedunlearn-run``'s parsed command line for ``config`` and these options."""
        from simulations.run_parser import parser

        args = parser().parse_args([])
        args.config = None if config is None else Path(config)
        args.num_cpus, args.num_gpus = self.num_cpus, self.num_gpus
        args.start_timeout, args.verbose = self.start_timeout, self.verbose
        if self.app is not None:
            args.app = Path(self.app)
        return args

    def folders(self) -> list[str]:
        """:attr:`python_path` as absolute folders, each one checked to exist."""
        folders = []
        for entry in self.python_path:
            folder = Path(entry).expanduser().resolve()
            if not folder.is_dir():
                raise ConfigError("python_path", str(entry), "folders that exist")
            folders.append(str(folder))
        return folders


def _launch_options(options: Mapping[str, Any]) -> Launch:
    """A :class:`Launch` of keyword options; ``python_path`` may be one folder or several."""
    path = options.get("python_path", ())
    if isinstance(path, (str, os.PathLike)):
        path = (path,)
    return Launch(**{**options, "python_path": tuple(str(p) for p in path)})


class Experiment:
    """A run config, validated as ``fedunlearn-run`` validates it, ready to train.

    Parameters
    ----------
    config : str or Path, optional
        A flat TOML run-config file (``fedunlearn-run CONFIG``); keywords are set over it.
    quiet, verbose, python_path, num_cpus, num_gpus, start_timeout, app
        How it is launched (:class:`Launch`).
    **keys
        Run-config keys (docs/configuration.md): Python names (``num_clients=10``) or the keys
        themselves (``**{"unlearn-clients": "2"}``); values are passed on unchanged.

    Raises
    ------
    ConfigError
        A key, value, the data or the run directory that ``fedunlearn-run`` would refuse.
    """

    def __init__(
        self,
        config: str | Path | None = None,
        *,
        quiet: bool = False,
        verbose: bool = False,
        python_path: Iterable[str | os.PathLike] = (),
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        start_timeout: float | None = None,
        app: str | Path | None = None,
        **keys: Any,
    ) -> None:
        options = dict(quiet=quiet, verbose=verbose, python_path=python_path, num_cpus=num_cpus)
        options |= dict(num_gpus=num_gpus, start_timeout=start_timeout, app=app)
        self.launch = _launch_options(options)
        self.config_file = None if config is None else Path(config)
        self.keys = run_config_keys(keys)
        #: The validated configuration (:class:`fedunlearn.config.ExperimentConfig`).
        self.config = _checked(self.launch, self.config_file, self.keys)[0]

    def __repr__(self) -> str:
        keys = ", ".join(f"{k}={v!r}" for k, v in self.keys.items())
        source = f"{str(self.config_file)!r}, " if self.config_file else ""
        return f"Experiment({source}{keys})"

    def with_keys(self, **keys: Any) -> Experiment:
        """A new, validated experiment: these keys set over this one's."""
        options = {name: getattr(self.launch, name) for name in Launch.__dataclass_fields__}
        merged = {**self.keys, **run_config_keys(keys)}
        return Experiment(self.config_file, **options, **merged)

    def train(self) -> Run:
        """Launch the run (train, then what the config asks: unlearning, certified head, ...)
        through ``fedunlearn-run``'s steps; returns the finished :class:`Run`.

        Raises
        ------
        RunFailed
            The run did not finish (the message quotes why); :class:`ConfigError` when the
            config no longer passes its checks (e.g. the run directory was made meanwhile).
        """
        keys = dict(self.keys)
        if not self.config.run_name:  # named here, so that the run directory is known
            keys["run-name"] = self.config.run_directory().name
        return _launch(self.launch, self.config_file, keys)

    run = train

    def judge(self, models: int = 16, **keys: Any) -> Run:
        """Train ``models`` federations as one stack and judge every unlearning method
        (``judge-models``, docs/judge.md; other judge keys as keywords, e.g.
        ``judge_backdoor=True``); the tables are :attr:`Run.judge`."""
        return self.with_keys(judge_models=models, **keys).train()


def _checked(launch: Launch, config: Path | None, keys: Mapping[str, Any]):
    """``fedunlearn-run``'s checks of ``config`` with ``keys`` set over it: (the
    :class:`ExperimentConfig`, the run-config text, the parsed arguments)."""
    from simulations.run import check_run

    _on_sys_path(launch.folders())
    args = launch.arguments(config)
    checked, text = check_run(args, keys)
    return checked, text, args


def _on_sys_path(folders: list[str]) -> None:
    """Put ``folders`` first on this process's ``sys.path`` (the checks import what they name)."""
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def _launch(launch: Launch, config: Path | None, keys: Mapping[str, Any]) -> Run:
    """Check, then run, with ``fedunlearn-run``'s steps; the finished run, or :class:`RunFailed`."""
    from simulations import run as launcher

    checked, text, args = _checked(launch, config, keys)
    search_path = launcher.flower_search_path()
    if shutil.which("flwr", path=search_path) is None:
        raise RunFailed("the `flwr` command was not found (pip install -e .)")
    env = launcher.run_environment(args, search_path, launch.folders())
    _say_if_superlink_lacks(launch.folders(), env)
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        out = devnull if launch.quiet else sys.stdout
        try:
            outcome = launcher.run_checked(args, checked, text, env, out=out)
        except launcher.RunInterrupted as interrupted:
            launcher.stop_interrupted(interrupted, [], env)
            raise KeyboardInterrupt from None
        except launcher.StartFailure as failure:
            raise RunFailed(str(failure)) from None
    code, said = launcher.verdict(outcome, launch.verbose)
    if code != 0:
        raise RunFailed(said or f"flwr run exited with status {code}")
    return Run(checked.run_directory(), launch)


#: The ``python_path`` folders of each local SuperLink (by its home) this process saw start.
_SUPERLINK_FOLDERS: dict[str, set[str]] = {}


def _say_if_superlink_lacks(folders: list[str], env: Mapping[str, str]) -> None:
    """Warn when ``folders`` may not reach the run: the local SuperLink is already up and was not
    started by this process with them (it keeps the environment it started with, and its
    ServerApp and Ray workers inherit that one)."""
    from simulations.local_superlink import LOCAL_ADDRESSES, LocalSuperLink, default_address

    address = default_address(env)
    if address not in LOCAL_ADDRESSES or not (folders or _SUPERLINK_FOLDERS):
        return  # a deployment (its machines' environments are their own), or nothing to track
    superlink = LocalSuperLink.of(env, address)
    known = _SUPERLINK_FOLDERS.get(str(superlink.home))
    if not superlink.is_up():
        _SUPERLINK_FOLDERS[str(superlink.home)] = set(folders)  # the launch starts it with them
    elif folders and (known is None or not set(folders) <= known):
        print(
            f"fedunlearn: the local SuperLink (port {superlink.http_port}) was already running: "
            "the run sees python_path only if it was started with it; if the run cannot import "
            "your module, stop that SuperLink by its process id (README: The local SuperLink)",
            file=sys.stderr,
            flush=True,
        )


class Run:
    """A run directory's results, read when asked (each property reads its file again).

    Build one with :meth:`open`, or get one from :meth:`Experiment.train` and :meth:`forget`.
    """

    def __init__(self, path: Path, launch: Launch | None = None) -> None:
        #: The run directory.
        self.path = Path(path)
        self.launch = launch or Launch()

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @classmethod
    def open(cls, path: str | os.PathLike, **launch: Any) -> Run:
        """The run in ``path``, after checking that it is one: a folder holding a run's
        ``identity.json`` and ``config.json`` whose records (logs, models, the store's index)
        all pass their checks. ``launch``: options of later requests (:class:`Launch`).

        Raises
        ------
        ConfigError
            ``path`` is not a run directory, or a record of it fails its check.
        """
        from fedunlearn.store.run_check import run_problems

        folder = Path(path).expanduser()
        missing = [name for name in RUN_FILES if not (folder / name).is_file()]
        if not folder.is_dir() or missing:
            found = "no folder" if not folder.is_dir() else f"no {', '.join(missing)}"
            allowed = f"a run directory written by a fedunlearn run ({' and '.join(RUN_FILES)})"
            raise ConfigError("path", str(path), f"{allowed}; {found} there")
        problems, _ = run_problems(folder, blobs=False)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ConfigError(
                "path",
                str(path),
                f"a run whose records all pass their checks; {problems[0]}{more} "
                f"(`fedunlearn store verify {folder}` lists every problem)",
            )
        return cls(folder.resolve(), _launch_options(launch))

    # ------------------------------------------------------------------ tables
    @property
    def config(self) -> dict[str, Any]:
        """The run's validated configuration (``config.json``)."""
        return _json(self.path / "config.json")

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json``: final accuracy, retained rounds, store size, time, refusals."""
        return _json(self.path / "summary.json")

    @property
    def metrics(self):
        """``metrics.csv``: one row per round (test accuracy and loss, train loss, ...)."""
        return self._table("metrics.csv")

    @property
    def comparison(self):
        """``unlearning.csv`` of the latest request: one row per method (the original
        ``fedavg`` first) with its accuracy, cost, ``did`` and ``flag``; None before one."""
        return self._table("unlearning.csv", optional=True)

    @property
    def certified(self):
        """``certified_removal.csv``: the certified head's accuracy and beta per request
        (None without a certified head)."""
        return self._table("certified_removal.csv", optional=True)

    @property
    def judge(self):
        """``judge.csv``: the judge's table per population (None when the run was no judge run)."""
        return self._table("judge.csv", optional=True)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Each finished unlearning request (``unlearning_log.jsonl``), checked against the run."""
        from fedunlearn.store.run_directory import UNLEARNING_LOG, RunDirectory

        if not (self.path / UNLEARNING_LOG).is_file():
            return []
        return RunDirectory(self.path).read_log(UNLEARNING_LOG)

    @property
    def figures(self) -> dict[str, Path]:
        """Every figure of the run: name (the file's stem) -> path of its PNG."""
        return {png.stem: png for png in sorted(self.path.glob("*.png")) if _plain_file(png)}

    def _table(self, name: str, *, optional: bool = False):
        import pandas as pd

        path = self.path / name
        if optional and not path.exists():
            return None
        _check_readable(path)
        return pd.read_csv(path)

    # ------------------------------------------------------------------ requests
    def forget(
        self, clients: Iterable[int], methods: str | Iterable[str] | None = None, **keys: Any
    ) -> Run:
        """Forget ``clients`` (partition ids) from this finished run: an ``unlearn-only``
        request launched as ``fedunlearn-run --set unlearn-only=true`` launches it, with the
        run's own data settings. ``methods``: ``unlearn-methods`` (e.g.
        ``"federaser,fedretrain"``); ``keys``: the request's other keys, e.g.
        ``certified_head=True, certified_remove_clients="1"`` (the certified head removes the
        client's data too), or ``scrub=True, scrub_forget="class:3"`` (a class or samples,
        scrubbed in the same request). Returns this run, its tables now the request's.
        """
        request = {"unlearn-only": True, "unlearn-clients": _id_list(clients)}
        if methods is not None:
            names = [methods] if isinstance(methods, str) else list(methods)
            request["unlearn-methods"] = ",".join(names)
        request |= run_config_keys(keys)
        location = {"output-dir": str(self.path.parent), "run-name": self.path.name}
        return _launch(self.launch, None, {**request, **location})


def _id_list(clients: Iterable[int] | int | str) -> str:
    """``unlearn-clients`` for ``clients``: "1,3" for [1, 3]; a text is passed on as it is."""
    if isinstance(clients, str):
        return clients
    if isinstance(clients, int):
        return str(clients)
    return ",".join(str(client) for client in clients)


def _plain_file(path: Path) -> bool:
    """A regular file, not a link (a run directory is untrusted: a link may lead anywhere)."""
    return path.is_file() and not path.is_symlink()


def _check_readable(path: Path) -> None:
    """Refuse a file the run should hold as a small regular file."""
    if not _plain_file(path):
        found = "a link" if path.is_symlink() else "missing or not a file"
        raise ConfigError("path", str(path), f"a file of the run ({found})")
    size = path.stat().st_size
    if size > MAX_TABLE_BYTES:
        raise ConfigError("path", str(path), f"a table of at most {MAX_TABLE_BYTES} bytes ({size})")


def _json(path: Path) -> dict[str, Any]:
    _check_readable(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError("path", str(path), f"a JSON file ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError("path", str(path), "a JSON object")
    return value
