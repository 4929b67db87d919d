"""Flower's local SuperLink, started and awaited by ``fedunlearn-run`` itself, for as long as it takes.

``flwr run`` starts a local SuperLink when its connection is ``:local:`` (the default) and none
answers on ``127.0.0.1:39091``, then gives it 15 s (``flwr.cli.constant.LOCAL_SUPERLINK_STARTUP_TIMEOUT``,
a constant, no setting), kills it and prints "Failed to start local SuperLink within 15s". On a busy
machine a SuperLink (a Python process importing Flower, gRPC and SQLAlchemy) takes longer than that.
So ``fedunlearn-run`` starts the same SuperLink (Flower's command, ports and files, detached as
Flower detaches it) and waits up to ``--start-timeout`` seconds for its health endpoint; ``flwr run``
then finds it up and uses it. A SuperLink that is already up (started earlier, by anyone) is used as
it is. A connection with an address of its own (a deployment) is left to ``flwr run``.

The same environment reaches Ray through the SuperLink: :func:`launch_environment` raises Ray's
request timeouts to the GCS (``RAY_gcs_server_request_timeout_seconds``,
``RAY_gcs_rpc_server_reconnect_timeout_s``, 60 s by default) to ``--start-timeout`` unless they are
set. Ray's wait for its raylet (30 s, in ``ray._private.node``) is a constant too: a run whose Ray did
not start is tried again by :mod:`simulations.attempts`.

Nothing here imports Flower: the launcher's checks stay fast, and ``--dry-run`` never gets here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The addresses with which ``flwr run`` manages a local SuperLink itself.
LOCAL_ADDRESSES = (":local:", ":local-in-memory:")
#: How long ``fedunlearn-run`` waits, by default, for the SuperLink and for Ray to start
#: (``--start-timeout``, or the ``FEDUNLEARN_START_TIMEOUT`` environment variable).
DEFAULT_START_TIMEOUT = 300.0
START_TIMEOUT_VARIABLE = "FEDUNLEARN_START_TIMEOUT"
#: Ray's timeouts for requests to its GCS, raised to the start timeout when not set.
RAY_TIMEOUT_VARIABLES = (
    "RAY_gcs_server_request_timeout_seconds",
    "RAY_gcs_rpc_server_reconnect_timeout_s",
)
#: How long ``flwr run`` alone waits for the local SuperLink it starts.
FLOWER_START_TIMEOUT = 15.0
#: Seconds one health probe may take (Flower's own probe gives up after 0.4 s).
PROBE_TIMEOUT = 3.0
PROBE_INTERVAL = 0.5


class StartFailure(Exception):
    """The local SuperLink or Ray did not start: the message names the cause and what to do."""


@dataclass(frozen=True)
class LocalSuperLink:
    """Where the local SuperLink of the environment ``environ`` listens and keeps its files."""

    home: Path
    http_port: str
    control_port: str
    in_memory: bool = False

    @classmethod
    def of(cls, environ: Mapping[str, str], address: str) -> LocalSuperLink:
        """The local SuperLink ``flwr run`` would start for ``address`` (one of
        :data:`LOCAL_ADDRESSES`), with Flower's defaults and environment variables."""
        return cls(
            home=flower_home(environ) / "local-superlink",
            http_port=environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091"),
            control_port=environ.get("FLWR_LOCAL_CONTROL_API_PORT", "39093"),
            in_memory=address == LOCAL_ADDRESSES[1],
        )

    @property
    def log_file(self) -> Path:
        return self.home / "superlink.log"

    def command(self) -> list[str]:
        """Flower's own command for it (``flwr.cli.local_superlink._start_local_superlink``)."""
        command = ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess"]
        command += ["--control-api-address", f"127.0.0.1:{self.control_port}"]
        command += [
            "--host",
            "127.0.0.1",
            "--port",
            self.http_port,
            "--log-file",
            str(self.log_file),
        ]
        command += ["--log-rotation-interval-hours", "24", "--log-rotation-backup-count", "7"]
        if not self.in_memory:
            command += ["--database", str(self.home / "state.db")]
        return command

    def is_up(self) -> bool:
        """Whether its health endpoint answers (as Flower asks, with more patience)."""
        url = f"http://127.0.0.1:{self.http_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT) as response:
                return 200 <= response.status < 300
        except (OSError, urllib.error.URLError, ValueError):
            return False


def flower_home(environ: Mapping[str, str]) -> Path:
    """Flower's folder: ``FLWR_HOME``, else ``~/.flwr``."""
    home = environ.get("FLWR_HOME")
    return Path(home) if home else Path.home() / ".flwr"


