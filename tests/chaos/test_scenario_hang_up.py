"""A chaos run outlives the shell that launched it (tests/chaos/scenario.py: ``_Proc``).

On 2026-12-07 long ASYNC seed 42, started in the background of a shell that exited while the harness had consumer
c1.0 stopped (a pause), lost c1.0: the exit orphaned the job's process group, and the kernel sends SIGHUP and SIGCONT
to an orphaned group that holds a stopped process (POSIX), which killed it. The harness now starts every cluster
process in a session of its own, out of the launcher's job, so no shell's exit reaches it; and it ends them itself
when it is hung up or told to stop (bench/stop_signals.py, tests/unit/test_bench_stop_signals.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The harness's side: one cluster process started as the harness starts them, stopped as a pause stops it.
LAUNCHER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from tests.chaos.scenario import _Proc
    work = Path(sys.argv[1])
    victim = _Proc("victim", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), work)
    victim.signal(signal.SIGSTOP)
    (work / "pids").write_text(f"{os.getpid()} {victim.popen.pid}")
    time.sleep(30)
""")

# The shell's side: put the launcher in a job (a process group) of its own, as `cmd &` does, and exit while it runs.
SHELL = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], process_group=0, cwd=sys.argv[3])
    pids = Path(sys.argv[2]) / "pids"
    deadline = time.monotonic() + 30
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
""")


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (T: stopped, Z: dead, not yet reaped), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_a_paused_cluster_process_survives_the_exit_of_the_launching_shell(tmp_path: Path) -> None:
    # The "shell" leads a session of its own (as a login shell does), so its exit orphans the launcher's group.
    shell = subprocess.run([sys.executable, "-c", SHELL, LAUNCHER, str(tmp_path), str(REPO)], cwd=REPO,
                           start_new_session=True, timeout=60)
    assert shell.returncode == 0
    launcher_pid, victim_pid = map(int, (tmp_path / "pids").read_text().split())
    try:
        deadline = time.monotonic() + 2.0  # the signals are sent as the shell exits; give the victim time to die
        while time.monotonic() < deadline and _state(victim_pid) == "T":
            time.sleep(0.05)
        assert _state(victim_pid) == "T", "the stopped cluster process was hung up by the launching shell's exit"
    finally:
        for pid in (victim_pid, launcher_pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

