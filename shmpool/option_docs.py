"""``launch``'s ``Args:`` section, written from ``PoolConfig``'s field docstrings (the one place each
option's meaning is written), so that ``help(shmpool.launch)`` and the reference explain every option."""

from __future__ import annotations

import ast
import inspect
import textwrap

from .config import PoolConfig


def option_meanings() -> dict[str, str]:
    """Each option of ``launch`` (each ``PoolConfig`` field set by ``launch``) and its docstring, in one paragraph."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(PoolConfig)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    meanings = {}
    for statement, following in zip(body, body[1:]):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            meanings[statement.target.id] = " ".join(following.value.value.split())
    fields = inspect.signature(PoolConfig).parameters  # the init fields: launch's options
    return {name: meanings[name] for name in fields}


def with_options(docstring: str) -> str:
    """``docstring`` (a function's, indented by 4) with an ``Args:`` section of every option before its
    ``Examples:`` section (or at its end)."""
    lines = ["    Args:"]
    for name, meaning in option_meanings().items():
        lines += textwrap.wrap(f"{name}: {meaning}", width=100, initial_indent=" " * 8, subsequent_indent=" " * 12)
    section = "\n".join(lines) + "\n\n"
    marker = "    Examples:"
    at = docstring.find(marker)
    return docstring[:at] + section + docstring[at:] if at >= 0 else docstring.rstrip() + "\n\n" + section
