"""Reset encoding: a reset's seeds, options and mask, checked, then written into the segment for the
workers to read before the reset command goes out.

The fields it writes: ``reset_flags`` (one byte per env: reset this env, with a seed), ``reset_seed``
(each seed as ``shmpool.layout.SEED_WORDS`` 64-bit words), ``reset_options`` and
``reset_options_length`` (the options as JSON: shmpool pickles nothing into shared memory) and
``reset_global_step`` (the step count the workers restart from). Everything is checked before the
first of them is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.error import ResetNeeded

from .config import PoolConfig
from .errors import SeedError
from .layout import RESET_OPTION_BYTES, RESET_THIS_ENV, RESET_WITH_SEED, SEED_WORDS, seed_words


class ResetEncoder:
    """Writes the resets of one pool into its segment; remembers which envs no reset has reached.

    ``ended``: with autoreset DISABLED, the envs whose episode ended (see ``CommandChannel.ended``),
    which a reset restarts; None otherwise.
    """

    def __init__(self, config: PoolConfig, fields: dict[str, np.ndarray], ended: np.ndarray | None) -> None:
        self._num_envs = config.num_envs
        self._launch_seed = config.seed
        self._fields = fields
        self._ended = ended
        #: Envs no reset has reached yet: the launch seed seeds each one's first reset.
        self._never_reset = np.ones(config.num_envs, dtype=np.bool_)
        #: Whether every env has been reset (a step before that is refused: ``refuse_step``); kept,
        #: not worked out from ``_never_reset``, because every step reads it.
        self.all_reset = False

    def write(self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None, global_step: int) -> None:
        """Writes the reset's flags, seeds and options to the segment, for the workers to read, and
        the pool's ``global_step``, which they restart their step count from."""
        n = self._num_envs
        if seed is None and self._launch_seed is not None and self._never_reset.any():
            # Masked resets too (SB3's ShmpoolVecEnv resets groups of envs with different options).
            seed = [self._launch_seed + i if first else None for i, first in enumerate(self._never_reset.tolist())]
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [check_seed(int(seed), "seed") + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"reset got {len(seeds)} seeds for num_envs={n}")
            seeds = [None if s is None else check_seed(s, f"seed[{i}]") for i, s in enumerate(seeds)]
        if seeds[-1] is not None:
            check_seed(seeds[-1], f"seed + {n - 1} (env {n - 1})")
        mask = np.ones(n, dtype=np.bool_)
        encoded = b""
        if options is not None:
            options = dict(options)
            if "reset_mask" in options:
                mask = self.check_mask(options.pop("reset_mask"))
            try:
                encoded = json.dumps(options).encode()
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"reset options must be plain JSON data (shmpool pickles nothing): {exc}; got {options!r:.200}"
                ) from exc
            if len(encoded) > RESET_OPTION_BYTES:
                raise ValueError(f"reset options take {len(encoded)} bytes as JSON; at most {RESET_OPTION_BYTES} fit")
        if self._ended is not None:
            self._ended[mask] = False
        fields = self._fields
        flags = fields["reset_flags"]
        flags[:] = np.where(mask, RESET_THIS_ENV, 0)
        for env_id, env_seed in enumerate(seeds):
            if env_seed is not None and mask[env_id]:
                fields["reset_seed"][env_id] = seed_words(env_seed)
                flags[env_id] |= RESET_WITH_SEED
        fields["reset_options"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        fields["reset_options_length"][0] = len(encoded) if options is not None else 0
        # Workers restart their step count from the pool's: after async batches, where each worker
        # counted its own steps, hooks, events and records go back to the pool's numbering.
        fields["reset_global_step"][0] = global_step
        self._never_reset[mask] = False  # before the command: a reset that Ctrl-C interrupts is still done later
        self.all_reset = not self._never_reset.any()

    def refuse_step(self, where: str) -> None:
        """Raises gymnasium's ``ResetNeeded`` naming the envs never reset, for a step asked before
        every env was (``all_reset``): in the trainer, before anything is sent, since an env raising
        it in a worker would break the pool."""
        never = np.flatnonzero(self._never_reset).tolist()
        raise ResetNeeded(f"{where}: envs {never!r:.80} were never reset; call reset() (or async_reset()) first")

    def check_mask(self, mask: Any) -> np.ndarray:
        """``options["reset_mask"]`` if it is one gymnasium takes, else the error gymnasium raises."""
        return check_reset_mask(mask, self._num_envs)


def check_reset_mask(mask: Any, num_envs: int) -> np.ndarray:
    """``mask`` if it is a ``reset_mask`` gymnasium takes for ``num_envs`` envs, else the error
    gymnasium raises."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(f"`options['reset_mask']` must contain at least one True value, got {mask}")
    return mask


def check_seed(seed: Any, where: str) -> int:
    """``seed`` if it is one gymnasium takes and the segment holds (a non-negative int below
    2**256), else a ``SeedError`` naming it; nothing has been written yet."""
    if not isinstance(seed, (int, np.integer)):
        raise SeedError(f"Seed must be a python integer (or None): reset got {where} = {seed!r:.40}")
    if not 0 <= seed < 1 << (SEED_WORDS * 64):
        raise SeedError(f"Seed must be between 0 and 2**{SEED_WORDS * 64} - 1: reset got {where} = {seed}")
    return int(seed)
