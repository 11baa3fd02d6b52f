"""bench.takeover keeps its clients out of its launcher's job, and ends them when it is stopped.

The sigstop scenario stops a consumer for 10 s; in the job of a shell that exits meanwhile (``make bench &``), the
kernel would hang that consumer up on its SIGCONT (tests/chaos/test_scenario_hang_up.py shows the mechanism with
the chaos harness, which lost consumer c1.0 of seed 42 so).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from bench import takeover


def test_spawned_clients_lead_sessions_of_their_own(tmp_path: Path) -> None:
    args = takeover.build_parser().parse_args(["--trimq-port", "9", "--messages", "10"])
    proc = takeover.spawn(args, "produce", str(tmp_path))
    try:
        assert os.getsid(proc.pid) == proc.pid
        assert os.getpgid(proc.pid) == proc.pid
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_stop_signal_to_the_harness_raises_so_that_its_clients_are_ended(sig: signal.Signals) -> None:
    assert threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM)}
    try:
        takeover._stop_signals_raise()
        with pytest.raises(SystemExit, match=sig.name):
            os.kill(os.getpid(), sig)
            threading.Event().wait(1)  # the handler runs at the next bytecode boundary
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