def default_address(environ: Mapping[str, str]) -> str | None:
    """The address of the connection ``flwr run APP`` uses (its config's default one); ``:local:``
    when there is no config yet (Flower writes one with that default); None when it cannot be read
    (``flwr run`` then says why)."""
    path = flower_home(environ) / "config.toml"
    if not path.is_file():
        return LOCAL_ADDRESSES[0]
    try:
        superlink = tomllib.loads(path.read_text(encoding="utf-8")).get("superlink", {})
        connection = superlink.get(superlink.get("default", ""), {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return None
    if not isinstance(connection, dict):
        return None
    if "address" not in connection and "options" in connection:  # Flower's deprecated local form
        return LOCAL_ADDRESSES[0]
    address = connection.get("address")
    return address if isinstance(address, str) else None


def start_timeout(value: float | None, environ: Mapping[str, str]) -> float:
    """``--start-timeout`` when given, else ``FEDUNLEARN_START_TIMEOUT``, else the default."""
    if value is not None:
        return value
    text = environ.get(START_TIMEOUT_VARIABLE, "")
    try:
        return float(text) if text else DEFAULT_START_TIMEOUT
    except ValueError:
        return DEFAULT_START_TIMEOUT


def launch_environment(environ: Mapping[str, str], timeout: float) -> dict[str, str]:
    """``environ`` with Ray's GCS timeouts raised to ``timeout`` seconds where not set."""
    env = dict(environ)
    for name in RAY_TIMEOUT_VARIABLES:
        env.setdefault(name, str(max(60, round(timeout))))
    return env


def machine_load() -> str:
    """``load average 9.1 on 2 cores`` (the last minute's), for a message."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return f"{os.cpu_count()} cores"
    return f"load average {load:.1f} on {os.cpu_count()} cores"


def give_up_hint(timeout: float) -> str:
    """What to do when something did not start within ``timeout`` seconds."""
    longer = max(2 * timeout, DEFAULT_START_TIMEOUT)
    return (
        f"a busy machine needs longer ({machine_load()} now): run the command again, or give it "
        f"longer with --start-timeout {longer:.0f} (or {START_TIMEOUT_VARIABLE}={longer:.0f})"
    )


def _say_if_slow(seconds: float) -> None:
    """Tell when the SuperLink took longer than ``flwr run`` alone would have waited."""
    if seconds > FLOWER_START_TIMEOUT:
        print(
            f"fedunlearn-run: the local SuperLink took {seconds:.0f} s to start "
            f"(flwr run alone waits {FLOWER_START_TIMEOUT:.0f} s; {machine_load()})",
            file=sys.stderr,
            flush=True,
        )


def listening_process(port: str, proc: Path = Path("/proc")) -> tuple[int, list[str]] | None:
    """``(process id, command line)`` of the process listening on TCP ``port`` (read from Linux's
    ``/proc``); None where ``/proc`` does not tell (another system, another user's process)."""
    sockets = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == int(port)
            ):
                sockets.add(f"socket:[{fields[9]}]")
    for process in proc.iterdir() if sockets else ():
        if not process.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in sockets for fd in (process / "fd").iterdir()):
                argv = (process / "cmdline").read_bytes().split(b"\0")
                return int(process.name), [part.decode(errors="replace") for part in argv if part]
        except OSError:
            continue
    return None


def check_environment(superlink: LocalSuperLink, proc: Path = Path("/proc")) -> None:
    """A SuperLink already up runs runs with its own environment's packages: one whose Python or
    ``flower-superlink`` no longer exists (its virtual environment deleted) cannot start a run
    (``flwr run`` would wait for it for ever), so it is a :class:`StartFailure` naming its process;
    one from another environment gets a warning naming it."""
    found = listening_process(superlink.control_port, proc)
    if found is None:
        return
    pid, argv = found
    paths = [Path(part) for part in argv[:2] if part.startswith("/")]
    gone = [str(path) for path in paths if not path.exists()]
    if gone:
        raise StartFailure(
            f"the local SuperLink on port {superlink.control_port} (process {pid}) runs from "
            f"{gone[0]}, which no longer exists: it cannot start a run; stop it (kill {pid}) and run "
            "the command again"
        )
    python = next((path for path in paths if path.name.startswith("python")), None)
    if python is not None and python.parent.parent.resolve() != Path(sys.prefix).resolve():
        print(
            f"fedunlearn-run: the local SuperLink (process {pid}) runs from {python.parent.parent}, "
            f"not this environment ({sys.prefix}): runs take their packages from there; stop it "
            f"(kill {pid}) to use this one",
            file=sys.stderr,
            flush=True,
        )


def ensure_local_superlink(
    environ: Mapping[str, str],
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> LocalSuperLink | None:
    """Start the local SuperLink of ``environ``'s default connection unless it is up, and wait up to
    ``timeout`` seconds for it; returns it (None when the connection is not a local one). Raises
    :class:`StartFailure` when it exits or does not answer in time (and then stops the process it
    started, by its id)."""
    address = default_address(environ)
    if address not in LOCAL_ADDRESSES:
        return None
    superlink = LocalSuperLink.of(environ, address)
    if superlink.is_up():
        check_environment(superlink)
        return superlink
    superlink.home.mkdir(parents=True, exist_ok=True)
    env = {**environ, "FLWR_DISABLE_UPDATE_CHECK": "1"}
    process = subprocess.Popen(
        superlink.command(),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # detached, as Flower starts it: it outlives this command
    )
    began = clock()
    deadline = began + timeout
    while clock() < deadline:
        if superlink.is_up():
            _say_if_slow(clock() - began)
            return superlink
        if process.poll() is not None:
            if superlink.is_up():  # another command's SuperLink won the port: use it
                return superlink
            raise StartFailure(
                f"the local SuperLink exited with code {process.returncode} while starting "
                f"(its log: {superlink.log_file}); run the command again"
            )
        sleep(PROBE_INTERVAL)
    process.kill()
    process.wait()
    raise StartFailure(
        f"the local SuperLink did not start within {timeout:.0f} s; {give_up_hint(timeout)} "
        f"(its log: {superlink.log_file})"
    )
