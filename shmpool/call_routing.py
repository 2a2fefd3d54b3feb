"""Control-call routing: ``Pool.env_apply`` and gymnasium's ``call``/``get_attr``/``set_attr`` as
one request per env, split by worker, sent on each worker's pipe under one CALL command, and the
answers put back in request order; a failure is raised with its type, naming the env it happened in.

``shmpool.calls`` is the wire format the requests and answers travel in, and
``shmpool.commands`` the command they ride on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .calls import Failure, Request, encode, set_wrapper_attribute
from .commands import CommandChannel
from .config import PoolConfig, check_env_ids
from .errors import RemoteTraceback, WorkerError
from .interrupts import interrupts_deferred
from .layout import CMD_CALL
from .lifecycle import Lifecycle


class Answers(NamedTuple):
    """Each worker's answer to one call, and where each of its values goes among the results."""

    by_worker: list[tuple[list[Any] | None, Failure | None]]
    places: list[list[int]]  # by worker: the request index of each of its values
    size: int  # how many requests


class CallRouter:
    """Turns the control calls of one pool into requests and runs them in its workers (and in the
    trainer's own slot, with ``trainer_slot=True``)."""

    def __init__(self, config: PoolConfig, lifecycle: Lifecycle, commands: CommandChannel) -> None:
        self._config = config
        self._name = lifecycle.name
        self._lifecycle = lifecycle
        self._commands = commands

    def apply_requests(
        self,
        function: Callable[..., Any] | str,
        env_ids: Sequence[int] | None,
        args: Sequence[Any],
        kwargs: dict[str, Any] | None,
    ) -> list[Request]:
        """The requests of ``env_apply(function, env_ids, args=args, kwargs=kwargs)``, in its order."""
        num_envs = self._config.num_envs
        if env_ids is None:
            ids = list(range(num_envs))
        else:
            ids = check_env_ids(env_ids, num_envs, "env_apply", unique=False).tolist()
        return [(env_id, function, tuple(args), dict(kwargs or {})) for env_id in ids]

    def set_attr_requests(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> list[Request]:
        """The requests of ``set_attr(name, values)``: one value per env if ``values`` is a list or
        tuple, else the one value for all, as gymnasium's ``set_attr``."""
        num_envs = self._config.num_envs
        if not isinstance(values, (list, tuple)):
            values = [values] * num_envs
        if len(values) != num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {num_envs} environments."
            )
        return [(env_id, set_wrapper_attribute, (name, value), {}) for env_id, value in enumerate(values)]

    def run(self, requests: list[Request], what: str) -> Answers:
        """Sends each worker its part of the call and waits for every answer. Call it holding the
        pool's call lock, once the pool is entered and no async batch is in flight (a worker mid-step
        would take the call for its next command)."""
        by_worker: list[list[Request]] = [[] for _ in self._config.slots]
        places: list[list[int]] = [[] for _ in self._config.slots]  # where each answer goes
        worker_of = self._config.worker_of
        for place, request in enumerate(requests):
            by_worker[worker_of[request[0]]].append(request)
            places[worker_of[request[0]]].append(place)
        lifecycle = self._lifecycle
        seq = lifecycle.next_seq()
        messages = [encode((seq, part), f"the arguments of {what}") for part in by_worker]
        local, local_id = lifecycle.local, lifecycle.local_id
        # A request half-written to a pipe could not be sent again; and the trainer's own slot
        # (the last) runs its part in here too: a Ctrl-C held back until after the call is
        # pending must find that part done, or finishing the call would wait for it forever.
        # (Its envs' code runs with Ctrl-C held back anyway: the slot marks the call done only if run.)
        with interrupts_deferred():
            self._commands.run(CMD_CALL, f"call {what}", seq)
            for worker_id, message in enumerate(messages):
                if worker_id == local_id:
                    continue
                try:
                    lifecycle.send_call(worker_id, message)
                except OSError:  # its end of the pipe is gone: the worker died while idle
                    pass  # the wait below names it (WorkerDiedError)
            local_answer = local.call(seq, by_worker[-1]) if local is not None else None
        answers = self._commands.finish(f"call {what}")
        if local is not None:
            answers.append(local_answer)
        return Answers(answers, places, len(requests))

    def results(self, answers: Answers, what: str) -> list[Any]:
        """The values of every request, in request order; raises the first worker's failure."""
        results: list[Any] = [None] * answers.size
        for worker_id, (values, failure) in enumerate(answers.by_worker):
            if failure is not None:
                self._raise_failure(worker_id, failure, what)
            for place, value in zip(answers.places[worker_id], values or ()):
                results[place] = value
        return results

    def _raise_failure(self, worker_id: int, failure: Failure, what: str) -> None:
        where = f"{failure.where(f'worker {worker_id}', self._config.env_label)} of pool {self._name!r} in {what}"
        error = failure.error
        if error is None:  # it could not be rebuilt here: its type, message and traceback text are what is left
            raise WorkerError(
                f"{failure.type_name}: {failure.message} (raised by {where}; {failure.problem}; the pool is "
                f"still usable)",
                worker_id=worker_id,
                env_id=failure.env_id if failure.env_id >= 0 else None,
                traceback_text=failure.text,
            )
        if hasattr(error, "add_note"):
            error.add_note(f"raised by {where}")
        raise error from RemoteTraceback(failure.text)
