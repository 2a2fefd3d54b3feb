"""Control calls: gymnasium's ``call``/``get_attr``/``set_attr``/``render`` and ``Pool.env_apply``,
which run arbitrary functions on the envs inside the workers and bring their results back.

Why and how: ``docs/internals.md``, "shmpool/calls.py".
"""

from __future__ import annotations

import io
import traceback
from typing import Any, NamedTuple

import dill

#: The largest pickled request or answer one worker's pipe carries for one call (frames of
#: ``render`` for a slot of 64 envs at 600x400 RGB take about 46 MB).
MAX_CALL_BYTES = 256 << 20

#: One env's part of a call: (env id, function or attribute name, args, kwargs).
Request = tuple[int, Any, tuple[Any, ...], dict[str, Any]]

#: Where a call failed: in the function applied to an env, in the worker reading the call's
#: arguments (before any env), or in moving a result (or the whole answer) to the trainer.
IN_ENV, IN_ARGUMENTS, IN_RESULT = "env", "arguments", "result"

#: How a failure's exception travels after the header: not at all (it does not pickle), pickled
#: whole, or as its class, args and attributes (see ``_rebuild``).
_NO_ERROR, _WHOLE, _PARTS = 0, 1, 2


class Failure(NamedTuple):
    """How one worker's part of a control call failed."""

    #: The env whose function raised or whose result failed to travel; -1: none (see ``stage``).
    env_id: int
    #: ``IN_ENV``, ``IN_ARGUMENTS`` or ``IN_RESULT``.
    stage: str
    #: The exception, rebuilt in the trainer; None if it could not be (``problem`` says why).
    error: BaseException | None
    #: The exception's type (qualified name) and message, also when it could not be rebuilt.
    type_name: str
    message: str
    #: The traceback text where it was raised.
    text: str
    #: Why ``error`` is None; empty otherwise.
    problem: str = ""

    def where(self, worker: str, env_label: str) -> str:
        """Where it failed, in words, for the error's note: ``worker`` names the worker."""
        if self.stage == IN_ARGUMENTS:
            return f"{worker} (before any env, reading the call's arguments, {env_label})"
        if self.stage == IN_RESULT:
            if self.env_id < 0:
                return f"the answer of {worker} ({env_label})"
            return f"the result of env {self.env_id} ({worker}, {env_label})"
        return f"env {self.env_id} ({worker}, {env_label})"


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
    """A message sent by ``encode`` over a pool's private pipe (never from shared memory)."""
    return dill.loads(data)


def set_wrapper_attribute(env: Any, name: str, value: Any) -> None:
    """Sets ``name`` on ``env`` as gymnasium's ``set_attr`` does (on the wrapper that has it)."""
    env.set_wrapper_attr(name, value)


def run_requests(envs: list[Any], first_env_id: int, seq: int, requests: list[Request]) -> bytes:
    """Runs one worker's part of call ``seq`` and returns its encoded answer (see ``decode_answer``).

    A string is gymnasium's ``call``: the attribute, called with the arguments if it is callable; a
    callable is applied as ``function(env, *args, **kwargs)``. The first env that raises ends the
    call; its exception travels back (or its type, message and traceback text, if it does not pickle).
    """
    results: list[Any] = []
    for env_id, function, args, kwargs in requests:
        env = envs[env_id - first_env_id]
        try:
            if isinstance(function, str):
                value = env.get_wrapper_attr(function)
                results.append(value(*args, **kwargs) if callable(value) else value)
            else:
                results.append(function(env, *args, **kwargs))
        # KeyboardInterrupt and SystemExit too: here only the function raises them (a worker ignores
        # Ctrl-C; the trainer's slot holds it back while it runs a call), and the call must still be
        # answered and marked done, or the pool would wait for it forever.
        except (Exception, KeyboardInterrupt, SystemExit) as exc:  # reported to the trainer, which raises it there
            return failure_answer(seq, env_id, exc, traceback.format_exc())
    return _results_answer(seq, [request[0] for request in requests], results)


