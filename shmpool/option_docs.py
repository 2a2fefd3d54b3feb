"""``launch``'s ``Args:`` section, written from ``PoolConfig``'s field docstrings (the one place each
option's meaning is written), so that ``help(shmpool.launch)`` and the reference explain every option."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from .config import PoolConfig


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstring of each field of the class ``cls``, in one paragraph each: read from
    its source with ``ast`` (empty when the source is not available)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)).body
    docs = {}
    for statement, following in zip(body, body[1:]):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def option_meanings() -> dict[str, str]:
    """Each option of ``launch`` (each ``PoolConfig`` field set by ``launch``) and its docstring."""
    meanings = field_docs(PoolConfig)
    return {name: meanings.get(name, "") for name in inspect.signature(PoolConfig).parameters}


def with_options(docstring: str) -> str:
    """``docstring`` (a function's, indented by 4) with an ``Args:`` section of every option before its
    ``Examples:`` section (or at its end); as it is where the sources are not installed."""
    if not field_docs(PoolConfig):  # a frozen app or a .pyc-only install: nothing to read
        return docstring
    lines = ["    Args:"]
    for name, meaning in option_meanings().items():
        lines += textwrap.wrap(f"{name}: {meaning}", width=100, initial_indent=" " * 8, subsequent_indent=" " * 12)
    section = "\n".join(lines) + "\n\n"
    marker = "    Examples:"
    at = docstring.find(marker)
    return docstring[:at] + section + docstring[at:] if at >= 0 else docstring.rstrip() + "\n\n" + section
