"""The base of the built-in hooks that read a declared parameter per env, so that a curriculum can
change their strength per env while training runs."""

from __future__ import annotations

from typing import Any

from ..params import Param
from .compiled import _checked_compiled
from .context import HookContext
from .streams import EnvStreams


class ParamHook:
    """A built-in hook that reads one declared parameter per env (its column of ``ctx.applied``).

    It owns the set-up they share: the parameter's name ``param`` and its declaration (``params()``),
    the hook's ``name`` (events address it; default: ``builtin``, the built-in's own name), its
    ``compiled`` choice (checked when the hook is made: see ``shmpool.hooks.compiled``), and the
    per-env random streams and compiled function that ``on_launch`` makes. A subclass says in
    ``_declaration`` how its parameter is declared.
    """

    def __init__(self, builtin: str, *, param: str, name: str | None, compiled: bool | None) -> None:
        self.param, self.name = param, name or builtin
        self.compiled = _checked_compiled(builtin, compiled)
        self._streams: EnvStreams | None = None
        self._compiled: tuple[Any, ...] | None = None  # the compiled function(s) and their arrays

    def params(self) -> dict[str, Param]:
        """Declares the parameter the hook reads (``bind=False``: on no env, the hook reads it)."""
        return {self.param: self._declaration()}

    def _declaration(self) -> Param:
        """The declaration of ``param``: its default, bounds and dtype."""
        raise NotImplementedError(f"{type(self).__name__} must say how it declares its parameter")

    def _make_streams(self, ctx: HookContext, shape: tuple[int, ...], kind: str) -> EnvStreams:
        """Makes the hook's per-env random streams, keyed by its name: ``kind`` numbers of per-env ``shape``."""
        self._streams = EnvStreams(ctx.seed, self.name, ctx.env_ids, shape, kind)
        return self._streams
