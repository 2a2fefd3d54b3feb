"""The CPUs shmpool's publication order is safe on, checked at launch and attach.

Every channel publishes by "write the data, then the flag" in separate Python statements. On x86-64
the CPU keeps the order of stores, and of loads, so that is enough (each numpy call is an opaque C
call the compiler cannot reorder across). Weaker CPUs (aarch64: Graviton, Grace, Jetson) would need
real acquire/release instructions, which Python has no cheap way to issue: ``check_memory_model``
refuses them with a clear error rather than let pools be silently wrong there.
"""

from __future__ import annotations

import platform

from ..errors import ShmpoolError

#: CPUs whose memory model keeps the order of plain stores and of plain loads (total store order).
TSO_MACHINES = ("x86_64", "amd64", "i386", "i686")


def check_memory_model(machine: str | None = None) -> None:
    """Raises ``ShmpoolError`` on a CPU whose memory model would let readers see torn data."""
    machine = (machine or platform.machine()).lower()
    if machine not in TSO_MACHINES:
        raise ShmpoolError(
            f"shmpool needs a CPU with total store order (x86-64); this one is {machine!r}, on which "
            f"shared-memory publication without acquire/release instructions is unsafe"
        )
