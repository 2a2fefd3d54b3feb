"""Everything shmpool asks of the operating system, in one module: named POSIX shared memory and semaphores,
``mmap``, process liveness (``/proc``, pidfds), the parent-death signal and the wait loop. The rest of the package
sees ``Segment``, ``Doorbell`` and ``ProcessWatch`` only. How pools' files are named: ``docs/internals.md``,
"shmpool/system.py: Names".
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import select
import signal
import stat
import time
import weakref
from collections.abc import Callable

import posix_ipc

from .errors import (
    LayoutMismatchError,
    PoolClosedError,
    PoolExistsError,
    PoolNotFoundError,
    SegmentNotReadyError,
    ShmpoolError,
)

SEGMENT_PREFIX = "shmpool-"
SHM_DIR = "/dev/shm"
SEMAPHORE_FILE_PREFIX = "sem."
#: The names ``launch`` accepts; anything else in /dev/shm with the prefix is not shmpool's, never opened.
POOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def is_pool_name(name: object) -> bool:
    """Whether ``name`` is one that ``launch`` accepts (``POOL_NAME_PATTERN``)."""
    return isinstance(name, str) and POOL_NAME_PATTERN.fullmatch(name) is not None


#: What tells one file from another that later takes the same name: (st_dev, st_ino).
FileIdentity = tuple[int, int]


#: This process's pid, kept up to date across forks: ``os.getpid`` is a system call, and the write
#: path asks on every call (which process is writing, whether a pool is used from its own process).
_THIS_PROCESS = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _THIS_PROCESS.__setitem__(0, os.getpid()))


def this_pid() -> int:
    """This process's pid (``os.getpid()``, without its system call)."""
    return _THIS_PROCESS[0]


def segment_path(name: str) -> str:
    """The POSIX name (``/shmpool-NAME``) of the segment of the pool called ``name``."""
    return f"/{SEGMENT_PREFIX}{name}"


def segment_file(name: str) -> str:
    """The file of the segment of the pool called ``name`` (Linux keeps POSIX shared memory in /dev/shm)."""
    return os.path.join(SHM_DIR, SEGMENT_PREFIX + name)


def doorbell_path(name: str, suffix: str) -> str:
    """The POSIX name of one of the semaphores of the pool called ``name``."""
    return f"/{SEGMENT_PREFIX}{name}.{suffix}"


