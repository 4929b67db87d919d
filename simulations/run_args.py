"""``fedunlearn-run``'s console script: the command line is parsed before anything heavy is
imported, so ``--help`` and ``--version`` answer at once (the launcher itself,
:mod:`simulations.run`, imports PyTorch, and is imported only to launch). The parser is
:mod:`simulations.run_parser`, which the launcher uses too.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulations.run_parser import PROJECT_ROOT, parser

__all__ = ["PROJECT_ROOT", "main", "parser"]


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``fedunlearn-run``."""
    args = parser().parse_args(argv)
    from simulations.run import launch

    return launch(args, argv)
