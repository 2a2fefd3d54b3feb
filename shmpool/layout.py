"""The byte map of a pool's segment, described as plain data and validated before use.

Why and how: ``docs/internals.md``, "shmpool/layout.py".
"""

from __future__ import annotations

import json
import math
import re
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import LayoutMismatchError, SegmentNotReadyError
from .system import pid_namespace

MAGIC = b"SHMPOOL\x00"
#: 3: the owner's pid namespace word, no owner-uid or worker-pid words, the writers' words and undo
#: journals, event tickets. 4: 256-bit reset seeds (gymnasium takes any non-negative int). 5: the params
#: generation word (readers copy the block without the per-row counters unless a write is in flight).
#: 6: the episode rings' reserved words, and the reset's global step. 7: the info key records' ``batch``.
#: 8: the writers' lock is a robust mutex in the ``writers`` words (16 of them), not a ``flock``; later,
#: without a new version (older segments read 0 there, which means unknown): the worker-pid words.
#: 9: ``params_accepted``, the records each worker last accepted (what a checkpoint saves for a refused one).
LAYOUT_VERSION = 9
HEADER_WORDS = 16
HEADER_BYTES = HEADER_WORDS * 8
ALIGNMENT = 64
MAX_TABLE_BYTES = 1 << 20

# Header word indices.
(
    H_MAGIC,
    H_VERSION,
    H_SIZE,
    H_OWNER_PID,
    H_OWNER_START,
    H_STATE,
    H_TABLE_OFFSET,
    H_TABLE_LENGTH,
    H_GLOBAL_STEP,  # steps the trainer has issued, for attached processes
    H_STEPS_PER_SECOND,  # env steps per second over the last second or so, for attached processes
    H_OWNER_PIDNS,  # the owner's pid namespace (inode of /proc/PID/ns/pid): its pid means nothing elsewhere
) = range(11)

# Pool states (header word H_STATE).
STATE_STARTING, STATE_RUNNING, STATE_CLOSING = 1, 2, 3

# Control row words, one row of CONTROL_WORDS int64 per worker.
CONTROL_WORDS = 16
(
    CTL_COMMAND,  # trainer → worker: seq << 8 | command
    CTL_DONE,  # worker → trainer: seq of the last finished command (published last)
    CTL_STATUS,  # worker: WORKER_* below
    CTL_ERROR_ENV,  # env id that raised, -1 for none
    CTL_NUM_DONE,  # envs of the slot whose episode ended this step
    CTL_NUM_INFO,  # envs of the slot that reported info this step
    CTL_INFO_KEYS,  # number of published entries in this worker's info key table
    CTL_ERROR_LENGTH,  # bytes of traceback text in this worker's errors row
    CTL_INFO_OVERFLOW,  # info keys this worker could not register (table full or path too long)
    CTL_PARAM_REFUSALS,  # raw parameter writes this worker refused (details in param_refusal_*)
    CTL_FINISHED_AT,  # CLOCK_MONOTONIC ns when the worker finished its last command: async recv's order
    CTL_PID,  # the worker's pid (the trainer's for its own slot), 0 until it is built: for stats
    CTL_START_TICKS,  # that process's start time in clock ticks (a pid reused later is not it)
) = range(13)

#: Seconds without a finished command, none in flight, after which a pool's rate reads as 0.
IDLE_AFTER = 2.0


def current_rate(published: int, control: np.ndarray) -> int:
    """The steps/s a pool published, or 0 once it is idle (the trainer publishes while it steps, so an
    idle pool's word keeps its last rate): no command in flight, none finished for ``IDLE_AFTER`` s."""
    in_flight = (control[:, CTL_COMMAND] >> 8 != control[:, CTL_DONE]).any()
    idle = time.monotonic_ns() - int(control[:, CTL_FINISHED_AT].max()) > IDLE_AFTER * 1e9
    return 0 if idle and not in_flight else published


