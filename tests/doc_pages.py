"""Reading a documentation page's code as a test runs it (``docs/adding-a-method.md``,
``docs/adding-a-dataset.md``)."""

from __future__ import annotations

import re
from pathlib import Path


def python_blocks(page: Path) -> list[tuple[str | None, str]]:
    """``(path, code)`` of each python block of ``page``; ``path``: the last ``*.py`` the prose
    before it names (where the block goes), None when it names none."""
    parts = page.read_text(encoding="utf-8").split("```python\n")
    blocks = []
    for before, part in zip(parts, parts[1:], strict=False):
        prose = before.rsplit("```", 1)[-1]
        paths = re.findall(r"`([\w/]+\.py)`", prose)
        blocks.append((paths[-1] if paths else None, part.split("```", 1)[0]))
    return blocks
