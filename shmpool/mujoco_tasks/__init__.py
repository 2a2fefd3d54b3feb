"""What gymnasium's MuJoCo v5 envs compute around their physics, over a whole slot at once
(``engine="mujoco"``, ``shmpool.workers.mujoco_batch``): each ``Task`` is one env family's ``step``
after ``do_simulation``, as numpy operations over the slot's arrays, bit for bit gymnasium's
(``docs/internals.md``, "The MuJoCo engine's tasks", says how). Nothing here imports ``mujoco``:
the trainer uses ``TASKS`` to check an env id at launch.
"""

from __future__ import annotations

from typing import Any

from .fixed_base import InvertedDoublePendulum, InvertedPendulum, Reaching
from .locomotion import Ant, Forward, Hopping, Humanoid, HumanoidStandup, Swimming
from .task import Infos, Task

__all__ = ["TASKS", "Infos", "Task", "task_of"]


#: The gymnasium ids ``engine="mujoco"`` runs, and their tasks.
TASKS: dict[str, type[Task]] = {
    env_id: task
    for task in (
        Forward,
        Hopping,
        Swimming,
        Ant,
        Humanoid,
        HumanoidStandup,
        InvertedPendulum,
        InvertedDoublePendulum,
        Reaching,
    )
    for env_id in task.ids
}


def task_of(env: Any) -> type[Task]:
    """The task of ``env`` (a registered id), or ``ValueError`` listing the ids the engine runs."""
    if not isinstance(env, str) or env not in TASKS:
        raise ValueError(
            f"engine='mujoco' runs gymnasium's MuJoCo v5 envs {sorted(TASKS)} by id, got {env!r:.80}; "
            f"use engine='python' for any other env"
        )
    return TASKS[env]
