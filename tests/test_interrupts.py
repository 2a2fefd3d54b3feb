"""Ctrl-C held back for work that must not stop halfway (``shmpool.interrupts``), and the suite's
Ctrl-C tests, which must not depend on how the suite was started."""

from __future__ import annotations

import signal
import subprocess
import sys

import helpers

# In-process (a SIGINT to the test's own thread) and through a script that starts a helper it must
# kill (a writer stopped while it holds the lock): each needs a Python handler for SIGINT.
CTRL_C_TESTS = [
    "tests/test_batches.py::test_ctrl_c_in_recv_loses_no_batch",
    "tests/test_protocol.py::test_ctrl_c_while_waiting_for_the_writer_lock_interrupts_the_wait",
]


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job: inherited across exec


def test_ctrl_c_tests_pass_when_the_suite_starts_with_ctrl_c_ignored() -> None:
    """``pytest &`` starts with SIGINT ignored, which Python and every child inherit: the suite's
    fixture gives each test Python's handler back, whatever ran before, in either order."""
    for order in (CTRL_C_TESTS, CTRL_C_TESTS[::-1]):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *order],  # in this order
            cwd=helpers.ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=_ignore_ctrl_c,
        )
        assert result.returncode == 0, result.stdout[-3000:]
