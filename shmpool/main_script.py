"""Env factories of the trainer's main script, sent to spawned workers so that they arrive whole: a script's class
goes by name, one without a script to import (a REPL, ``python -c``, a notebook) by value with its own bases. Why:
``docs/internals.md``, "shmpool/main_script.py".
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any


class MainFactory:
    """A class or function of ``__main__``, for a spawned worker: found by its name in the worker's
    import of the main script or, where that has no such name (no script, or one defined under
    ``if __name__ == "__main__":``), rebuilt from its value, with the globals it uses and, for a
    class, its own bases."""

    def __init__(self, qualname: str | None, pickled: bytes | None) -> None:
        self._qualname, self._pickled = qualname, pickled
        self._factory: Any = None

    def __getstate__(self) -> tuple[str | None, bytes | None]:
        return self._qualname, self._pickled

    def __setstate__(self, state: tuple[str | None, bytes | None]) -> None:
        self.__init__(*state)  # type: ignore[misc]

    def _resolve(self) -> Any:
        if self._qualname is not None:
            try:
                target: Any = sys.modules["__main__"]
                for part in self._qualname.split("."):
                    target = getattr(target, part)
                return target
            except AttributeError:
                if self._pickled is None:
                    raise
        import dill

        return dill.loads(self._pickled)  # type: ignore[arg-type]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._factory is None:
            self._factory = self._resolve()
        return self._factory(*args, **kwargs)  # args: a ``functools.partial``'s


def _by_value(factory: Any) -> bytes | None:
    """``factory`` pickled by value with the globals its code uses, after every class of ``__main__``
    records its own bases (dill rebuilds a class from ``__orig_bases__``); None if it cannot be."""
    import dill

    for value in [factory, *vars(sys.modules["__main__"]).values()]:
        if isinstance(value, type) and value.__module__ == "__main__" and "__orig_bases__" not in vars(value):
            try:
                value.__orig_bases__ = value.__bases__  # type: ignore[attr-defined]
            except (AttributeError, TypeError):  # a class that takes no attributes
                pass
    try:
        return dill.dumps(factory, recurse=True)
    except Exception:  # noqa: BLE001 - what the by-name path or plain pickling then does
        return None


def by_name_from_main(factory: Any) -> Any:
    """``factory`` (or each of a tuple; a ``functools.partial``'s function), as a ``MainFactory`` where
    it is a class or function of the main script, or anything of a ``__main__`` without a script;
    else as it is."""
    if isinstance(factory, tuple):
        return tuple(by_name_from_main(one) for one in factory)
    if isinstance(factory, functools.partial):
        return functools.partial(by_name_from_main(factory.func), *factory.args, **factory.keywords)
    if getattr(factory, "__module__", None) != "__main__":
        return factory  # not the script's
    if getattr(sys.modules.get("__main__"), "__file__", None):
        qualname = getattr(factory, "__qualname__", "<instance>")
        if "<" in qualname or not isinstance(factory, (type, types.FunctionType)):
            return factory  # a lambda or an instance: dill sends it, the script's names found in the worker
        return MainFactory(qualname, _by_value(factory))
    pickled = _by_value(factory)
    return factory if pickled is None else MainFactory(None, pickled)
