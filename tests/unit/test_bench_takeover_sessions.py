"""bench.takeover keeps its clients out of its launcher's job (and ends them when it is stopped:
bench/stop_signals.py, tests/unit/test_bench_stop_signals.py).

The sigstop scenario stops a consumer for 10 s; in the job of a shell that exits meanwhile (``make bench &``), the
kernel would hang that consumer up on its SIGCONT (tests/chaos/test_scenario_hang_up.py shows the mechanism with
the chaos harness, which lost consumer c1.0 of seed 42 so).
"""

from __future__ import annotations

import os
from pathlib import Path

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