def usable_cores() -> int:
    """The number of CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: Errors that say the process or the system ran out of file descriptors, not that a file is wrong.
SHORT_OF = (errno.EMFILE, errno.ENFILE)


class Segment:
    """One mapped named shared-memory object: created by the pool's owner, opened by everyone else."""

    def __init__(self, name: str, buffer: mmap.mmap, *, identity: FileIdentity | None = None) -> None:
        self.name = name
        self.buffer = buffer
        self.size = len(buffer)
        self.identity = identity  # of the file that was mapped (set by open): removal checks it is still that one

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Creates ``/shmpool-NAME`` with mode 0600 and reserves its pages now: ``O_CREX`` fails on an
        existing name instead of truncating another pool's segment under its readers, and reserving the
        pages (``posix_fallocate``) turns a full ``/dev/shm`` into an error here, not a SIGBUS mid-step."""
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
            info = os.fstat(shm.fd)
        except BaseException:
            shm.close_fd()
            unlink_segment(name)
            raise
        shm.close_fd()
        return cls(name, buffer, identity=(info.st_dev, info.st_ino))

    @classmethod
    def open(cls, name: str) -> Segment:
        """Maps an existing segment after checking that it is a regular file that this user owns and only
        this user can use. ``/dev/shm/shmpool-NAME`` is opened with ``O_NOFOLLOW``: a symlink, directory,
        fifo or device planted under a pool's name is refused before anything reads it. Never creates,
        truncates or unlinks anything; a process out of file descriptors gets the OSError."""
        if not is_pool_name(name):
            raise PoolNotFoundError(f"no pool can be named {name!r:.80}: pool names match {POOL_NAME_PATTERN.pattern}")
        path = segment_file(name)
        try:
            # O_NONBLOCK: opening a fifo planted under the name must not wait for a writer.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise PoolNotFoundError(f"no shared-memory segment {segment_path(name)!r}") from exc
        except PermissionError as exc:
            raise PermissionError(f"segment {path} belongs to another user: only its owner can open it") from exc
        except (OSError, ValueError) as exc:  # ELOOP: a symlink; EISDIR: a directory; ...
            if getattr(exc, "errno", None) in SHORT_OF:
                raise
            raise LayoutMismatchError(
                f"{path} is not a shared-memory segment ({exc}); shmpool did not make it: remove it if it is yours"
            ) from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise LayoutMismatchError(
                    f"{path} is not a shared-memory segment (file type {stat.S_IFMT(info.st_mode):o}); "
                    f"shmpool did not make it: remove it if it is yours"
                )
            if info.st_uid != os.getuid():
                raise PermissionError(
                    f"segment {segment_path(name)!r} belongs to uid {info.st_uid}, not to this user ({os.getuid()})"
                )
            if stat.S_IMODE(info.st_mode) & 0o077:
                raise LayoutMismatchError(
                    f"segment {segment_path(name)!r} has mode {oct(stat.S_IMODE(info.st_mode))}; shmpool creates 0o600"
                )
            if info.st_size == 0:  # created, not yet sized: its creator sizes it next
                raise SegmentNotReadyError(f"segment {segment_path(name)!r} is empty (a pool being created?)")
            try:
                buffer = mmap.mmap(fd, info.st_size)
            except (OSError, OverflowError, ValueError) as exc:
                if getattr(exc, "errno", None) in SHORT_OF:
                    raise
                raise LayoutMismatchError(
                    f"segment {segment_path(name)!r} of {info.st_size} bytes cannot be mapped ({exc}); "
                    f"shmpool never makes one that large: remove it if it is yours"
                ) from exc
        finally:
            os.close(fd)
        return cls(name, buffer, identity=(info.st_dev, info.st_ino))

    def unlink(self) -> None:
        """Removes the name; mappings that exist stay valid until they are closed."""
        unlink_segment(self.name)

    def close(self) -> None:
        """Lets go of the mapping; it is unmapped when the last numpy view of it is gone. Never
        ``mmap.close()``: arrays made with ``np.ndarray(buffer=...)`` keep the mmap alive but hold no buffer
        export, so an unmap would succeed under every view a user kept (``pool.params["x"]``)."""
        self.buffer = None  # type: ignore[assignment]


def unlink_segment(name: str) -> None:
    """Removes the segment of the pool called ``name``, ignoring one that is already gone."""
    try:
        posix_ipc.unlink_shared_memory(segment_path(name))
    except posix_ipc.ExistentialError:
        pass


class _TimeSpec(ctypes.Structure):
    """C's ``struct timespec``: a deadline for libc's semaphore waits."""

    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.sem_open.restype = ctypes.c_void_p
_libc.sem_open.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.sem_close.argtypes = (ctypes.c_void_p,)
# On the monotonic clock where libc has sem_clockwait (glibc 2.30 and later), else on the wall clock.
_CLOCK_WAIT = getattr(_libc, "sem_clockwait", None)
if _CLOCK_WAIT is not None:
    _CLOCK_WAIT.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_TimeSpec))
else:
    _libc.sem_timedwait.argtypes = (ctypes.c_void_p, ctypes.POINTER(_TimeSpec))


def _sem_wait(handle: int, seconds: float) -> int:
    """libc's timed wait on the semaphore at ``handle``: 0 once it took a ring, else the errno."""
    clock = time.CLOCK_MONOTONIC if _CLOCK_WAIT is not None else time.CLOCK_REALTIME
    deadline = time.clock_gettime(clock) + seconds
    whole = int(deadline)
    at = ctypes.byref(_TimeSpec(whole, int((deadline - whole) * 1e9)))
    waited = _CLOCK_WAIT(handle, clock, at) if _CLOCK_WAIT is not None else _libc.sem_timedwait(handle, at)
    return 0 if waited == 0 else ctypes.get_errno()


