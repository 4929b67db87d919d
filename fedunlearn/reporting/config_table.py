"""A run's ``config.json`` as HTML tables, one per group of ``docs/configuration.md``
(:data:`fedunlearn.config.parameters.GROUPS`), each key with its value and default; the keys set
away from their default are marked. Keys the table does not know (an older or newer run) go under
"other keys"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fedunlearn.reporting import html_blocks as blocks


def _shown(value: Any) -> str:
    """A value as TOML and ``docs/configuration.md`` write it: strings quoted, true/false."""
    if isinstance(value, (str, bool)):
        return json.dumps(value, ensure_ascii=False)
    return blocks.fmt(value)


def grouped_config(config: Mapping[str, Any]) -> dict[str, list[tuple[str, Any, Any, bool]]]:
    """``{group title: [(key, value, default, changed)]}`` in the configuration page's order."""
    from fedunlearn.config.parameters import GROUPS
    from fedunlearn.config.table import parameter_table

    known = {row.key: row for row in parameter_table()}
    groups: dict[str, list] = {title.partition(":")[0]: [] for title in GROUPS.values()}
    titles = {group: title.partition(":")[0] for group, title in GROUPS.items()}
    other = []
    for key in sorted(config):
        row = known.get(key)
        if row is None:
            other.append((key, config[key], None, False))
        else:
            changed = config[key] != row.default
            groups[titles[row.group]].append((key, config[key], row.default, changed))
    if other:
        groups["Other keys"] = other
    return {title: rows for title, rows in groups.items() if rows}


def config_html(config: Mapping[str, Any]) -> str:
    """The grouped tables; the keys away from their default highlighted and counted."""
    if not config:
        return '<p class="note">config.json holds no settings</p>'
    grouped = grouped_config(config)
    changed = sum(c for rows in grouped.values() for *_, c in rows)
    parts = [
        f'<p class="note">{len(config)} keys; {changed} set away from their default '
        "(highlighted)</p>"
    ]
    for title, rows in grouped.items():
        cells = [[k, _shown(v), "" if d is None else _shown(d)] for k, v, d, _ in rows]
        classes = ["changed" if c else "" for *_, c in rows]
        table = blocks.table_html(["key", "value", "default"], cells, row_classes=classes)
        parts.append(f'<div class="group"><h3>{blocks.esc(title)}</h3>{table}</div>')
    return "".join(parts)
