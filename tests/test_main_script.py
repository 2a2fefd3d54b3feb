"""Env classes and functions of the trainer's main script reach spawned and forkserver workers
whole (:mod:`shmpool.main_script`): from a script file, and from ``python -c`` (as a REPL or a
notebook has no file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import helpers
import pytest

#: A trainer whose env class is its own, launched on spawn and forkserver as the class, a lambda, a
#: function defined under `if __name__ == "__main__":`, a callable instance, and partials (one with a
#: positional argument).
OWN_ENV_CLASS = """
import functools
import sys
import gymnasium as gym
import numpy as np
import shmpool


class Slide(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, step=0.1):
        self.size = step

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = 0.0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += self.size if action else -self.size
        return np.array([self.x], np.float32), 0.0, False, False, {}


class Maker:
    def __call__(self):
        return Slide()


if __name__ == "__main__":

    def make_slide(step=0.1):  # defined where a spawned worker's import of the script does not run
        return Slide(step)

    factories = {
        "class": Slide,
        "lambda": lambda: Slide(),
        "function": make_slide,
        "instance": Maker(),
        "partial": functools.partial(Slide),
        "partial-with-arguments": functools.partial(make_slide, 0.1),
    }
    for method in ("spawn", "forkserver"):
        for label, factory in factories.items():
            name = f"{sys.argv[1]}-{method}-{label}"
            with shmpool.launch(factory, 2, num_workers=1, start_method=method, name=name) as pool:
                pool.reset(seed=0)
                print(method, label, [round(float(x), 3) for x in pool.step([1, 0])[0].ravel()])
"""

LABELS = ("class", "lambda", "function", "instance", "partial", "partial-with-arguments")
EXPECTED = [f"{method} {label} [0.1, -0.1]" for method in ("spawn", "forkserver") for label in LABELS]


@pytest.mark.parametrize("how", ["a script file", "python -c"])
def test_a_main_scripts_env_class_launches_under_every_start_method(pool_name: str, tmp_path: Path, how: str) -> None:
    if how == "a script file":
        script = tmp_path / "trainer.py"
        script.write_text(OWN_ENV_CLASS)
        result = subprocess.run(
            [sys.executable, str(script), pool_name], capture_output=True, text=True, timeout=120, env=helpers.ENV
        )
    else:
        result = helpers.run_script(OWN_ENV_CLASS, pool_name, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == EXPECTED