def _results_answer(seq: int, env_ids: list[int], results: list[Any]) -> bytes:
    """The encoded answer of a call that ran: the header, then one pickle per result (so that the
    trainer can name the env whose result it cannot unpickle)."""
    stream = io.BytesIO()
    dill.dump((seq, env_ids, None), stream, protocol=dill.HIGHEST_PROTOCOL)
    for env_id, result in zip(env_ids, results):
        try:
            dill.dump(result, stream, protocol=dill.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - dill raises many types for objects it cannot pickle
            error = TypeError(f"the result cannot be pickled to reach the trainer: {type(exc).__name__}: {exc}")
            return failure_answer(seq, env_id, error, traceback.format_exc(), IN_RESULT)
    if stream.tell() > MAX_CALL_BYTES:
        size = stream.tell()
        large = ValueError(f"the call's answer takes {size} bytes pickled; at most {MAX_CALL_BYTES} fit in one call")
        return failure_answer(seq, -1, large, "".join(traceback.format_exception_only(large)), IN_RESULT)
    return stream.getvalue()


def serve_call(slot: Any, seq: int, requests: list[Request]) -> bytes:
    """Runs one worker's part of call ``seq`` on its slot, between the slot's ``before_call`` and
    ``after_call``; a failure of ``after_call`` (the slot refusing what the call did to an env) is
    the call's answer, naming the slot's first env, and leaves the pool usable."""
    slot.before_call()
    answer = run_requests(slot.envs, slot.start, seq, requests)
    try:
        slot.after_call()
    except Exception as exc:  # noqa: BLE001 - reported to the caller, not fatal to the worker
        return failure_answer(seq, slot.start, exc, traceback.format_exc())
    return answer


def failure_answer(seq: int, env_id: int, error: BaseException, text: str, stage: str | None = None) -> bytes:
    """The encoded answer of a call that failed with ``error`` at ``env_id`` (-1: before any env,
    reading the call's arguments, unless ``stage`` says otherwise); ``text`` is its traceback text."""
    stage = stage or (IN_ENV if env_id >= 0 else IN_ARGUMENTS)
    kind, payload, problem = _pickle_error(error)
    stream = io.BytesIO()
    header = (env_id, stage, _type_name(type(error)), _message(error), text, kind, problem)
    dill.dump((seq, None, header), stream, protocol=dill.HIGHEST_PROTOCOL)
    stream.write(payload)
    return stream.getvalue()


def decode_answer(data: bytes) -> tuple[int, list[Any] | None, Failure | None]:
    """A worker's answer ``(seq, results, failure)``, from ``run_requests`` or ``failure_answer``.

    Raises only if the header does not unpickle (a damaged message); a result or an exception that
    cannot be rebuilt here becomes a ``Failure`` whose ``error`` is None.
    """
    stream = io.BytesIO(data)
    seq, env_ids, header = dill.load(stream)
    if header is None:
        results: list[Any] = []
        for env_id in env_ids:
            try:
                results.append(dill.load(stream))
            except Exception as exc:  # noqa: BLE001 - e.g. a result whose class this process cannot import
                text, problem = traceback.format_exc(), "the trainer cannot unpickle this result"
                return seq, None, Failure(env_id, IN_RESULT, None, _type_name(type(exc)), _message(exc), text, problem)
        return seq, results, None
    env_id, stage, type_name, message, text, kind, problem = header
    error: BaseException | None = None
    if kind != _NO_ERROR:
        try:
            error = _rebuild(dill.load(stream)) if kind == _PARTS else dill.load(stream)
        except Exception as exc:  # noqa: BLE001 - an exception class that pickles but does not unpickle
            problem = f"it could not be rebuilt here ({type(exc).__name__}: {exc})"
        else:
            if not isinstance(error, BaseException):
                problem, error = f"it unpickled as a {type(error).__name__}, not an exception", None
    return seq, None, Failure(env_id, stage, error, type_name, message, text, problem)


def _pickle_error(error: BaseException) -> tuple[int, bytes, str]:
    """How ``error`` travels: (kind, pickled, why it does not pickle)."""
    cls = type(error)
    # An exception with pickle's default reduction is rebuilt as ``cls(*error.args)``, which fails
    # for an ``__init__`` that takes other arguments than it passes on to ``Exception``; sent as its
    # parts, it can be rebuilt without ``__init__`` then, as pickle rebuilds any other object.
    parts = cls.__reduce__ is BaseException.__reduce__ and cls.__reduce_ex__ is BaseException.__reduce_ex__
    message: Any = (cls, error.args, getattr(error, "__dict__", None)) if parts else error
    try:
        payload = dill.dumps(message, protocol=dill.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - dill raises many types for objects it cannot pickle
        return _NO_ERROR, b"", f"it cannot be pickled ({type(exc).__name__}: {exc})"
    if len(payload) > MAX_CALL_BYTES:
        return _NO_ERROR, b"", f"it takes {len(payload)} bytes pickled"
    return (_PARTS if parts else _WHOLE), payload, ""


def _rebuild(parts: tuple[type[BaseException], tuple[Any, ...], dict[str, Any] | None]) -> BaseException:
    """An exception from its class, args and attributes: as pickle would, or, if the class will not
    take back its own args, without calling its ``__init__``."""
    cls, args, state = parts
    try:
        error = cls(*args)
    except Exception:  # noqa: BLE001 - any __init__ that refuses its args: the attributes are set below
        error = cls.__new__(cls, *args)
    if state:
        error.__setstate__(state)
    return error


def _type_name(cls: type) -> str:
    module = getattr(cls, "__module__", "")
    return cls.__qualname__ if module in ("builtins", "", None) else f"{module}.{cls.__qualname__}"


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a __str__ that raises must not lose the failure
        return f"<{type(error).__name__} whose str() raised>"
