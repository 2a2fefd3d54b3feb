"""RLlib support: a pool as each env runner's vector env, and parameter writes on every runner.

Needs ``pip install "shmpool[rllib]"`` (``ray[rllib]``, which pins its own gymnasium). RLlib changes a task by
rebuilding every env; with a pool, a curriculum writes parameters instead, and the envs use them from their next step.
The pool steps in gymnasium's ``NEXT_STEP`` autoreset mode, which RLlib's env runners expect, and RLlib seeds it at its
first reset (env ``i`` gets the runner's seed plus ``i``). An example, and ``write_params`` and ``pool_of`` in
callbacks (``on_train_result``, ``on_episode_end``): ``docs/guides/rllib.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import PoolExistsError
from .pool import Pool, launch

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import OptionsButName

#: How many runner pools of one ``name`` a machine can hold (``name-0``, ``name-1``, ...).
MAX_RUNNERS_PER_NAME = 1024


def vector_env_creator(
    env: Any, *, name: str | None = None, **launch_options: Unpack[OptionsButName]
) -> Callable[[Mapping], Pool]:
    """The env creator that ``ray.tune.registry.register_env`` takes, for
    ``gym_env_vectorize_mode="vector_entry_point"``: it launches a pool of ``config["num_envs"]`` envs of ``env``.

    The rest of RLlib's env config goes to the envs (``env_kwargs``). With ``name``, each env runner's pool is named
    ``f"{name}-{k}"``, ``k`` the first number free on the machine, so that another process can attach to it (an ADR
    curriculum, ``scripts/curriculum.py``); without, a unique name. Further options go to ``shmpool.launch``.
    """
    if "num_envs" in launch_options:
        raise ValueError("vector_env_creator: RLlib sets num_envs (num_envs_per_env_runner); do not pass it")

    def create(config: Mapping[str, Any]) -> Pool:
        env_config = dict(config)
        if "num_envs" not in env_config:
            raise ValueError(
                "shmpool.rllib: RLlib did not pass num_envs; configure "
                "env_runners(gym_env_vectorize_mode='vector_entry_point', num_envs_per_env_runner=N)"
            )
        num_envs = env_config.pop("num_envs")
        options: dict[str, Any] = dict(launch_options)
        env_kwargs = {**env_config, **(options.pop("env_kwargs", None) or {})}
        options["env_kwargs"] = env_kwargs or None
        if name is None:
            return launch(env, num_envs, **options)
        for runner in range(MAX_RUNNERS_PER_NAME):
            try:
                return launch(env, num_envs, name=f"{name}-{runner}", **options)
            except PoolExistsError:
                continue
        raise PoolExistsError(f"shmpool.rllib: {name}-0 to {name}-{MAX_RUNNERS_PER_NAME - 1} are all taken")

    return create


def pool_of(env_or_runner: Any) -> Pool:
    """The pool behind an RLlib env runner (``env_runner``) or its env (RLlib wraps the pool)."""
    env = getattr(env_or_runner, "env", env_or_runner)
    unwrapped = getattr(env, "unwrapped", env)
    if not isinstance(unwrapped, Pool):
        raise TypeError(
            f"shmpool.rllib: {type(unwrapped).__name__} is not a shmpool pool; register the env with "
            f"vector_env_creator and gym_env_vectorize_mode='vector_entry_point'"
        )
    return unwrapped


def write_params(algorithm: Any, env_ids: Any = None, **values: Any) -> list[int]:
    """Writes parameter ``values`` for ``env_ids`` (None: all) in the pool of every env runner of
    ``algorithm`` (remote and local, through ``foreach_env_runner``); returns each write's version.
    The envs use the values from their next step, as with ``shmpool.ParamBlock.write``."""

    def write(env_runner: Any) -> int | None:
        if getattr(env_runner, "env", None) is None:
            return None  # the local runner of an algorithm with remote ones has no env
        return pool_of(env_runner).params.write(env_ids, **values)

    versions = algorithm.env_runner_group.foreach_env_runner(write, local_env_runner=True)
    return [version for version in versions if version is not None]
