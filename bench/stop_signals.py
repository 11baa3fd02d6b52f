"""A harness that starts child processes in sessions of their own ends them itself, also when it is stopped.

The chaos harness (tests/chaos/scenario.py) and ``bench.takeover`` SIGSTOP consumers. A stopped process in the job
of a shell that exits is hung up by the kernel (an orphaned process group holding a stopped process gets SIGHUP
and SIGCONT, POSIX: chaos seed 42 lost a consumer so), so both start their children with ``start_new_session``.
Then no terminal hang-up or ``kill`` of the job reaches the children, and the harness, which would die of the
signal, turns it into an exception instead, so that its ``finally`` ends them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: What ends a harness from outside: its terminal closing, or a ``kill``.
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


@contextmanager
def raise_on_stop_signals(error: Callable[[str], BaseException]) -> Iterator[None]:
    """Within the block, a SIGHUP or SIGTERM to this process raises ``error(text)``, the text naming the signal;
    the previous handlers come back after it. Only the main thread can set handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise error(f"{signal.Signals(signum).name}: the harness was told to stop, or its terminal closed")

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
