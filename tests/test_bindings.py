"""Where a parameter's value goes on an env (:mod:`shmpool.bindings`): bind paths and setters, and the
nominal values read from a fresh env, each problem refused at launch naming the parameter."""

from __future__ import annotations

import numpy as np
import pytest

import shmpool
from shmpool import Param


def test_bad_declarations_fail_at_launch(pool_name: str) -> None:
    with pytest.raises(AttributeError, match=r"has no 'not_there'.*never creates attributes"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"not_there": Param(1.0)})
    with pytest.raises(AttributeError, match=r"has no 'state\[9\]'"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"x": Param(1.0, bind="state[9]")})
    own = r"CartPole-v1: params\['gravity'\]: the initial value 9.8 \(the env's own value\) is rejected: outside"
    with pytest.raises(ValueError, match=own):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"gravity": Param(low=0, high=5)})
    with pytest.raises(ValueError, match="when must be one of"):
        shmpool.launch("CartPole-v1", 2, name=pool_name, params={"gravity": Param(when="sometimes")})


def test_launch_values_are_stored_exactly_as_given_or_refused_as_writes_are(pool_name: str) -> None:
    """A default or an env's own value that the parameter's dtype or shape cannot hold is refused by
    name, as ``write`` refuses it: 2.7 was launched as 2, CartPole's length 0.5 as 0 (into the env)."""
    whole = r"has dtype {}, which holds a whole number"
    for name, param, message in [
        ("k", Param(2.7, dtype="int64", bind=False), r"params\['k'\] \(default\) = 2.7 rejected: 'k' " + whole),
        (
            "length",
            Param(dtype="int64"),
            r"\['length'\] \(the env's own value\) = 0.5 rejected: 'length' " + whole,
        ),
        ("k", Param(300, dtype="uint8", bind=False), r"\(default\) = 300 rejected: 'k' " + whole),
        ("k", Param(-1, dtype="uint8", bind=False), r"\(default\) = -1 rejected: 'k' " + whole),
        (
            "k",
            Param([1.0, 2.0, 3.0], shape=(2,), bind=False),
            r"params\['k'\] \(default\) = \[1.0, 2.0, 3.0\] does not fit",
        ),
    ]:
        with pytest.raises(ValueError, match=message.format(param.dtype)):
            shmpool.launch("CartPole-v1", 2, name=pool_name, params={name: param})
    with shmpool.launch("CartPole-v1", 2, name=pool_name, params={"k": Param(3.0, dtype="int64", bind=False)}) as pool:
        assert pool.params["k"].tolist() == [3, 3]  # a whole float is a whole number


@pytest.mark.parametrize(
    ("name", "param", "shown"),
    [
        ("k", Param(2.7, dtype="int64", bind=False), "2.7"),
        ("length", Param(dtype="int64"), "0.5"),
        ("k", Param("abc", bind=False), "'abc'"),
        ("k", Param([1.0, 2.0, 3.0], shape=(2,), bind=False), "[1.0, 2.0, 3.0]"),
        ("gravity", Param(low=0, high=5), "9.8"),
        ("k", Param({"low": "x"}, low=0, high=1, dist="uniform", bind=False), "'x'"),
    ],
    ids=["not_whole", "nominal_not_whole", "text", "shape", "outside", "dist_argument"],
)
def test_a_refused_launch_value_is_named_by_parameter_env_and_value_not_by_an_env_index(
    name: str, param: Param, shown: str, pool_name: str
) -> None:
    """A launch value is every env's: its refusal named env index 0 (``params['k'][0]``) and "1 env(s)",
    checked as one env's row, in a pool of 3; it names the env, the parameter and the value."""
    with pytest.raises(ValueError) as caught:
        shmpool.launch("CartPole-v1", 3, num_workers=1, name=pool_name, params={name: param})
    message = str(caught.value)
    assert message.startswith(f"CartPole-v1: params[{name!r}]"), message
    assert shown in message, message
    assert "[0]" not in message and "1 env(s)" not in message, message


def test_bind_paths_and_callables(pool_name: str) -> None:
    seen = []

    def set_length(env, value) -> None:
        env.length = value
        seen.append(value)

    params = {
        "second": Param(bind="x_threshold", low=0, high=10),
        "pole": Param(0.5, bind=set_length, low=0.1, high=2.0),
    }
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, params=params) as pool:
        assert pool.params["second"].tolist() == [2.4, 2.4]
        pool.params.write(1, second=3.0, pole=0.7)
        pool.reset(seed=0)
        assert pool.applied["pole"].tolist() == [0.5, 0.7] and pool.applied["second"].tolist() == [2.4, 3.0]


@pytest.mark.parametrize(
    ("param", "stored"),
    [
        (Param([0.5]), 0.5),
        (Param(np.array([0.5])), 0.5),
        (Param([[1.0, 2.0, 3.0]], shape=(3,), bind=False), [1.0, 2.0, 3.0]),
        (Param({"low": [0.4], "high": [0.6]}, dist="uniform"), (0.4, 0.6)),
    ],
    ids=["scalar", "array", "vector", "dist"],
)
def test_a_launch_value_with_a_leading_axis_of_one_is_taken_as_a_write_to_every_env_takes_it(
    param: Param, stored: object, pool_name: str
) -> None:
    """A launch value is one row, every env's, so it fits as a write to every env fits (a leading
    axis of one included); naming no env index in refusals refused these for a while."""
    name = "x" if param.bind is False else "length"
    with shmpool.launch("CartPole-v1", 3, num_workers=1, name=pool_name, params={name: param}) as pool:
        assert [np.asarray(row.tolist()).tolist() for row in pool.params[name]] == [np.asarray(stored).tolist()] * 3
