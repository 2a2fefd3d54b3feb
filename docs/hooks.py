"""mkdocs hooks: the reference's table of ``launch``'s options, written from ``PoolConfig`` at build
time (``shmpool.option_docs``), so that it cannot drift from the code."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

PLACEHOLDER = "<!-- launch-options -->"


def options_table() -> str:
    """A markdown table: each option's name, type, default and meaning."""
    from shmpool.config import PoolConfig
    from shmpool.option_docs import option_meanings

    fields = {field.name: field for field in dataclasses.fields(PoolConfig)}
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for name, meaning in option_meanings().items():
        field = fields[name]
        value = field.default
        shown = f"{type(value).__name__}.{value.name}" if isinstance(value, enum.Enum) else repr(value)
        default = "required" if value is dataclasses.MISSING else f"`{shown}`"
        # the type as plain text: an escaped pipe stays a backslash inside a code span
        cells = [f"`{name}`", str(field.type), default, meaning.replace("``", "`")]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replaces the placeholder with the table, on the page that has it."""
    return markdown.replace(PLACEHOLDER, options_table()) if PLACEHOLDER in markdown else markdown
