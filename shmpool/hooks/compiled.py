"""``compiled=``: when a built-in hook runs its numba-compiled version (``shmpool.kernels.compiled_hooks``) instead
of numpy's: by default with ``engine="numba"`` only. Both give the same results bit for bit; the rules, and what
``compiled=True`` needs: ``docs/guides/engines.md``, "Compiled built-in hooks".
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import numpy as np

from ..kernels import NUMBA_EXTRA
from .context import HookContext

#: The dtypes the compiled hooks take: numba's number types (float16 is not one).
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_NUMBERS = (np.dtype(np.bool_), *map(np.dtype, np.typecodes["AllInteger"]), *_FLOATS)


def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def _checked_compiled(hook: str, compiled: bool | None) -> bool | None:
    """A built-in hook's ``compiled`` argument, checked when the hook is made: True needs numba."""
    if compiled is not None and not isinstance(compiled, (bool, np.bool_)):
        raise TypeError(f"{hook}(compiled=...) must be True, False or None, got {compiled!r}")
    if compiled and not _numba_installed():
        raise ImportError(f"{hook}(compiled=True) needs numba, which is not installed: {NUMBA_EXTRA}")
    return None if compiled is None else bool(compiled)


def _compiled_functions(hook: Any, ctx: HookContext, misfit: str | None) -> ModuleType | None:
    """``shmpool.kernels.compiled_hooks`` if ``hook`` runs compiled in this worker, else None (numpy).

    ``misfit`` says why the compiled version cannot take this pool (None: it can); then
    ``compiled=None`` runs numpy's version and ``compiled=True`` fails the launch."""
    if not (hook.compiled if hook.compiled is not None else ctx.engine == "numba"):
        return None
    if misfit is not None:
        if hook.compiled:
            raise TypeError(f"{hook.name}(compiled=True) cannot run compiled: {misfit}; use compiled=False")
        return None
    from ..kernels import compiled_hooks  # imports numba: only in workers that run compiled hooks

    return compiled_hooks


def _width(shape: tuple[int, ...]) -> int:
    """Numbers per env in an array of per-env ``shape``: the columns of its ``(envs, width)`` view."""
    return int(np.prod(shape, dtype=np.int64))
