"""Control calls: gymnasium's ``call``/``get_attr``/``set_attr``/``render`` and ``Pool.env_apply``,
which run arbitrary functions on the envs inside the workers and bring their results back.

These are rare control calls, not the per-step path, and their arguments and results are arbitrary
Python objects, so they travel pickled (with ``dill``, as ``multiprocess`` ships lambdas). They go
through one private pipe per worker, made at launch and held only by the owner and that worker,
never through the segment: nothing in shared memory is ever unpickled, and a pipe has no size to
plan. The command word in the control row still orders them with steps and resets: the trainer
writes the ``CALL`` command, rings, then sends the request on the pipe; the worker answers on the
pipe, then publishes ``DONE``. Both sides read whole messages while they wait, so a large answer
never stalls a writer.

Every message carries the command's sequence number, so an answer left unread by a call that
Ctrl-C interrupted is recognised and dropped by the next one.
"""

from __future__ import annotations

import traceback
from typing import Any

import dill

#: The largest pickled request or answer one worker's pipe carries for one call (frames of
#: ``render`` for a slot of 64 envs at 600x400 RGB take about 46 MB).
MAX_CALL_BYTES = 256 << 20

#: One env's part of a call: (env id, function or attribute name, args, kwargs).
Request = tuple[int, Any, tuple[Any, ...], dict[str, Any]]
#: Where a call failed: (env id, the exception or None if it would not pickle, traceback text).
Failure = tuple[int, BaseException | None, str]


def encode(message: Any, what: str) -> bytes:
    """``message`` pickled; ``TypeError`` naming ``what`` if it does not pickle, ``ValueError`` if it
    is too large."""
    try:
        data = dill.dumps(message, protocol=dill.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - dill raises many types for objects it cannot pickle
        raise TypeError(f"{what} cannot be pickled to reach the workers: {type(exc).__name__}: {exc}") from exc
    if len(data) > MAX_CALL_BYTES:
        raise ValueError(f"{what} takes {len(data)} bytes pickled; at most {MAX_CALL_BYTES} fit in one call")
    return data


def decode(data: bytes) -> Any:
    """A message sent by :func:`encode` over a pool's private pipe (never from shared memory)."""
    return dill.loads(data)


def set_wrapper_attribute(env: Any, name: str, value: Any) -> None:
    """Sets ``name`` on ``env`` as gymnasium's ``set_attr`` does (on the wrapper that has it)."""
    env.set_wrapper_attr(name, value)


def run_requests(envs: list[Any], first_env_id: int, seq: int, requests: list[Request]) -> bytes:
    """Runs one worker's part of call ``seq`` and returns the encoded answer ``(seq, results, failure)``.

    A string is gymnasium's ``call``: the attribute, called with the arguments if it is callable; a
    callable is applied as ``function(env, *args, **kwargs)``. The first env that raises ends the
    call; its exception travels back (or its text, if it does not pickle).
    """
    results: list[Any] = []
    env_id = first_env_id
    for env_id, function, args, kwargs in requests:
        env = envs[env_id - first_env_id]
        try:
            if isinstance(function, str):
                value = env.get_wrapper_attr(function)
                results.append(value(*args, **kwargs) if callable(value) else value)
            else:
                results.append(function(env, *args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - reported to the trainer, which raises it there
            return failure_answer(seq, env_id, exc, traceback.format_exc())
    try:
        return encode((seq, results, None), "the call's answer")
    except (TypeError, ValueError) as exc:  # a result that does not pickle, or too large
        return failure_answer(seq, env_id, type(exc)(str(exc)), traceback.format_exc())


def failure_answer(seq: int, env_id: int, error: BaseException, text: str) -> bytes:
    """The encoded answer of a call that failed at ``env_id`` (-1: before any env) with ``error``;
    an error that does not pickle travels as its traceback ``text`` alone."""
    try:
        return encode((seq, None, (env_id, error, text)), "the call's failure")
    except (TypeError, ValueError):
        return encode((seq, None, (env_id, None, text)), "the call's failure")
