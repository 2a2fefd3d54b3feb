"""Env factories of the trainer's main script, sent to spawned workers so that they arrive whole.

dill sends what ``__main__`` defines by value, and it rebuilds a class from ``__orig_bases__``,
which a subclass of ``gymnasium.Env`` inherits from ``Env`` itself (``Generic[ObsType, ActType]``):
the rebuilt class lacks ``Env`` as a base, so a spawned worker's env would be no ``gymnasium.Env``.
A spawned (or forkserver) worker imports the main script as multiprocessing does, without running
its ``if __name__ == "__main__":`` part, so a script's class goes by name. Where there is no script
to import (a REPL, ``python -c``, a notebook), it goes by value, with its own bases and its globals.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MainAttribute:
    """A class or function of the main script, by its qualified name; calling it calls that."""

    qualname: str

    def __call__(self, **kwargs: Any) -> Any:
        target: Any = sys.modules["__main__"]
        for part in self.qualname.split("."):
            target = getattr(target, part)
        return target(**kwargs)


class MainValue:
    """A class or function of ``__main__`` without a script to import, sent by value with the
    globals it uses (dill's ``recurse``; the worker's ``__main__`` has none of them) and, for a
    class, its own bases."""

    def __init__(self, factory: Any) -> None:
        import dill

        main = vars(sys.modules["__main__"])
        for value in [factory, *main.values()]:  # the factory and the classes its code may name
            if isinstance(value, type) and value.__module__ == "__main__" and "__orig_bases__" not in vars(value):
                value.__orig_bases__ = value.__bases__  # type: ignore[attr-defined]  # what dill rebuilds it from
        self._pickled = dill.dumps(factory, recurse=True)
        self._factory: Any = None

    def __getstate__(self) -> bytes:
        return self._pickled

    def __setstate__(self, pickled: bytes) -> None:
        self._pickled, self._factory = pickled, None

    def __call__(self, **kwargs: Any) -> Any:
        if self._factory is None:
            import dill

            self._factory = dill.loads(self._pickled)
        return self._factory(**kwargs)


def by_name_from_main(factory: Any) -> Any:
    """``factory`` (or each of a tuple), as a ``MainAttribute`` where it is a class or function that
    the main script's import defines, a ``MainValue`` where ``__main__`` has no script; else as it is."""
    if isinstance(factory, tuple):
        return tuple(by_name_from_main(one) for one in factory)
    main = sys.modules.get("__main__")
    qualname = getattr(factory, "__qualname__", "")
    if getattr(factory, "__module__", None) != "__main__":
        return factory
    if getattr(main, "__file__", None):  # by name; a lambda's globals are the script's, found in the worker
        return factory if "<" in qualname else MainAttribute(qualname)
    return MainValue(factory)
