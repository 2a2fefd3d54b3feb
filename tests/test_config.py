"""Launch options (``shmpool.config.PoolConfig``): each bad value refused naming the option, and ``launch``
spelling out PoolConfig's options in order with their defaults (its forwarders' options: test_options.py)."""

from __future__ import annotations

import pytest
from helpers import pool_config_options

import shmpool


@pytest.mark.parametrize(
    ("options", "error", "option"),
    [
        ({"timeout": "5"}, TypeError, "timeout"),
        ({"timeout": True}, TypeError, "timeout"),
        ({"launch_timeout": None}, TypeError, "launch_timeout"),
        ({"hooks": 5}, TypeError, "hooks"),
        ({"hooks": [None]}, TypeError, "hooks"),
        ({"params": [1, 2]}, TypeError, "params"),
        ({"env_kwargs": "ab"}, TypeError, "env_kwargs"),
        ({"episode_metrics": {"a": 5}}, TypeError, "episode_metrics"),
        ({"event_capacity": 1 << 62}, ValueError, "event_capacity"),
        ({"info_bytes": 1 << 62}, ValueError, "info_bytes"),
        ({"start_method": "fork-please"}, ValueError, "start_method"),
        ({"copy": 1}, TypeError, "copy"),
        ({"seed": -1}, ValueError, "seed must be between 0 and"),  # every unseeded reset would fail
    ],
)
def test_bad_launch_options_are_refused_naming_the_option(
    pool_name: str, options: dict, error: type, option: str
) -> None:
    with pytest.raises(error, match=option):
        shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, **options)


def test_launch_writes_out_every_option_of_pool_config_in_order_with_its_default() -> None:
    import inspect

    import shmpool

    parameters = list(inspect.signature(shmpool.launch).parameters.values())
    assert [(p.name, p.kind) for p in parameters[:2]] == [
        ("env", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("num_envs", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ]
    options = [(p.name, p.default, p.annotation) for p in parameters[2:]]
    assert options == pool_config_options()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:])
