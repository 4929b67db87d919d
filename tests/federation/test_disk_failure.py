"""A full disk, a quota or a read-only file system during a run: one line naming the path and how
to resume, never a bare OSError; any other OSError keeps its traceback."""

from __future__ import annotations

import errno

import pytest

from fedunlearn.errors import FedUnlearnError
from server.server_app import disk_failure


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_or_read_only_disk_says_which_path_and_how_to_resume(code):
    bare = OSError(code, "No space left on device")  # what a failed write() raises: no filename
    failure = disk_failure(bare, "/runs/digits-a")
    assert isinstance(failure, FedUnlearnError)
    assert "/runs/digits-a" in str(failure) and "resume=true" in str(failure)
    named = OSError(code, "No space left on device", "/runs/digits-a/store/index.sqlite")
    assert "/runs/digits-a/store/index.sqlite" in str(disk_failure(named, "/runs/digits-a"))


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.ENOENT])
def test_any_other_os_error_is_left_to_its_traceback(code):
    assert disk_failure(OSError(code, "x"), "/runs/a") is None
