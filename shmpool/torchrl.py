"""TorchRL support: ``ShmpoolEnv``, a TorchRL env whose envs run in a shmpool pool (``pip install "shmpool[torchrl]"``).

It is TorchRL's own ``GymWrapper`` around a pool in gymnasium's ``DISABLED`` autoreset mode, which TorchRL prefers
(it resets finished envs through ``reset_mask``), plus the pool's live parameters. How to use it:
``docs/guides/torchrl.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gymnasium.vector import AutoresetMode
from torchrl.envs.libs.gym import GymWrapper

import shmpool

from .options import fixed_options
from .pool import Pool
from .view import WrappedPoolChannels

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import OptionsButBatchSize


#: The keyword under which the launch options pass GymWrapper's metaclass (see _LaunchOptionsKept).
_PACKED = "_shmpool_launch_options"


class _LaunchOptionsKept(type(GymWrapper)):  # type: ignore[misc]
    """GymWrapper's metaclass takes some keywords for itself (``num_workers``, for ``GymEnv``'s
    ``ParallelEnv``): the launch options pass it packed as one, and ``__init__`` unpacks them."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        own = ("env", "num_envs", "device", "categorical_action_encoding")  # __init__'s named parameters
        named = {key: kwargs.pop(key) for key in own if key in kwargs}
        return super().__call__(*args, **named, **{_PACKED: kwargs})


class ShmpoolEnv(WrappedPoolChannels, GymWrapper, metaclass=_LaunchOptionsKept):
    """A TorchRL env (``batch_size=[num_envs]``) over ``shmpool.launch``.

    ``env`` is a registered gymnasium id, a callable returning an env, or one callable per env (as ``shmpool.launch``
    takes them; ``num_envs`` is None then). ``device`` is where TorchRL puts the tensors;
    ``categorical_action_encoding`` gives discrete actions as integers (True) or one-hot (False, TorchRL's default).
    ``launch_options`` are further options of ``shmpool.launch``; ``autoreset_mode`` is always ``DISABLED`` and
    ``copy`` always True (TorchRL keeps the arrays it is given).
    """

    def __init__(
        self,
        env: Any,
        num_envs: int | None = None,
        *,
        device: torch.device | str | None = None,
        categorical_action_encoding: bool = False,
        **launch_options: Unpack[OptionsButBatchSize],
    ) -> None:
        given: dict[str, Any] = dict(launch_options)
        wrapper = {key: given.pop(key) for key in list(given) if key.startswith("_torchrl")}  # the metaclass's
        options = given.pop(_PACKED, given)
        if "batch_size" in options:  # TorchRL's word for num_envs here; shmpool's for async batches
            raise ValueError(
                f"ShmpoolEnv: batch_size={options['batch_size']!r}: the env's batch size is num_envs, "
                f"and TorchRL steps every env at once (async batches are not offered)"
            )
        options = fixed_options("ShmpoolEnv", options, autoreset_mode=AutoresetMode.DISABLED, copy=True)
        pool = shmpool.launch(env, num_envs, **options)
        try:
            super().__init__(
                env=pool, device=device, categorical_action_encoding=categorical_action_encoding, **wrapper
            )
        except BaseException:
            pool.close()
            raise

    @property
    def pool(self) -> Pool:
        """The pool whose envs this env steps."""
        return self._env
