"""What shmpool knows about particular env families, found by the env's class.

Why and how: ``docs/internals.md``, "shmpool/env_families.py".
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: The modules that declare shmpool's own adapters (each as a module-level ``ADAPTERS`` list).
FAMILIES = ("shmpool.classic_control", "shmpool.mujoco", "shmpool.kernels")


#: ``EnvAdapter.batch_stepper``'s function: ``step(rows, actions)`` steps the envs at ``rows`` (None:
#: all) of the steppers it was made for, with ``actions`` (one per row), writes their observations to
#: the rows ``rows`` of the observation view it was made with, and returns their rewards and
#: terminations (lists, in row order); or it changes nothing and returns None, wherever it would not
#: give what each env's own step gives, warnings and errors included (the caller then steps each env
#: itself).
BatchStep = Callable[[list[int] | None, Any], tuple[list[float], list[bool]] | None]


class EnvAdapter:
    """What shmpool needs to know about one family of envs; every method has a do-nothing default.

    Attributes:
        name: the family, for messages.
        classes: the unwrapped env classes handled (subclasses included), as ``"module:QualName"``.
    """

    name: str = "generic"
    classes: tuple[str, ...] = ()
    #: The attributes of the unwrapped env that ``refresher`` derives values from: a parameter
    #: bound to another plain attribute changes nothing it must recompute. None: any parameter.
    refresh_inputs: frozenset[str] | None = None
    #: The attributes ``refresher`` recomputes: a parameter bound to one is refused at launch beside
    #: one bound to a ``refresh_inputs`` attribute, whose change would replace its value.
    refresh_outputs: frozenset[str] = frozenset()

    def refresher(self, env: Any) -> Callable[[], None] | None:
        """A function that recomputes what ``env`` caches from its parameters (values its
        ``__init__`` derives once), run after parameters were applied to it; None if it caches
        nothing. Called once per env, when it is attached."""
        return None

    def refresher_of_many(self, envs: list[Any]) -> Callable[[], None] | None:
        """One function doing what ``refresher`` does for each of ``envs`` (all of this family),
        for a slot whose every env changed; None: the envs' own refreshers are called one by one."""
        return None

    def derived(self, env: Any) -> tuple[frozenset[str], frozenset[str] | None]:
        """The attributes of ``env`` that its refresher recomputes, and those it recomputes them from
        (``refresh_outputs`` and ``refresh_inputs``; None: from any)."""
        return self.refresh_outputs, self.refresh_inputs

    def batch_stepper(
        self, steppers: list[Callable[[Any], Any]], observations: Any, action_dtype: Any
    ) -> BatchStep | None:
        """One function that steps several envs of this family at once, with the results and the env
        state their own ``step`` would give, writing their observations into ``observations`` (the
        slot's view, one row per env) from actions of ``action_dtype``; None if the family has none, or
        if one of ``steppers`` (what a slot steps for each of its envs, see ``workers/inner_step.py``) is
        not its env's own ``step``. Called when a slot's steppers change."""
        return None

    def kicker(self, env: Any) -> Callable[[Any], None] | None:
        """``hooks.Perturb``'s default kick for ``env``: a function adding ``amounts`` (a float
        array, one per velocity) to its velocities; None if they are unknown. May instead raise
        ``TypeError`` saying which kick to use. Called once per env, at its first kick."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {', '.join(self.classes) or 'any env'}>"


#: The adapter of envs no other adapter handles.
GENERIC = EnvAdapter()

_registered: dict[str, EnvAdapter] = {}  # by register(): win over the built-in ones
_table: dict[str, EnvAdapter] | None = None  # class key -> adapter, once the families are imported
_by_type: dict[type, EnvAdapter] = {}  # the lookups made so far


def class_key(cls: type) -> str:
    """How adapters name a class: ``"module:QualName"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register(adapter: EnvAdapter) -> EnvAdapter:
    """Adds an adapter for the classes it lists, ahead of shmpool's own ones; returns it.

    Registration is per process: register in every process that makes the envs (the workers
    included), for instance from ``launch(..., worker_init=...)``.
    """
    if not adapter.classes:
        raise ValueError(f"{adapter!r} lists no env classes")
    for key in adapter.classes:
        if ":" not in key:
            raise ValueError(f"adapter classes are 'module:QualName' strings, got {key!r}")
        _registered[key] = adapter
    _by_type.clear()
    global _table
    _table = None
    return adapter


def _classes() -> dict[str, EnvAdapter]:
    global _table
    if _table is None:
        table: dict[str, EnvAdapter] = {}
        for module in FAMILIES:
            for adapter in importlib.import_module(module).ADAPTERS:
                table.update(dict.fromkeys(adapter.classes, adapter))
        table.update(_registered)
        _table = table
    return _table


def adapter_for(env: Any) -> EnvAdapter:
    """The adapter of ``env`` (a wrapped or unwrapped env), by its unwrapped class: the adapter of
    the most derived class in its hierarchy that one lists, else ``GENERIC``."""
    cls = type(env.unwrapped)
    adapter = _by_type.get(cls)
    if adapter is None:
        table = _classes()
        adapter = next((table[key] for key in map(class_key, cls.__mro__) if key in table), GENERIC)
        _by_type[cls] = adapter
    return adapter


def defined_in(function: Any, module: ModuleType, qualname: str) -> bool:
    """Whether ``function`` is the one ``module``'s source defines as ``qualname``: its names and its
    code's file, with or without the file's extension (an install of compiled files only). A function
    patched in with ``functools.wraps`` carries the names, not the code."""
    code, source = getattr(function, "__code__", None), getattr(module, "__file__", None)
    return (
        getattr(function, "__module__", None) == module.__name__
        and getattr(function, "__qualname__", None) == qualname
        and code is not None
        and source is not None
        and os.path.splitext(code.co_filename)[0] == os.path.splitext(source)[0]
    )


__all__ = ["FAMILIES", "GENERIC", "BatchStep", "EnvAdapter", "adapter_for", "class_key", "defined_in", "register"]
