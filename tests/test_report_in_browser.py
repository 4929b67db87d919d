"""The report page of a real finished run, opened in headless Chromium: the DOM the browser built
holds every figure of the run (its very bytes, at its size) and every method row of the
comparison, and the full-page screenshot is neither blank nor shorter than the figures."""

from __future__ import annotations

import pytest

from simulations.benchmarks.report_in_browser import CHROMIUM, check_in_browser, figures_height


@pytest.mark.deployment
@pytest.mark.skipif(
    not CHROMIUM.is_file(), reason=f"no headless browser at {CHROMIUM} (apt-get install chromium)"
)
def test_the_report_shows_every_figure_and_the_comparison_in_chromium(finished_run, tmp_path):
    assert check_in_browser(finished_run, tmp_path) == []
    from PIL import Image

    with Image.open(tmp_path / "report.png") as shot:
        assert shot.width == 1400 and shot.height >= figures_height(finished_run)
    assert "fedretrain" in (tmp_path / "report.dom.html").read_text(encoding="utf-8")