class Doorbell:
    """A named semaphore used only as a wake-up counter, never as a lock: a ring says "look at the
    control words again", and a wait may find a stale ring, so ``wait_until`` always re-checks the
    real condition in shared memory. It rings through posix_ipc and sleeps through libc, so that what
    a signal's handler raises during a sleep propagates (docs/internals.md, "Doorbells")."""

    def __init__(self, path: str, semaphore: posix_ipc.Semaphore) -> None:
        self.path = path
        self._semaphore = semaphore
        # Opened by name a second time (posix_ipc does not show its handle): a name unlinked and made
        # again in between would give another semaphore, but only the pool's owner does either.
        self._handle: int | None = _libc.sem_open(os.fsencode(path), 0)
        if not self._handle:
            code = ctypes.get_errno()
            semaphore.close()
            raise OSError(code, f"opening semaphore {path!r}: {os.strerror(code)}")

    @classmethod
    def create(cls, path: str) -> Doorbell:
        """Creates a new semaphore at ``path`` (mode 0600, count 0)."""
        try:
            semaphore = posix_ipc.Semaphore(path, posix_ipc.O_CREX, mode=0o600, initial_value=0)
        except posix_ipc.ExistentialError as exc:
            raise PoolExistsError(f"a semaphore named {path!r} already exists") from exc
        try:
            return cls(path, semaphore)
        except OSError:
            posix_ipc.unlink_semaphore(path)  # made just now: not left behind
            raise

    @classmethod
    def open(cls, path: str) -> Doorbell:
        """Opens an existing semaphore."""
        try:
            return cls(path, posix_ipc.Semaphore(path))
        except (posix_ipc.ExistentialError, FileNotFoundError) as exc:  # (gone between the two opens)
            raise PoolNotFoundError(f"no semaphore {path!r}") from exc

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
        """Returns once ``ready()`` is true. Spins ``spin`` times, yielding the core between polls (a waiter
        that shares a core with the process it waits for hands it over), then sleeps on the semaphore,
        calling ``on_idle`` (which raises to stop waiting: dead peer, deadline) every ``poll_interval``
        seconds asleep. Stale rings are drained before sleeping and the condition is re-checked after,
        so a ring is never lost: a ringer writes its data before it rings."""
        semaphore = self._semaphore
        for _ in range(spin):
            if ready():
                # Take every ring already there (several ringers, such as all the workers, may have
                # rung for this one wake-up), so the count stays at most the number of ringers
                # instead of growing by all but one on every wait. Trying costs no system call.
                while semaphore.value:
                    semaphore.acquire(0)
                return
            os.sched_yield()
        while True:
            while semaphore.value:
                semaphore.acquire(0)
            if ready():
                return
            if not self._sleep(poll_interval):  # timed out, or a signal's handler returned
                on_idle()
            elif ready():
                return

    def _sleep(self, seconds: float) -> bool:
        """Takes one ring, waiting up to ``seconds``; False if none came in time or a signal came."""
        handle = self._handle
        if handle is None:  # closed by another thread: libc must not be handed NULL
            raise PoolClosedError(f"semaphore {self.path!r} was closed")
        code = _sem_wait(handle, seconds)
        if code in (0, errno.ETIMEDOUT, errno.EINTR):
            return code == 0
        raise OSError(code, f"waiting on semaphore {self.path!r}: {os.strerror(code)}")

    def unlink(self) -> None:
        """Removes the name (ignores a name that is already gone)."""
        try:
            posix_ipc.unlink_semaphore(self.path)
        except posix_ipc.ExistentialError:
            pass

    def close(self) -> None:
        """Closes this process's handles."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _libc.sem_close(handle)
        try:
            self._semaphore.close()
        except posix_ipc.ExistentialError:
            pass


def doorbell_file(path: str) -> str:
    """The file of the semaphore with POSIX name ``path`` (glibc keeps it as ``/dev/shm/sem.NAME``)."""
    return os.path.join(SHM_DIR, SEMAPHORE_FILE_PREFIX + path.lstrip("/"))


def file_identity(path: str) -> FileIdentity | None:
    """(st_dev, st_ino) of the file at ``path`` itself (a symlink is not followed); None if there is none."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def unlink_if_same(path: str, identity: FileIdentity | None) -> bool:
    """Removes ``path`` only while it is still the file that had ``identity``; whether it removed it.

    A pool launched under a freed name owns new files there, which must survive whoever cleans up
    after the old one; the window between the check and the unlink is microseconds, not seconds.
    """
    if identity is None or file_identity(path) != identity:
        return False
    try:
        os.unlink(path)
    except (FileNotFoundError, PermissionError):  # gone meanwhile, or another user's
        return False
    return True