#: CALL: run the request that follows on the worker's private pipe (see ``shmpool.calls``).
#: STEP_SOME: step only the envs flagged in ``step_mask`` (``Pool.step(actions, env_ids=...)``).
CMD_STEP, CMD_RESET, CMD_CLOSE, CMD_CALL, CMD_STEP_SOME = 1, 2, 3, 4, 5
WORKER_STARTING, WORKER_READY, WORKER_FAILED, WORKER_CLOSED = 0, 1, 2, 3
ERROR_BYTES = 8192
RESET_OPTION_BYTES = 4096
RESET_THIS_ENV, RESET_WITH_SEED = 1, 2
#: uint64 words per env of ``reset_seed``: seeds below 2**256 fit (an unseeded numpy generator's
#: seed, which ``np_random_seed`` reports and users pass back, is 128 bits).
SEED_WORDS = 4


def seed_words(seed: int) -> np.ndarray:
    """A non-negative seed below 2**256 as the ``reset_seed`` row that holds it."""
    return np.frombuffer(seed.to_bytes(SEED_WORDS * 8, "little"), dtype="<u8")


def seed_of(words: np.ndarray) -> int:
    """The seed a ``reset_seed`` row holds."""
    return int.from_bytes(words.astype("<u8").tobytes(), "little")


_ALLOWED_KINDS = set("biufcSV")
# The dtype strings Layout.plan writes (``dtype.str`` of plain types). Anything else numpy would parse
# (aliases, comma lists, subarray strings, retired codes) is refused rather than interpreted.
_DTYPE_STRING = re.compile(r"[<>|=]?[biufcSV][0-9]{1,9}")
_MAX_NDIM = 32  # numpy 1.x's limit; Layout.plan never writes more than a handful
_MAX_FIELDS = 100_000


def command_word(seq: int, command: int) -> int:
    """Packs a sequence number and a command into one control word."""
    return (seq << 8) | command


def split_command_word(word: int) -> tuple[int, int]:
    """The (sequence number, command) of a control word."""
    return word >> 8, word & 0xFF


@dataclass(frozen=True)
class Field:
    """One array in the segment: its name, dtype, shape and byte offset."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        """The size of the array in bytes (exact: Python ints never wrap, int64 products do)."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Header:
    """The decoded header words of a segment."""

    version: int
    size: int
    owner_pid: int
    owner_start_ticks: int
    state: int
    owner_pid_namespace: int = 0  # 0: unknown


def _align(value: int) -> int:
    return (value + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _encode_dtype(dtype: np.dtype[Any]) -> Any:
    if dtype.fields is None:
        return dtype.str
    entries = []
    for field_name in dtype.names or ():
        sub = dtype.fields[field_name][0]
        entries.append(
            [field_name, _encode_dtype(sub.base), list(sub.shape)] if sub.shape else [field_name, _encode_dtype(sub)]
        )
    return entries


def decode_dtype(description: Any) -> np.dtype[Any]:
    """Builds a dtype from its plain-data description, refusing anything that holds Python objects."""
    if isinstance(description, str):
        if not _DTYPE_STRING.fullmatch(description):
            raise LayoutMismatchError(f"bad dtype string {description[:40]!r}")
        dtype = np.dtype(description)
    elif isinstance(description, list):
        parts: list[Any] = []
        for item in description:
            if not isinstance(item, list) or len(item) not in (2, 3) or not isinstance(item[0], str):
                raise LayoutMismatchError(f"bad structured dtype entry {item!r}")
            sub = decode_dtype(item[1])
            if len(item) == 3:
                parts.append((item[0], sub, tuple(_check_shape(item[2]))))
            else:
                parts.append((item[0], sub))
        dtype = np.dtype(parts)
    else:
        raise LayoutMismatchError(f"bad dtype description {description!r}")
    if dtype.hasobject or any(np.dtype(t).kind not in _ALLOWED_KINDS for t in _leaf_types(dtype)):
        raise LayoutMismatchError(f"dtype {dtype} is not plain data")
    return dtype


def _leaf_types(dtype: np.dtype[Any]) -> Iterable[np.dtype[Any]]:
    if dtype.fields is None:
        yield dtype.base
        return
    for sub, *_ in dtype.fields.values():
        yield from _leaf_types(sub)


def _check_shape(shape: Any) -> list[int]:
    # type() is int: a JSON true is a Python bool, which isinstance(..., int) would let through.
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(type(n) is int and 0 <= n < 1 << 62 for n in shape)
    ):
        raise LayoutMismatchError(f"bad shape {shape!r:.100}")
    return shape


