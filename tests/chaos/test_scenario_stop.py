"""A chaos run told to stop ends its cluster (tests/chaos/scenario.py: ``run_scenario``).

The cluster's processes lead sessions of their own (``_Proc``, test_scenario_hang_up.py), so neither a ^C nor a
hang-up of the terminal reaches them: the harness must end them itself. A SIGTERM or SIGHUP to it raises
:class:`HarnessStopped` (bench/stop_signals.py), and ``_run_scenario``'s ``finally`` kills the cluster on the way
out. Without that, the name server and brokers would outlive the run, each in a session of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HARNESS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tests.chaos.scenario import SHORT, run_scenario
    run_scenario(1, SHORT, workdir=Path(sys.argv[1]))
""")


def _cluster_pids(workdir: Path) -> list[int]:
    """The live processes working in ``workdir`` (every cluster process runs there; a dead one has no cwd)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(workdir):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stopped_harness_ends_its_cluster(tmp_path: Path, sig: signal.Signals) -> None:
    work = tmp_path / "work"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(work)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        # the name server and both brokers are up: the cluster is running in sessions of its own
        while len(_cluster_pids(work)) < 3:
            assert harness.poll() is None, harness.communicate()[0]
            assert time.monotonic() < deadline, "the cluster did not start within 60 s"
            time.sleep(0.05)
        harness.send_signal(sig)
        output, _ = harness.communicate(timeout=60)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
    assert harness.returncode != 0
    assert f"HarnessStopped: {sig.name}: the harness was told to stop" in output, output
    left = _cluster_pids(work)
    for pid in left:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert left == []
