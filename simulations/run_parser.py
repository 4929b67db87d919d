"""``fedunlearn-run``'s command-line parser: light (no PyTorch), so that the console script
(:mod:`simulations.run_args`) answers ``--help`` and ``--version`` at once; the launcher
(:mod:`simulations.run`) parses with it too."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedunlearn import __version__

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DESCRIPTION = (
    "fedunlearn-run: launch a run configuration on the local simulation with the right federation."
)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedunlearn-run",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedunlearn-run {__version__}")
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
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to wait for the local SuperLink and Ray to start on a busy machine, "
        "trying again within it (default: $FEDUNLEARN_START_TIMEOUT, else 300)",
    )
    parser.add_argument(
        "--engine",
        choices=("flower", "local"),
        default="flower",
        help="flower: Flower's simulation (flwr run: a local SuperLink, Ray); local: the same "
        "ServerApp and ClientApp in worker processes of this command, no SuperLink and no Ray, "
        "a run that starts in seconds (simulations.local_engine)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show Flower's log lines and Ray's warnings (hidden by default)",
    )
    return parser