class Layout:
    """Where every field lives in a segment, plus plain-data metadata about the pool."""

    def __init__(self, fields: Mapping[str, Field], meta: Mapping[str, Any], size: int, table: bytes) -> None:
        self.fields = dict(fields)
        self.meta = dict(meta)
        self.size = size
        self._table = table

    @classmethod
    def plan(cls, specs: Iterable[tuple[str, npt.DTypeLike, tuple[int, ...]]], meta: Mapping[str, Any]) -> Layout:
        """Places the given (name, dtype, shape) fields after the header and the field table."""
        planned = [(name, np.dtype(dtype), tuple(int(n) for n in shape)) for name, dtype, shape in specs]
        names = [name for name, _, _ in planned]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate field names in {names}")
        # The table's length depends on the offsets it records: size it with placeholder offsets of
        # the largest width first, then place the fields after it.
        fields_json = [{"name": n, "dtype": _encode_dtype(d), "shape": list(s), "offset": 0} for n, d, s in planned]
        placeholder = json.dumps({"meta": dict(meta), "fields": fields_json}).encode()
        table_room = _align(len(placeholder) + 20 * len(planned) + 64)
        offset = HEADER_BYTES + table_room
        fields: dict[str, Field] = {}
        for entry, (name, dtype, shape) in zip(fields_json, planned):
            offset = _align(offset)
            field = Field(name, dtype, shape, offset)
            fields[name] = field
            entry["offset"] = offset
            offset += field.nbytes
        size = _align(max(offset, HEADER_BYTES + table_room))
        table = json.dumps({"meta": dict(meta), "fields": fields_json}).encode()
        if len(table) > table_room:  # cannot happen: offsets are at most 20 digits each
            raise RuntimeError("the field table outgrew the room reserved for it")
        return cls(fields, meta, size, table)

    def write_header(
        self,
        buffer: Any,
        *,
        owner_pid: int,
        owner_start_ticks: int,
    ) -> None:
        """Writes the table and the header words, the magic last (with this process's pid namespace:
        a process in another one sharing ``/dev/shm`` must not judge the owner by its pid)."""
        buffer[HEADER_BYTES : HEADER_BYTES + len(self._table)] = self._table
        words = memoryview(buffer)[:HEADER_BYTES].cast("q")
        words[H_VERSION] = LAYOUT_VERSION
        words[H_SIZE] = self.size
        words[H_OWNER_PID] = owner_pid
        words[H_OWNER_START] = owner_start_ticks
        words[H_STATE] = STATE_STARTING
        words[H_TABLE_OFFSET] = HEADER_BYTES
        words[H_TABLE_LENGTH] = len(self._table)
        words[H_OWNER_PIDNS] = pid_namespace()
        words.release()
        buffer[0:8] = MAGIC

    @staticmethod
    def read_header(buffer: Any) -> Header:
        """Validates magic, version and size and decodes the header words."""
        if len(buffer) < HEADER_BYTES:
            raise LayoutMismatchError(f"segment is {len(buffer)} bytes, smaller than a shmpool header")
        magic = bytes(buffer[0:8])
        if magic != MAGIC:
            if magic == bytes(8):  # written last by the creator: nothing there yet
                raise SegmentNotReadyError("a shmpool segment still being created (no magic yet), or not one")
            raise LayoutMismatchError("not a shmpool segment (bad magic)")
        version, size, pid, start, state = struct.unpack_from("<5q", buffer, H_VERSION * 8)
        (pid_namespace_id,) = struct.unpack_from("<q", buffer, H_OWNER_PIDNS * 8)
        if version != LAYOUT_VERSION:
            raise LayoutMismatchError(
                f"segment has layout version {version}; this shmpool reads version {LAYOUT_VERSION}"
            )
        if size != len(buffer):
            raise LayoutMismatchError(f"segment header says {size} bytes but the object has {len(buffer)}")
        return Header(version, size, pid, start, state, pid_namespace_id)

    @classmethod
    def read(cls, buffer: Any) -> tuple[Layout, Header]:
        """Validates a mapped segment and decodes its layout; trusts no offset before checking it.

        Anything malformed (bad JSON, nesting deep enough to exhaust the stack, wrong types, dtypes or
        shapes numpy would refuse or that overflow, fields outside the segment or overlapping) is a
        ``LayoutMismatchError``, never a raw exception from the parser or numpy.
        """
        header = cls.read_header(buffer)
        table_offset, table_length = struct.unpack_from("<2q", buffer, H_TABLE_OFFSET * 8)
        if (
            table_offset < HEADER_BYTES
            or not 0 < table_length <= MAX_TABLE_BYTES
            or table_offset + table_length > header.size
        ):
            raise LayoutMismatchError(f"field table at {table_offset}+{table_length} is outside the segment")
        table = bytes(buffer[table_offset : table_offset + table_length])
        try:
            document = json.loads(table)
            meta, entries = document["meta"], document["fields"]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            raise LayoutMismatchError(f"field table is not valid: {type(exc).__name__}: {exc!s:.200}") from exc
        if not isinstance(meta, dict) or not isinstance(entries, list) or len(entries) > _MAX_FIELDS:
            raise LayoutMismatchError("field table is not valid: wrong types")
        fields: dict[str, Field] = {}
        end_of_table = table_offset + table_length
        for entry in entries:
            if not isinstance(entry, dict):
                raise LayoutMismatchError(f"bad field entry {entry!r:.200}")
            try:
                name, offset = entry["name"], entry["offset"]
                dtype = decode_dtype(entry["dtype"])
                shape = tuple(_check_shape(entry["shape"]))
            except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
                raise LayoutMismatchError(f"bad field entry {entry!r:.200}: {exc!s:.200}") from exc
            if not isinstance(name, str) or type(offset) is not int or offset % ALIGNMENT:
                raise LayoutMismatchError(f"bad field entry {entry!r:.200}")
            if name in fields:
                raise LayoutMismatchError(f"field {name!r:.100} appears twice in the field table")
            field = Field(name, dtype, shape, offset)
            if offset < end_of_table or offset + field.nbytes > header.size:
                raise LayoutMismatchError(f"field {name!r:.100} at {offset}+{field.nbytes} is outside the segment")
            fields[name] = field
        ordered = sorted(fields.values(), key=lambda f: f.offset)
        for before, after in zip(ordered, ordered[1:]):
            if before.offset + before.nbytes > after.offset:
                raise LayoutMismatchError(f"fields {before.name!r} and {after.name!r} overlap")
        return cls(fields, meta, header.size, table), header

    def views(self, buffer: Any) -> dict[str, np.ndarray]:
        """Numpy arrays over every field of a mapped segment."""
        return {
            name: np.ndarray(field.shape, dtype=field.dtype, buffer=buffer, offset=field.offset)
            for name, field in self.fields.items()
        }


def header_words(buffer: Any) -> memoryview:
    """The header as int64 words, for reading and setting the state word."""
    return memoryview(buffer)[:HEADER_BYTES].cast("q")