def pid_namespace() -> int:
    """The inode of this process's pid namespace (0 if unknown): pids are only comparable within one."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def descendants(root: int) -> set[int]:
    """The live (not zombie) processes below ``root`` in the process tree, through zombies too."""
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    for entry in os.listdir("/proc"):
        fields = stat_fields(int(entry)) if entry.isdigit() else None
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        if fields[0] not in (b"Z", b"X"):
            live.add(int(entry))
    found: set[int] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in live:
            found.add(pid)
        stack.extend(children.get(pid, []))
    return found


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None if gone or hidden."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError as error:  # gone, or (``hidepid``) not ours to see; out of descriptors is not "gone"
        if error.errno in SHORT_OF:
            raise
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return data[data.rindex(b")") + 2 :].split() or None


def process_state(pid: int) -> str:
    """The one-letter state of a process (``T`` stopped, ``R`` running, ...), or ``?``."""
    fields = stat_fields(pid)
    return fields[0].decode() if fields else "?"


def process_start_ticks(pid: int) -> int | None:
    """The start time of a live process in clock ticks since boot, or None if it is gone or a zombie.

    Together with the pid it names a process uniquely, even after the pid is reused.
    """
    fields = stat_fields(pid)
    if fields is None or fields[0] in (b"Z", b"X"):
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
        except (AttributeError, OSError, OverflowError, ValueError):  # no pidfds, or no such pid
            self._pidfd = None
        # Closed with the watch if nobody closes it (a handle dropped without close()), once either way.
        self._release = weakref.finalize(self, os.close, self._pidfd) if self._pidfd is not None else None
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

    def wait_gone(self, stop_fd: int, poll_interval: float = 0.5) -> bool:
        """Blocks until the watched process exits (True) or ``stop_fd`` turns readable (False).

        Sleeps in ``select`` on the pidfd, so a watcher thread costs nothing while the process lives
        and wakes the moment it dies; without pidfds it checks the pid every ``poll_interval`` seconds.
        """
        while self.alive():
            pidfd = self._pidfd
            watched = [stop_fd] if pidfd is None else [stop_fd, pidfd]
            readable, _, _ = select.select(watched, [], [], poll_interval if pidfd is None else None)
            if stop_fd in readable:
                return False
        return True

    def close(self) -> None:
        """Releases the pidfd."""
        if self._release is not None:
            self._release()
            self._pidfd = None


def set_parent_death_signal(signum: int) -> None:
    """Asks Linux to send ``signum`` to this process when the thread that started it exits."""
    try:
        pr_set_pdeathsig = 1
        _libc.prctl(pr_set_pdeathsig, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the bounded waits still notice the owner's death
        pass


def ignore_interrupts() -> None:
    """Makes this process ignore Ctrl-C; the trainer, which does not, stops its workers itself.

    The launcher blocks SIGINT while it starts workers (the mask is inherited across fork and exec),
    so a Ctrl-C that arrives before this call is discarded instead of killing a half-started worker.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


#: Seconds on the clock that deadlines use.
monotonic = time.monotonic
