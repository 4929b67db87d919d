"""Build a run's report page and check it in a real headless browser (Chromium).

    python -m simulations.benchmarks.report_in_browser RUN [--out DIR] [--chromium PATH]

Writes ``DIR/report.html`` (``fedunlearn report RUN --out``; the run is not written to), renders
it with headless Chromium, and checks what the browser built, not the file:

* from the DOM Chromium dumps (``--dump-dom``): every figure of the run is one ``<img>`` whose data
  URI decodes to the very bytes of the run's PNG, with its width and height; each unlearning
  request's comparison table holds a row for every method of its CSV; no ``<script`` anywhere (the
  page has none of its own);
* from a screenshot of the whole page (``DIR/report.png``, cut below the last content row): not
  blank (many colours), and at least as tall as the figures stacked (each is a block).

Prints each check and exits 1 if one fails, 2 if Chromium cannot be found.
"""

from __future__ import annotations

import argparse
import base64
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from fedunlearn.reporting.html_report import request_tables, write_report
from fedunlearn.reporting.run_files import open_run, png_size

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
)
#: The window's width, and the page's content width in it (body: max 1320 px less 2 x 16 padding).
WIDTH, CONTENT_WIDTH = 1400, 1288
#: The tallest screenshot taken; a longer page fails the coverage check.
MAX_HEIGHT = 30000


class Dom(HTMLParser):
    """What the check needs of the dumped DOM: the images, and each section's first table's
    first-column cells."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.first_cells: dict[str, list[str]] = {}
        self.scripts = 0
        self._section = ""
        self._tables = 0
        self._column = -1
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "script":
            self.scripts += 1
        elif tag == "section":
            self._section, self._tables = attributes.get("id", ""), 0
        elif tag == "img":
            self.images.append({k: v or "" for k, v in attributes.items()})
        elif tag == "table":
            self._tables += 1
        elif tag == "tr":
            self._column = -1
        elif tag == "td" and self._tables == 1:
            self._column += 1
            self._cell = [] if self._column == 0 else None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.first_cells.setdefault(self._section, []).append("".join(self._cell))
            self._cell = None


def chromium(browser: Path, *arguments: str) -> subprocess.CompletedProcess:
    """Run headless Chromium with a new empty profile."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [str(browser), *FLAGS, f"--user-data-dir={profile}", *arguments],
            capture_output=True,
            text=True,
            timeout=180,
        )


def check_dom(run_path: Path, dom_text: str) -> list[str]:
    """The problems of the rendered DOM (empty: every check passed)."""
    run = open_run(run_path)
    dom = Dom()
    dom.feed(dom_text)
    problems = (
        [f"{dom.scripts} <script> element(s)"] if dom.scripts or "<script" in dom_text else []
    )
    by_name = {image.get("data-file"): image for image in dom.images}
    for name in run.figures():
        image = by_name.get(name)
        if image is None:
            problems.append(f"figure {name}: no <img>")
            continue
        problems += _image_problems(name, image, run.read_bytes(name, 1 << 30))
    if len(dom.images) != len(run.figures()):
        problems.append(f"{len(dom.images)} <img> for {len(run.figures())} figure(s)")
    for suffix, name in request_tables(run):
        section = f"unlearning-request-{suffix[1:] or '1'}"
        methods = [row["method"] for row in run.read_table(name).rows]
        shown = dom.first_cells.get(section, [])
        if shown != methods:
            problems.append(f"{name}: the page's table shows {shown}, the file {methods}")
    return problems


def _image_problems(name: str, image: dict[str, str], expected: bytes | None) -> list[str]:
    """What is wrong with the ``<img>`` of figure ``name`` (whose file holds ``expected``)."""
    prefix = "data:image/png;base64,"
    src = image.get("src", "")
    if not src.startswith(prefix):
        return [f"figure {name}: its src is no PNG data URI"]
    data = base64.b64decode(src.removeprefix(prefix), validate=True)
    if data != expected:
        return [f"figure {name}: its data URI is not the run's PNG"]
    shown = (int(image.get("width", -1)), int(image.get("height", -1)))
    if png_size(data) != shown:
        return [f"figure {name}: PNG {png_size(data)} shown as {shown}"]
    return []


def figures_height(run_path: Path) -> int:
    """The figures' height on the page: each a block, scaled down to the content width."""
    run = open_run(run_path)
    total = 0
    for name in run.figures():
        width, height = png_size(run.read_bytes(name, 1 << 30))
        total += int(height * min(1.0, CONTENT_WIDTH / width))
    return total


def screenshot(browser: Path, page: Path, target: Path, least: int) -> tuple[int, int, int]:
    """A screenshot of the whole page into ``target``: (content height, colours, window height).
    The window (first as tall as the figures and every table row) grows until blank rows end the
    page; the image is cut below its last content row."""
    from PIL import Image

    rows = page.read_text(encoding="utf-8").count("<tr")
    height = min(MAX_HEIGHT, least + 24 * rows + 2000)
    while True:
        done = chromium(
            browser, f"--window-size={WIDTH},{height}", f"--screenshot={target}", page.as_uri()
        )
        if done.returncode != 0 or not target.is_file():
            raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
        with Image.open(target) as image:
            grey = image.convert("L")
            box = Image.eval(grey, lambda v: 255 if v < 250 else 0).getbbox()
            bottom = box[3] if box else 0
            colours = len(image.convert("RGB").getcolors(1 << 24) or [])
            if bottom < height - 40 or height >= MAX_HEIGHT:
                image.crop((0, 0, WIDTH, min(height, bottom + 24))).save(target)
                return bottom, colours, height
        height = min(MAX_HEIGHT, height * 2)


def check_in_browser(run_path: Path, out: Path, browser: Path = CHROMIUM) -> list[str]:
    """Build the page into ``out``, render it, check it; the problems (empty: all passed)."""
    page = write_report(run_path, out / "report.html")
    done = chromium(browser, "--dump-dom", page.as_uri())
    if done.returncode != 0 or "<html" not in done.stdout:
        return [f"chromium --dump-dom failed ({done.returncode}): {done.stderr[-2000:]}"]
    (out / "report.dom.html").write_text(done.stdout, encoding="utf-8")
    problems = check_dom(run_path, done.stdout)
    least = figures_height(run_path)
    bottom, colours, window = screenshot(browser, page, out / "report.png", least)
    if colours < 50:
        problems.append(f"the screenshot is blank or nearly ({colours} colours)")
    if bottom < least:
        problems.append(f"the screenshot's content ends at {bottom} px, the figures need {least}")
    if bottom >= window - 40:
        problems.append(f"the page is longer than the {window} px screenshot")
    print(
        f"screenshot {out / 'report.png'}: content {bottom} px tall (figures: {least} px), {colours} colours"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="run directory")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the page, DOM and screenshot"
    )
    parser.add_argument(
        "--chromium", type=Path, default=CHROMIUM, help="the browser (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if not args.chromium.is_file():
        print(
            f"report_in_browser: no browser at {args.chromium} (apt-get install -y chromium)",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="report-in-browser-"))
    out.mkdir(parents=True, exist_ok=True)
    problems = check_in_browser(args.run, out, args.chromium)
    for problem in problems:
        print(f"FAIL: {problem}")
    run = open_run(args.run)
    print(
        f"{'FAIL' if problems else 'ok'}: {len(run.figures())} figure(s), "
        f"{len(request_tables(run))} comparison table(s) checked in Chromium; page {out / 'report.html'}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
