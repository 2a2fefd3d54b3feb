"""What shmpool knows about gymnasium's classic-control envs (see ``shmpool.env_families``).

Their parameters are plain attributes of the unwrapped env, bound by name, and every one of them is read on each step,
except that CartPole caches ``total_mass`` and ``polemass_length`` in ``__init__``: its adapter recomputes them after
its parameters change. ``hooks.Perturb`` kicks these envs by adding to the velocity entries of ``env.unwrapped.state``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .env_families import EnvAdapter


class ClassicControl(EnvAdapter):
    """One classic-control env class, whose ``unwrapped.state`` holds velocities at ``velocities``."""

    name = "classic control"

    def __init__(self, cls: str, velocities: Sequence[int]) -> None:
        self.classes = (cls,)
        self.velocities = list(velocities)  # a list: fancy indexing of the state vector

    def kicker(self, env: Any) -> Callable[[np.ndarray], None]:
        """Adds ``amounts`` (one per velocity entry; extra ones ignored) to the env's velocities."""
        unwrapped, indices = env.unwrapped, self.velocities
        count = len(indices)

        def kick(amounts: np.ndarray) -> None:
            state = np.array(unwrapped.state, dtype=np.float64)
            state[indices] += amounts[:count]
            unwrapped.state = state

        return kick


class CartPole(ClassicControl):
    """CartPole, which derives ``total_mass`` and ``polemass_length`` from ``masscart``,
    ``masspole`` and ``length`` once, in ``__init__``."""

    refresh_inputs = frozenset({"masscart", "masspole", "length"})
    refresh_outputs = frozenset({"total_mass", "polemass_length"})

    def refresher(self, env: Any) -> Callable[[], None]:
        """Recomputes ``total_mass`` and ``polemass_length`` as ``__init__`` does (run after one of
        ``refresh_inputs`` changed)."""
        return self.refresher_of_many([env])

    def refresher_of_many(self, envs: list[Any]) -> Callable[[], None]:
        """``refresher`` of every env in ``envs``, in one loop."""
        unwrapped = [env.unwrapped for env in envs]

        def refresh() -> None:
            for env in unwrapped:
                env.total_mass = env.masspole + env.masscart
                env.polemass_length = env.masspole * env.length

        return refresh


_MODULE = "gymnasium.envs.classic_control"

ADAPTERS = [
    CartPole(f"{_MODULE}.cartpole:CartPoleEnv", velocities=[1, 3]),  # x_dot, theta_dot
    ClassicControl(f"{_MODULE}.pendulum:PendulumEnv", velocities=[1]),  # theta_dot
    ClassicControl(f"{_MODULE}.mountain_car:MountainCarEnv", velocities=[1]),  # velocity
    ClassicControl(f"{_MODULE}.continuous_mountain_car:Continuous_MountainCarEnv", velocities=[1]),
    ClassicControl(f"{_MODULE}.acrobot:AcrobotEnv", velocities=[2, 3]),  # dtheta1, dtheta2
]
