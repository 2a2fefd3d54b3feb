"""Random numbers of the built-in hooks: per-env streams keyed by the pool seed, so a run is the same
whatever the number of workers."""

from __future__ import annotations

import hashlib

import numpy as np


class EnvStreams:
    """Per-env random numbers indexed by global step: env ``e`` at step ``s`` gets the same numbers
    whichever worker runs it. Each env has its own generator (seeded from the pool seed, the stream's
    name and the env id) that fills blocks of steps ahead, so a step costs one array index."""

    BLOCK = 64

    def __init__(self, seed: int, name: str, env_ids: np.ndarray, shape: tuple[int, ...], kind: str) -> None:
        # The whole name keys the stream: names sharing a prefix must not share numbers.
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        stream = int.from_bytes(digest, "little") & ((1 << 62) - 1)
        self._generators = [np.random.default_rng([seed % (1 << 63), stream, int(e)]) for e in env_ids]
        if kind not in ("normal", "uniform"):
            raise ValueError(f"kind must be 'normal' or 'uniform', got {kind!r}")
        self._normal = kind == "normal"
        self._shape = shape
        self._block = -1
        self._values = np.zeros((len(env_ids), self.BLOCK, *shape))

    @property
    def values(self) -> np.ndarray:
        """The current block, ``(envs, BLOCK, *shape)``: always this array, refilled in place."""
        return self._values

    def index(self, step: int) -> int:
        """Makes the block holding global step ``step`` the current one; returns the step's index in it."""
        block = step // self.BLOCK
        while self._block < block:  # blocks are made in order, so skipping steps changes nothing
            self._block += 1
            for row, generator in enumerate(self._generators):
                size = (self.BLOCK, *self._shape)
                self._values[row] = generator.standard_normal(size) if self._normal else generator.random(size)
        return step % self.BLOCK

    def at(self, step: int) -> np.ndarray:
        """The numbers of shape ``(envs, *shape)`` for global step ``step``."""
        return self._values[:, self.index(step)]
