"""The commands of a pool: how the trainer has its workers run one (a reset, a step, a control
call) and knows it done, even when Ctrl-C or a failure cuts it short; what a reset writes before it
goes out (``ResetEncoder``); and a control call's requests and answers (``CallRouter``).

Why and how: ``docs/internals.md``, "shmpool/pool/commands.py".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode

from ..calls import Failure, Request, encode, set_wrapper_attribute
from ..errors import PoolBrokenError, RemoteTraceback, SeedError, ShmpoolError, WorkerError
from ..interrupts import interrupts_deferred
from ..layout import (
    CMD_CALL,
    CMD_STEP,
    CMD_STEP_SOME,
    H_GLOBAL_STEP,
    H_STEPS_PER_SECOND,
    IDLE_AFTER,
    RESET_OPTION_BYTES,
    RESET_THIS_ENV,
    RESET_WITH_SEED,
    SEED_WORDS,
    seed_words,
)
from ..options import check_env_ids
from ..spaces import ActionCheckers
from ..system import monotonic
from .lifecycle import Parts
from .results import select_rows


class CommandChannel:
    """The commands of one pool: issues them to every worker, waits for them, records them done."""

    def __init__(self, parts: Parts) -> None:
        config = self._config = parts.config
        self._recover_writers = parts.recover_writers
        lifecycle = self._lifecycle = parts.lifecycle
        self._name = lifecycle.name
        self._waiter = parts.waiter
        self._results = parts.results
        self._batches = parts.batches
        self._check_open = parts.check_open
        self._closing = parts.closing
        self._fields = lifecycle.views
        self._header: Any = lifecycle.header
        #: Whether a step may go straight to its command: nothing pending, not broken, not closing.
        self.usable = False
        #: The failure that broke the pool: every later call raises ``PoolBrokenError`` from it.
        self.broken: BaseException | None = None
        #: A command sent (or being sent) whose results are not in yet: (seq, command, global step
        #: and env steps once done). Set before the first control word is written, so Ctrl-C anywhere
        #: in a send leaves it set, and the next call completes that command before issuing another.
        self.pending: tuple[int, int, int, int] | None = None
        #: Steps the pool took (with async batches, sends), published in the header for ``stats``.
        self.global_step = 0
        #: With autoreset DISABLED: envs whose episode ended and that no reset has restarted yet
        #: (gymnasium's vector envs refuse to step them, and so does the pool); None otherwise.
        self.ended = np.zeros(config.num_envs, np.bool_) if config.autoreset_mode == AutoresetMode.DISABLED else None
        self.env_steps = 0  # env steps taken: num_envs per step, the envs sent per send
        self._next_tick = 1  # the global step from which the next step reads the clock (see tick)
        #: When the clock was read last (0: never), how long 64 steps take, env_steps then, and whether
        #: the 64 steps before held an idle spell (see ``tick``).
        self._ticked = (0.0, 0.0, 0, False)
        self._rate_since = (0.0, 0)  # when the rate's window started, and env_steps then

    def enter(self, *, settle: bool = False) -> None:
        """Raises if the pool cannot be used; finishes a command that Ctrl-C interrupted; with
        ``settle``, then waits for async batches in flight (``settle_batches``)."""
        self._check_open()
        if self.broken is not None:
            raise PoolBrokenError(
                f"pool {self._name!r} failed earlier ({type(self.broken).__name__}: {self.broken}); "
                f"close() it and launch a new one"
            ) from self.broken
        if self.pending is not None:  # a reset or step was interrupted: let the workers finish it
            self.finish("an interrupted call")
        self.usable = True
        if settle:
            self.settle_batches()

    def settle_batches(self, *, discard: bool = False) -> None:
        """Waits for async batches in flight (before a control call, a checkpoint or a reset, which
        also forgets their results with ``discard``); a failure they report breaks the pool."""
        try:
            if discard:
                self._batches.discard()
            else:
                self._batches.settle()
        except ShmpoolError as error:
            self.broken = error
            raise

    def prepare(self, command: int, seq: int | None = None, env_steps: int = 0) -> int:
        """Makes ``command`` pending (a step of ``env_steps`` envs), and returns its sequence number: from
        here on, it is sent and waited for by ``finish``, or by the next ``enter`` if Ctrl-C comes first."""
        self.usable = False
        steps = self.global_step + (command in (CMD_STEP, CMD_STEP_SOME))
        seq = self._lifecycle.next_seq() if seq is None else seq
        self.pending = (seq, command, steps, self.env_steps + env_steps)
        return seq

    def run(self, command: int, phase: str, seq: int | None = None, env_steps: int = 0) -> None:
        """Sends ``command`` (a step of ``env_steps`` envs) to every worker and, unless it is a call
        (whose requests go next), waits until all have done it."""
        seq = self.prepare(command, seq, env_steps)
        if command == CMD_CALL:
            self._lifecycle.send(seq, command)
        else:
            self.finish(phase)

    def finish(self, phase: str) -> list[Any]:
        """Sends the pending command (again, if Ctrl-C cut its send short), waits, and records it done;
        returns a call's answers."""
        assert self.pending is not None
        seq, command, steps, env_steps = self.pending
        self._lifecycle.send(seq, command)
        answers: list[Any] = []
        try:
            if command == CMD_CALL:
                answers = self._waiter.receive_calls(seq, phase)
            self._waiter.wait_done(seq, phase)
            if command in (CMD_STEP, CMD_STEP_SOME) and self.ended is not None:  # here: an interrupted step counts too
                ended = self._fields["terminations"] | self._fields["truncations"]
                self.ended |= ended if command == CMD_STEP else ended & self._fields["step_mask"]
            # Before clearing pending: a repeat after Ctrl-C here is harmless, and a step finished by
            # the next call (Ctrl-C came during its wait) counts, once.
            self.global_step, self.env_steps = steps, env_steps
            self._header[H_GLOBAL_STEP] = steps
            self.pending = None
            self.usable = not self._closing()  # close() from another thread clears it first
            self._waiter.raise_failures(phase)
        except ShmpoolError as error:
            self.broken = error
            self.usable = False
            raise
        if steps >= self._next_tick:
            self.tick()
        if self._config.param_specs and command != CMD_CALL:
            self._results.warn_refusals()
        return answers

    def refuse_ended(self, ended: np.ndarray) -> None:
        """Raises for a step of envs whose episode ended (autoreset DISABLED): ``ended`` says which."""
        raise RuntimeError(
            f"pool {self._name!r}: the episodes of envs {np.flatnonzero(ended).tolist()} ended; with "
            f"autoreset_mode DISABLED, reset them with reset(options={{'reset_mask': mask}}) before stepping"
        )

    def count_send(self, env_steps: int) -> None:
        """Counts an async send of ``env_steps`` envs that went out as one step of the pool."""
        self.global_step += 1
        self._header[H_GLOBAL_STEP] = self.global_step
        self.env_steps += env_steps
        if self.global_step >= self._next_tick:
            self.tick()

    def tick(self) -> None:
        """Publishes the env steps per second for ``stats`` (over the last second or so, and at the end
        of an idle spell for the stepping before it), and rolls back what a dead writer left. Called at
        the first step (or send), then every 64th: the only steps that read the clock. The rules:
        ``docs/internals.md``, "shmpool/pool/commands.py"."""
        now = monotonic()
        last, took, steps_then, after_spell = self._ticked
        since, then = self._rate_since
        spell = bool(last) and now - last > took + IDLE_AFTER
        if not last:
            since, then = now, self.env_steps
        elif spell:
            if last > since and steps_then > then:  # the stepping before the spell, measured exactly
                self._header[H_STEPS_PER_SECOND] = int((steps_then - then) / (last - since))
            since, then = now, self.env_steps
        if now - since >= 1.0:
            self._header[H_STEPS_PER_SECOND] = int((self.env_steps - then) / (now - since))
            since, then = now, self.env_steps
        self._rate_since = (since, then)
        # The next 64 steps are judged against the stepping's pace: a spell's 64 steps would hide a
        # spell in the next 64 (rollouts of 65 to 127 steps), unless the last 64 held one too.
        paced = spell and not after_spell
        self._ticked = (now, took if paced else (now - last if last else 0.0), self.env_steps, spell)
        self._next_tick = self.global_step + 64
        self._recover_writers()


