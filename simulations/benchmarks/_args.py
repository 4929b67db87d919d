"""The command-line arguments the benchmarks share (:func:`common_args`), each added with the same
flag, type and default wherever a benchmark has it."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulations.benchmarks import default_data_root
from simulations.run_parser import PROJECT_ROOT

#: ``--data-root``'s help where it defaults to :func:`default_data_root` (``must_exist``).
DATA_ROOT_HELP = "dataset root (default: $FEDUNLEARN_DATA_ROOT, else ~/data when it exists)"


def common_args(
    parser: argparse.ArgumentParser,
    output_dir: str | Path | None,
    *,
    output_help: str | None = None,
    data_root: bool = True,
    data_root_help: str | None = DATA_ROOT_HELP,
    force: bool = False,
    extra_set: str | None = None,
    app: bool = False,
    summarize_only: str | None = None,
) -> argparse.ArgumentParser:
    """Add the shared arguments to ``parser`` and return it.

    * ``--output-dir`` (a Path): ``output_dir`` by default, required when ``output_dir`` is None;
    * ``--data-root`` unless ``data_root`` is false: ``$FEDUNLEARN_DATA_ROOT``, else ``~/data``
      when it exists, else None (:func:`default_data_root` with ``must_exist``);
    * ``--force`` (write into a non-empty ``--output-dir``) when ``force``;
    * ``--set KEY=VALUE`` (repeatable; help "extra key=value ``extra_set``") when ``extra_set``;
    * ``--app`` (the Flower app folder, default the project root) and ``--engine`` (each run's
      ``fedunlearn-run --engine``: flower or local) when ``app``;
    * ``--summarize-only`` (a flag; ``summarize_only`` is its help, "" for none) unless None.
    """
    if data_root:
        parser.add_argument(
            "--data-root", default=default_data_root(must_exist=True), help=data_root_help
        )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None if output_dir is None else Path(output_dir),
        required=output_dir is None,
        help=output_help,
    )
    if force:
        parser.add_argument(
            "--force", action="store_true", help="write into a non-empty --output-dir"
        )
    if extra_set is not None:
        parser.add_argument(
            "--set", action="append", default=[], help=f"extra key=value {extra_set}"
        )
    if app:
        parser.add_argument("--app", type=Path, default=PROJECT_ROOT)
        parser.add_argument(
            "--engine",
            choices=("flower", "local"),
            default="flower",
            help="each run's engine (fedunlearn-run --engine): flower (a SuperLink and Ray per "
            "run) or local (no SuperLink, no Ray: a run starts in seconds)",
        )
    if summarize_only is not None:
        parser.add_argument("--summarize-only", action="store_true", help=summarize_only or None)
    return parser
