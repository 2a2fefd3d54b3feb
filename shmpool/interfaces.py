"""What a pool, an attached handle and a params block offer, as ``typing.Protocol``s: one API whether the pool runs
on this machine (``shmpool.launch``, ``shmpool.attach``) or on a Ray cluster (``shmpool.ray.launch``,
``shmpool.ray.attach``), so that a curriculum, a trainer loop or a dashboard runs on either. The tests check every
implementation against them, signatures included; a feature one kind of pool cannot offer raises
``NotImplementedError`` naming the alternative. ``timeout`` is always the step deadline; a wait for something to
appear or for room is called ``wait``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .params import ParamSpec

#: Which envs a call concerns: an id, a sequence or array of ids, a slice, or None for every env.
EnvIds = int | Sequence[int] | slice | np.ndarray | None
#: What ``step`` and ``recv`` return: observations, rewards, terminations, truncations, infos.
StepResult = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class EnvsRandomness:
    """``np_random_seed`` and ``np_random`` of a vector env whose envs run elsewhere: each env's own,
    through ``get_attr`` (gymnasium's ``VectorEnv`` would make a generator of its own)."""

    get_attr: Callable[[str], tuple[Any, ...]]

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The seed of each env's random number generator, as gymnasium's Sync and Async report it."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """A copy of each env's random number generator (the envs keep their own)."""
        return self.get_attr("np_random")


@runtime_checkable
class ParamsAPI(Protocol):
    """A pool's parameter block: a column per parameter, and validated atomic writes."""

    #: Each parameter's compiled declaration (bounds, distribution, when it applies), by name.
    specs: Mapping[str, ParamSpec]

    @property
    def names(self) -> list[str]:
        """The parameters' names, in declaration order."""
        ...

    def __len__(self) -> int:
        """How many envs (rows) the block has."""
        ...

    def __getitem__(self, name: str) -> np.ndarray:
        """Parameter ``name``'s values, one row per env."""
        ...

    def write(self, env_ids: EnvIds, **values: Any) -> int:
        """Validates ``values`` and writes them for ``env_ids``, atomically per env; returns the
        write's version, an int that increases with each write to the pool: the params block's
        write count (``ParamBlock.write``), or the cluster's write counter, which
        ``applied_version()`` reports back (``ClusterParams.write``)."""
        ...


@runtime_checkable
class HandleAPI(Protocol):
    """What any process that attached to a pool by name sees: the channels, not the stepping."""

    @property
    def params(self) -> ParamsAPI:
        """The parameter block (writable)."""
        ...

    @property
    def applied(self) -> np.ndarray:
        """What each env runs with now (read-only)."""
        ...

    @property
    def param_specs(self) -> Mapping[str, Any]:
        """Each parameter's declaration: bounds, dist, when."""
        ...

    @property
    def episodes(self) -> Any:
        """The finished episodes' records, read with ``episodes.read()``."""
        ...

    @property
    def events(self) -> Any:
        """The senders of one-shot events to the hooks: ``events.send(hook, env_ids, payload)``
        (``AttributeError`` for a pool launched without hooks)."""
        ...

    @property
    def stats(self) -> Any:
        """Global step, env steps/s, worker states, refusals, episodes."""
        ...

    @property
    def global_step(self) -> int:
        """Steps the pool took."""
        ...

    @property
    def alive(self) -> bool:
        """Whether the pool still runs."""
        ...

    def state_dict(self) -> Any:
        """The pool's parameters and episode counters, as plain data."""
        ...

    def load_state_dict(self, state: Any, *, same_draws: bool = True) -> None:
        """Writes a ``state_dict`` back."""
        ...

    def close(self) -> None:
        """Lets go of the pool (an owner stops it)."""
        ...


@runtime_checkable
class PoolAPI(HandleAPI, Protocol):
    """What the process that launched a pool has: gymnasium's vector API, EnvPool's async batches
    and control calls, besides the channels."""

    @property
    def name(self) -> str:
        """The name others attach by."""
        ...

    @property
    def num_envs(self) -> int:
        """How many envs the pool steps."""
        ...

    @property
    def batch_size(self) -> int:
        """Envs per ``recv()``."""
        ...

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids."""
        ...

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Resets every env (or those of ``options["reset_mask"]``)."""
        ...

    def step(self, actions: Any) -> StepResult:
        """Steps every env."""
        ...

    def async_reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        """Starts resetting every env; ``recv`` returns them batch by batch."""
        ...

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Starts stepping ``env_ids`` (default: those the last ``recv`` returned)."""
        ...

    def recv(self) -> StepResult:
        """The next ``batch_size`` envs to finish, with ``infos["env_id"]``."""
        ...

    def env_apply(
        self,
        function: Callable[..., Any] | str,
        env_ids: Sequence[int] | None = None,
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Runs ``function(env, *args, **kwargs)`` on envs inside the workers."""
        ...

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """gymnasium's ``call``."""
        ...

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """gymnasium's ``get_attr``."""
        ...

    def set_attr(self, name: str, values: Any) -> None:
        """gymnasium's ``set_attr``."""
        ...