class PartialSteps:
    """The steps of some envs of a synchronous pool (``Pool.step(actions, env_ids=...)``): only those
    envs step, sync their parameters and count; they come back in the order asked."""

    def __init__(
        self,
        parts: Parts,
        commands: CommandChannel,
        resets: ResetEncoder,
        action_fields: list[np.ndarray],
        action_space: Any,
    ) -> None:
        config = parts.config
        self._where = f"pool {parts.lifecycle.name!r}: step(actions, env_ids)"
        self._refused = f"engine={config.engine!r}" if config.engine != "python" else "hooks" if config.hooks else None
        self._num_envs = config.num_envs
        self._label = config.env_label
        self._commands, self._resets, self._results = commands, resets, parts.results
        self._action_fields = action_fields
        self._mask = parts.lifecycle.views["step_mask"]
        self.checkers = ActionCheckers(action_space, self._label)

    def step(self, actions: Any, env_ids: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Steps the envs ``env_ids`` with ``actions`` (a row each); returns their results in that
        order. Call it holding the pool's call lock, entered, with no async batch in flight."""
        if self._refused is not None:
            raise ValueError(f"{self._where}: a pool with {self._refused} steps whole slots; pass env_ids=None")
        ids = check_env_ids(np.atleast_1d(env_ids), self._num_envs, self._where, unique=True)
        if not len(ids):
            raise ValueError(f"{self._where}: no env ids")
        if self._resets.never_reset[ids].any():
            self._resets.refuse_step(self._where)
        parts = self.checkers.check(actions, ids)
        ended = self._commands.ended
        if ended is not None and ended[ids].any():
            asked = np.zeros_like(ended)
            asked[ids] = True
            self._commands.refuse_ended(ended & asked)
        for field, part in zip(self._action_fields, parts):
            field[ids] = part
        self._mask[:] = False
        self._mask[ids] = True
        self._commands.run(CMD_STEP_SOME, "step", env_steps=len(ids))
        return select_rows(self._results.step(), ids, self._num_envs)


class Answers(NamedTuple):
    """Each worker's answer to one call, and where each of its values goes among the results."""

    by_worker: list[tuple[list[Any] | None, Failure | None]]
    places: list[list[int]]  # by worker: the request index of each of its values
    size: int  # how many requests


class CallRouter:
    """Turns the control calls of one pool into requests and runs them in its workers (and in the
    trainer's own slot, with ``trainer_slot=True``)."""

    def __init__(self, parts: Parts, commands: CommandChannel) -> None:
        self._config = parts.config
        self._lifecycle = parts.lifecycle
        self._name = parts.lifecycle.name
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
                    lifecycle.call_pipes[worker_id].send_bytes(message)
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


#: The deepest nesting of reset options taken.
JSON_DEPTH = 64


class EncodedReset(NamedTuple):
    """A reset's checked arguments (``ResetEncoder.encode``): each env's seed, the envs it resets, and
    its options as JSON (None: no options)."""

    seeds: list[int | None]
    mask: np.ndarray
    options: bytes | None


def changed_by_json(value: Any, where: str, depth: int = 0) -> str | None:
    """What of ``value`` JSON would not give back as it is (a key that is not a str, a tuple, a type
    of its own; numbers of Python's types and their subclasses come back as those types), said in
    words; None if nothing."""
    if depth > JSON_DEPTH:
        return f"{where[:40]}... is nested more than {JSON_DEPTH} deep (a container holding itself?)"
    if isinstance(value, dict):
        for key, item in value.items():
            changed = f"{where} has the key {key!r}, not a str" if type(key) is not str else None
            changed = changed or changed_by_json(item, f"{where}[{key!r}]", depth + 1)
            if changed is not None:
                return changed
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            changed = changed_by_json(item, f"{where}[{index}]", depth + 1)
            if changed is not None:
                return changed
        return None
    if value is None or isinstance(value, (str, int, float)):  # np.float64 is a float, np.int64 no int
        return None
    return f"{where} is {value!r:.60}, a {type(value).__name__}"


class ResetEncoder:
    """Writes the resets of one pool into its segment; remembers which envs no reset has reached.

    ``ended``: with autoreset DISABLED, the envs whose episode ended (see ``CommandChannel.ended``),
    which a reset restarts; None otherwise.
    """

    def __init__(self, parts: Parts, ended: np.ndarray | None) -> None:
        self._num_envs = parts.config.num_envs
        self._launch_seed = parts.config.seed
        self._fields = parts.lifecycle.views
        self._ended = ended
        #: Envs no reset has reached yet: the launch seed seeds each one's first reset (read it only).
        self.never_reset = np.ones(self._num_envs, dtype=np.bool_)
        #: Whether every env has been reset (a step before that is refused: ``refuse_step``); kept,
        #: not worked out from ``never_reset``, because every step reads it.
        self.all_reset = False

    def encode(self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None) -> EncodedReset:
        """The reset's seeds, mask and options, checked: a reset refused for its arguments raises here,
        before anything changed (async batches in flight included)."""
        n = self._num_envs
        if seed is None and self._launch_seed is not None and self.never_reset.any():
            # Masked resets too (SB3's ShmpoolVecEnv resets groups of envs with different options).
            seed = [self._launch_seed + i if first else None for i, first in enumerate(self.never_reset.tolist())]
        seeds = checked_seeds(seed, n)
        mask = np.ones(n, dtype=np.bool_)
        encoded = None
        if options is not None:
            options = dict(options)
            if "reset_mask" in options:
                mask = check_reset_mask(options.pop("reset_mask"), n)
            encoded = encode_options(options)
        return EncodedReset(seeds, mask, encoded)

    def write(self, reset: EncodedReset, global_step: int) -> None:
        """Writes an encoded reset's flags, seeds and options to the segment, for the workers to read,
        and the pool's ``global_step``, which they restart their step count from."""
        seeds, mask, encoded = reset
        if self._ended is not None:
            self._ended[mask] = False
        fields = self._fields
        flags = fields["reset_flags"]
        flags[:] = np.where(mask, RESET_THIS_ENV, 0)
        for env_id, env_seed in enumerate(seeds):
            if env_seed is not None and mask[env_id]:
                fields["reset_seed"][env_id] = seed_words(env_seed)
                flags[env_id] |= RESET_WITH_SEED
        if encoded is not None:
            fields["reset_options"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        fields["reset_options_length"][0] = 0 if encoded is None else len(encoded)
        # Workers restart their step count from the pool's: after async batches, where each worker
        # counted its own steps, hooks, events and records go back to the pool's numbering.
        fields["reset_global_step"][0] = global_step
        self.never_reset[mask] = False  # before the command: a reset that Ctrl-C interrupts is still done later
        self.all_reset = not self.never_reset.any()

    def refuse_step(self, where: str) -> None:
        """Raises gymnasium's ``ResetNeeded`` naming the envs never reset, for a step asked before
        every env was (``all_reset``): in the trainer, before anything is sent, since an env raising
        it in a worker would break the pool."""
        never = np.flatnonzero(self.never_reset).tolist()
        raise ResetNeeded(f"{where}: envs {never!r:.80} were never reset; call reset() (or async_reset()) first")


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


def checked_seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    """Each of ``n`` envs' seed (or None) for ``reset(seed=...)``: an int gives env ``i`` ``seed + i``.
    Raises ``SeedError`` naming the first seed gymnasium would refuse, ``ValueError`` for a wrong count."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)):
        seeds: list[int | None] = [check_seed(int(seed), "seed") + i for i in range(n)]
    else:
        seeds = list(seed)
        if len(seeds) != n:
            raise ValueError(f"reset got {len(seeds)} seeds for num_envs={n}")
        seeds = [None if s is None else check_seed(s, f"seed[{i}]") for i, s in enumerate(seeds)]
    if seeds[-1] is not None:
        check_seed(seeds[-1], f"seed + {n - 1} (env {n - 1})")
    return seeds


def encode_options(options: dict[str, Any]) -> bytes:
    """Reset ``options`` (``reset_mask`` taken out) as the JSON the workers read; raises for data that
    JSON would change or that does not fit the segment."""
    changed = changed_by_json(options, "options")
    if changed is not None:  # the env would get other data than it was given
        raise TypeError(f"reset options must be plain JSON data (shmpool pickles nothing): {changed}")
    encoded = json.dumps(options).encode()
    if len(encoded) > RESET_OPTION_BYTES:
        raise ValueError(f"reset options take {len(encoded)} bytes as JSON; at most {RESET_OPTION_BYTES} fit")
    return encoded


def check_seed(seed: Any, where: str) -> int:
    """``seed`` if it is one gymnasium takes and the segment holds (a non-negative int below
    2**256), else a ``SeedError`` naming it; nothing has been written yet."""
    if not isinstance(seed, (int, np.integer)):
        raise SeedError(f"Seed must be a python integer (or None): reset got {where} = {seed!r:.40}")
    if not 0 <= seed < 1 << (SEED_WORDS * 64):
        raise SeedError(f"Seed must be between 0 and 2**{SEED_WORDS * 64} - 1: reset got {where} = {seed}")
    return int(seed)
