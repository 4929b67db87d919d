"""Benchmark scripts: each reproduces a section of ``RESULTS.md`` from one command.

They find a local copy of the datasets through ``--data-root``, which defaults to
:func:`default_data_root`.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where ``fedunlearn data download NAME`` puts a dataset unless told otherwise.
HOME_DATA_ROOT = Path("~/data")


def default_data_root(*, must_exist: bool = False) -> str | None:
    """``$FEDUNLEARN_DATA_ROOT`` when set, else ``~/data``.

    With ``must_exist`` the home folder is returned only when it is there: a script whose run
    config may be the embedded digits passes no data root at all rather than a missing folder,
    which the run would refuse.
    """
    from_environment = os.environ.get("FEDUNLEARN_DATA_ROOT")
    if from_environment:
        return from_environment
    home = HOME_DATA_ROOT.expanduser()
    if must_exist and not home.is_dir():
        return None
    return str(home)
