"""What the built-in kernels share: libm's ``pow`` as numba calls it, and the ``BatchKernel``
of a gymnasium env read off a fresh instance of it.

``x ** 2`` in gymnasium calls libm's ``pow``, as numpy and Python do; LLVM would otherwise turn
``pow(x, 2.0)`` into ``x * x``, which differs in the last bit for about 0.07% of values. The kernels
call it through its ``powf64`` / ``powf32`` names (glibc aliases of ``pow`` and ``powf``), which the
compiler does not treat as ``pow``.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from numba import types

from ..batch_kernel import MODELED, BatchKernel

#: libm's ``pow`` and ``powf``, under names LLVM does not rewrite.
powf64 = types.ExternalFunction("powf64", types.float64(types.float64, types.float64))
powf32 = types.ExternalFunction("powf32", types.float32(types.float32, types.float32))
F32 = np.float32


def _nominal(env: Any, names: list[str]) -> dict[str, float]:
    return {name: float(getattr(env, name)) for name in names}


def _unsupported(env: gymnasium.Env, names: list[str], also: tuple[str, ...]) -> tuple[str, ...]:
    """The attributes of ``env`` (its own and its class's, and ``also``: ones only its ``step`` or
    ``reset`` sets) that the kernel does not model."""
    found = set(vars(env)) | set(also)
    for cls in type(env).__mro__:
        if cls.__module__.startswith("gymnasium.envs."):  # the env's classes, not gymnasium.Env's
            found.update(
                name
                for name, value in vars(cls).items()
                if not name.startswith("__") and not callable(value) and not isinstance(value, property)
            )
    return tuple(sorted(found - set(names) - set(MODELED)))


def make_kernel(
    env_id: str, env: gymnasium.Env, names: list[str], also: tuple[str, ...] = (), **fields: Any
) -> BatchKernel:
    """The kernel of ``env_id``: ``env``'s spaces and metadata, the nominal values of its parameters
    ``names`` read off ``env``, its registered time limit, every other attribute ``unsupported``, and
    ``fields`` (the kernel's functions and layout)."""
    spec = gymnasium.spec(env_id)
    return BatchKernel(
        observation_space=env.observation_space,  # type: ignore[arg-type]
        action_space=env.action_space,  # type: ignore[arg-type]
        params=_nominal(env, names),
        max_episode_steps=spec.max_episode_steps,
        metadata={**env.metadata, "render_modes": []},
        unsupported=_unsupported(env, names, also),
        **fields,
    )


def set_float64_state(row: np.ndarray, value: np.ndarray) -> None:
    """Stores a ``state`` of whole or float64 numbers, which gymnasium's next step computes with in
    float64 as the kernel does (a float32 state it would step in float32 arithmetic)."""
    if value.dtype.kind == "f" and value.dtype.itemsize != 8:
        raise ValueError(
            f"gymnasium's env would compute its next step in {value.dtype} arithmetic, which the kernel does "
            f"not reproduce; assign float64 values (np.asarray(state, dtype=np.float64)) or use engine='python'"
        )
    row[: len(value)] = value
