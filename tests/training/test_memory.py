"""The server's RSS readings recorded in metrics.csv follow real allocations."""

from __future__ import annotations

import sys

import pytest

from fedunlearn.memory import MB, current_rss_bytes, megabytes, peak_rss_bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_rss_follows_an_allocation_and_the_peak_keeps_it():
    before = current_rss_bytes()
    block = bytearray(200 * MB)  # zero-filled: every page is touched
    during = current_rss_bytes()
    assert during - before > 150 * MB
    assert peak_rss_bytes() > before + 150 * MB  # (the kernel updates the peak lazily)
    del block
    assert peak_rss_bytes() > before + 150 * MB  # a peak never goes down


def test_megabytes_keeps_an_unknown_reading_numeric():
    assert megabytes(3 * MB) == 3.0
    assert megabytes(None) != megabytes(None)  # NaN
