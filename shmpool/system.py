"""Everything shmpool asks of the operating system, in one module.

Named POSIX shared memory and semaphores (through ``posix_ipc``), ``mmap``, process liveness
(``/proc``, pidfds), the parent-death signal and the wait loop live here; the rest of the package sees
:class:`Segment`, :class:`Doorbell` and :class:`ProcessWatch` only.

Names: a pool called ``NAME`` owns the segment ``/shmpool-NAME`` and the semaphores
``/shmpool-NAME.<suffix>`` (``/dev/shm/sem.shmpool-NAME.<suffix>`` on Linux). The segment is always
created first and unlinked last, so a semaphore whose segment is gone is a leftover.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import select
import signal
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import posix_ipc

from .errors import LayoutMismatchError, PoolExistsError, PoolNotFoundError, ShmpoolError

SEGMENT_PREFIX = "shmpool-"
SHM_DIR = "/dev/shm"
_SEMAPHORE_FILE_PREFIX = "sem."


def segment_path(name: str) -> str:
    """The POSIX name (``/shmpool-NAME``) of the segment of the pool called ``name``."""
    return f"/{SEGMENT_PREFIX}{name}"


def doorbell_path(name: str, suffix: str) -> str:
    """The POSIX name of one of the semaphores of the pool called ``name``."""
    return f"/{SEGMENT_PREFIX}{name}.{suffix}"


def usable_cores() -> int:
    """The number of CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Segment:
    """One mapped named shared-memory object: created by the pool's owner, opened by everyone else."""

    def __init__(self, name: str, buffer: mmap.mmap, *, created: bool) -> None:
        self.name = name
        self.buffer = buffer
        self.size = len(buffer)
        self.created = created

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Creates ``/shmpool-NAME`` with mode 0600 and reserves its pages now.

        ``O_CREX`` makes an existing name fail loudly instead of truncating another pool's segment
        under its readers. Reserving the pages with ``posix_fallocate`` turns a full ``/dev/shm`` into
        an error here instead of a SIGBUS in the middle of a step.
        """
        try:
            shm = posix_ipc.SharedMemory(segment_path(name), posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError as exc:
            raise PoolExistsError(f"a shared-memory segment named {segment_path(name)!r} already exists") from exc
        try:
            try:
                os.posix_fallocate(shm.fd, 0, size)
            except OSError as exc:
                raise ShmpoolError(
                    f"cannot reserve {size} bytes of shared memory for pool {name!r} in {SHM_DIR}: {exc}; "
                    f"free space there or use fewer envs"
                ) from exc
            buffer = mmap.mmap(shm.fd, size)
        except BaseException:
            shm.close_fd()
            unlink_segment(name)
            raise
        shm.close_fd()
        return cls(name, buffer, created=True)

    @classmethod
    def open(cls, name: str) -> Segment:
        """Maps an existing segment after checking that this user owns it and only this user can use it.

        Never creates, truncates or unlinks anything.
        """
        try:
            shm = posix_ipc.SharedMemory(segment_path(name))
        except posix_ipc.ExistentialError as exc:
            raise PoolNotFoundError(f"no shared-memory segment {segment_path(name)!r}") from exc
        except posix_ipc.PermissionsError as exc:
            raise PermissionError(f"segment {segment_path(name)!r} belongs to another user") from exc
        try:
            info = os.fstat(shm.fd)
            if info.st_uid != os.getuid():
                raise PermissionError(
                    f"segment {segment_path(name)!r} belongs to uid {info.st_uid}, not to this user ({os.getuid()})"
                )
            if stat.S_IMODE(info.st_mode) & 0o077:
                raise LayoutMismatchError(
                    f"segment {segment_path(name)!r} has mode {oct(stat.S_IMODE(info.st_mode))}; shmpool creates 0o600"
                )
            if info.st_size == 0:
                raise LayoutMismatchError(f"segment {segment_path(name)!r} is empty")
            buffer = mmap.mmap(shm.fd, info.st_size)
        finally:
            shm.close_fd()
        return cls(name, buffer, created=False)

    def unlink(self) -> None:
        """Removes the name; mappings that exist stay valid until they are closed."""
        unlink_segment(self.name)

    def close(self) -> None:
        """Unmaps the segment, unless numpy views of it are still alive (then their owners' GC does)."""
        try:
            self.buffer.close()
        except BufferError:
            pass


def unlink_segment(name: str) -> None:
    """Removes the segment of the pool called ``name``, ignoring one that is already gone."""
    try:
        posix_ipc.unlink_shared_memory(segment_path(name))
    except posix_ipc.ExistentialError:
        pass


class Doorbell:
    """A named semaphore used only as a wake-up counter, never as a lock.

    A ring says "look at the control words again". Rings may outnumber waits and a wait may find a
    stale ring; :meth:`wait_until` therefore always re-checks the real condition in shared memory.
    """

    def __init__(self, path: str, semaphore: posix_ipc.Semaphore, *, created: bool) -> None:
        self.path = path
        self._semaphore = semaphore
        self.created = created

    @classmethod
    def create(cls, path: str) -> Doorbell:
        """Creates a new semaphore at ``path`` (mode 0600, count 0)."""
        try:
            semaphore = posix_ipc.Semaphore(path, posix_ipc.O_CREX, mode=0o600, initial_value=0)
        except posix_ipc.ExistentialError as exc:
            raise PoolExistsError(f"a semaphore named {path!r} already exists") from exc
        return cls(path, semaphore, created=True)

    @classmethod
    def open(cls, path: str) -> Doorbell:
        """Opens an existing semaphore."""
        try:
            semaphore = posix_ipc.Semaphore(path)
        except posix_ipc.ExistentialError as exc:
            raise PoolNotFoundError(f"no semaphore {path!r}") from exc
        return cls(path, semaphore, created=False)

    def ring(self) -> None:
        """Wakes the waiter; costs an atomic add when nobody sleeps on it."""
        self._semaphore.release()

    def wait_until(
        self,
        ready: Callable[[], bool],
        *,
        spin: int,
        poll_interval: float,
        on_idle: Callable[[], None],
    ) -> None:
        """Returns once ``ready()`` is true.

        Spins ``spin`` times, yielding the core between polls (so a waiter that shares a core with
        the process it waits for hands the core over instead of stealing it), then sleeps on the
        semaphore. Every ``poll_interval`` seconds asleep it calls ``on_idle``, which raises to stop
        waiting (dead peer, deadline). Stale rings are drained before sleeping and the condition is
        re-checked after draining, so a ring is never lost: a ringer writes its data before it rings.
        """
        semaphore = self._semaphore
        for _ in range(spin):
            if ready():
                # Consume the ring that matches this wake-up so the count stays near zero.
                if semaphore.value:
                    semaphore.acquire(0)
                return
            os.sched_yield()
        while True:
            while semaphore.value:
                semaphore.acquire(0)
            if ready():
                return
            try:
                semaphore.acquire(poll_interval)
            except posix_ipc.BusyError:
                on_idle()
            except posix_ipc.SignalError:
                # A signal arrived while asleep; its Python handler has run (and raised, if it
                # wanted the wait to end). Anything else: go round and re-check.
                on_idle()
            else:
                if ready():
                    return

    def unlink(self) -> None:
        """Removes the name (ignores a name that is already gone)."""
        try:
            posix_ipc.unlink_semaphore(self.path)
        except posix_ipc.ExistentialError:
            pass

    def close(self) -> None:
        """Closes this process's handle."""
        try:
            self._semaphore.close()
        except posix_ipc.ExistentialError:
            pass


class WriterLock:
    """Excludes writers of one pool's params block from each other, across processes.

    A ``flock`` on the segment's file: the kernel drops it when its holder dies, so a writer killed
    mid-write cannot wedge the others (a semaphore would stay taken). Each lock opens its own file
    description, so two handles in one process exclude each other too.
    """

    def __init__(self, name: str) -> None:
        self._path = os.path.join(SHM_DIR, SEGMENT_PREFIX + name)
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                from .errors import PoolClosedError

                raise PoolClosedError(f"the pool's segment {self._path} is gone: the pool was closed") from exc
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Releases the file descriptor."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def unlink_doorbell(path: str) -> None:
    """Removes a semaphore by name, ignoring one that is already gone."""
    try:
        posix_ipc.unlink_semaphore(path)
    except posix_ipc.ExistentialError:
        pass


@dataclass(frozen=True)
class ShmEntry:
    """One object in ``/dev/shm`` that belongs to shmpool."""

    pool_name: str
    kind: str  # "segment" or "doorbell"
    posix_name: str


def list_entries() -> Iterator[ShmEntry]:
    """The shmpool segments and semaphores present in ``/dev/shm`` (any owner)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return
    for file_name in names:
        if file_name.startswith(SEGMENT_PREFIX):
            yield ShmEntry(file_name[len(SEGMENT_PREFIX) :], "segment", "/" + file_name)
        elif file_name.startswith(_SEMAPHORE_FILE_PREFIX + SEGMENT_PREFIX):
            posix_name = "/" + file_name[len(_SEMAPHORE_FILE_PREFIX) :]
            pool_name = posix_name[len(SEGMENT_PREFIX) + 1 :].rsplit(".", 1)[0]
            yield ShmEntry(pool_name, "doorbell", posix_name)


def owned_by_me(entry: ShmEntry) -> bool:
    """Whether the entry's file belongs to this user."""
    file_name = entry.posix_name[1:] if entry.kind == "segment" else _SEMAPHORE_FILE_PREFIX + entry.posix_name[1:]
    try:
        return os.stat(os.path.join(SHM_DIR, file_name)).st_uid == os.getuid()
    except FileNotFoundError:
        return False


def process_start_ticks(pid: int) -> int | None:
    """The start time of a live process in clock ticks since boot, or None if it is gone or a zombie.

    Together with the pid it names a process uniquely, even after the pid is reused.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def process_alive(pid: int, start_ticks: int) -> bool:
    """Whether the process that had ``pid`` and ``start_ticks`` still runs."""
    return pid > 0 and process_start_ticks(pid) == start_ticks


class ProcessWatch:
    """Tells whether one given process (the pool's owner) is still running, cheaply and race-free.

    Uses a pidfd where the kernel has them (readable once the process exits, immune to pid reuse),
    else the pid and its start time.
    """

    def __init__(self, pid: int, start_ticks: int) -> None:
        self.pid = pid
        self.start_ticks = start_ticks
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None
        if not process_alive(pid, start_ticks):
            self.close()
            self._gone = True
        else:
            self._gone = False

    def alive(self) -> bool:
        """Whether the watched process still runs."""
        if self._gone:
            return False
        if self._pidfd is not None:
            readable, _, _ = select.select([self._pidfd], [], [], 0)
            self._gone = bool(readable)
        else:
            self._gone = not process_alive(self.pid, self.start_ticks)
        return not self._gone

    def close(self) -> None:
        """Releases the pidfd."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def set_parent_death_signal(signum: int) -> None:
    """Asks Linux to send ``signum`` to this process when the thread that started it exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the bounded waits still notice the owner's death
        pass


def ignore_interrupts() -> None:
    """Makes this process ignore Ctrl-C; the trainer, which does not, stops its workers itself.

    The launcher blocks SIGINT while it starts workers (the mask is inherited across fork and exec),
    so a Ctrl-C that arrives before this call is discarded instead of killing a half-started worker.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def monotonic() -> float:
    """Seconds on the clock that deadlines use."""
    return time.monotonic()
