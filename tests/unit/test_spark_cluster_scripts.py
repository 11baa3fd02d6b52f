"""deploy/spark/start-local-cluster.sh and stop-local-cluster.sh against a stand-in ``spark-class``: the
paths the real cluster test (tests/spark/test_spark_cluster.py) cannot reach, because a real master always
prints its start line and a real worker registers. The stand-in is Spark's, not ours: a shell script that
prints the lines the start script waits for (or not) and then sleeps like a daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
START = REPO / "deploy" / "spark" / "start-local-cluster.sh"
STOP = REPO / "deploy" / "spark" / "stop-local-cluster.sh"

# FAKE_MODE: "ok" (both daemons come up), "no-start-line" (the master never says where it listens),
# "worker-dies" (the worker exits before registering), "silent-master" (the master runs but never becomes leader),
# "ignores-term" (both come up and ignore SIGTERM, as a hung JVM would).
SPARK_CLASS = """#!/bin/sh
echo $$ >>"$FAKE_HOME/daemons"  # exec keeps the pid: this is the daemon the start script recorded
[ "$FAKE_MODE" = ignores-term ] && trap '' TERM  # an ignored signal stays ignored across exec
case "$1" in
  *.Master)
    [ "$FAKE_MODE" = silent-master ] && exec sleep 120
    [ "$FAKE_MODE" = no-start-line ] || echo "INFO Master: Starting Spark master at spark://127.0.0.1:$FAKE_PORT"
    echo "INFO Master: I have been elected leader! New state: ALIVE" ;;
  *.Worker)
    echo "$@" >"$FAKE_HOME/worker.args"
    [ "$FAKE_MODE" = worker-dies ] && exit 3  # before registering
    echo "INFO Worker: Successfully registered with master spark://127.0.0.1:$FAKE_PORT" ;;
esac
exec sleep 120
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent, the start script, has exited).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _daemons(env: dict[str, str]) -> list[int]:
    path = Path(env["FAKE_HOME"]) / "daemons"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture
def fake_spark(tmp_path: Path) -> Iterator[dict[str, str]]:
    home = tmp_path / "spark-home"
    (home / "bin").mkdir(parents=True)
    spark_class = home / "bin" / "spark-class"
    spark_class.write_text(SPARK_CLASS)
    spark_class.chmod(0o755)
    python = tmp_path / "python"  # answers the script's `python -c 'import pyspark ...'` with the fake home
    python.write_text(f'#!/bin/sh\necho "{home}"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_CONF_DIR", "SPARK_MASTER_PORT")}
    env.update({"PYTHON": str(python), "STATE_DIR": str(tmp_path / "state"), "FAKE_HOME": str(home),
                "FAKE_PORT": "43210", "FAKE_MODE": "ok"})
    yield env
    for pid in _daemons(env):  # a failed test must not leave its stand-in daemons sleeping
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)


def _pids(env: dict[str, str]) -> dict[str, int]:
    state = Path(env["STATE_DIR"])
    return {name: int((state / f"{name}.pid").read_text()) for name in ("master", "worker")
            if (state / f"{name}.pid").exists()}


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_the_master_url_is_the_port_the_master_printed(fake_spark: dict[str, str]) -> None:
    fake_spark["SPARK_MASTER_PORT"] = "0"
    out = _run(START, fake_spark)
    pids = _pids(fake_spark)
    try:
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "spark://127.0.0.1:43210"
        worker_args = (Path(fake_spark["FAKE_HOME"]) / "worker.args").read_text().split()
        assert worker_args[-1] == "spark://127.0.0.1:43210"  # the worker joins the bound port, not 0
        assert all(_alive(pid) for pid in pids.values()), pids
    finally:
        stop = _run(STOP, fake_spark)
    assert stop.returncode == 0, stop.stderr
    assert all(_wait_gone(pid) for pid in pids.values())
    assert _pids(fake_spark) == {}


def test_a_master_without_its_start_line_is_a_clear_error_and_is_stopped(fake_spark: dict[str, str]) -> None:
    fake_spark["FAKE_MODE"] = "no-start-line"
    out = _run(START, fake_spark)
    assert out.returncode == 1
    assert "no 'Starting Spark master at' line in" in out.stderr
    assert "start-local-cluster: failed; stopping what started" in out.stderr
    assert out.stdout == ""
    assert _pids(fake_spark) == {}  # the stop script ran and removed the pid files
    assert not (Path(fake_spark["FAKE_HOME"]) / "worker.args").exists()  # no worker was started
    assert len(_daemons(fake_spark)) == 1 and all(_wait_gone(pid) for pid in _daemons(fake_spark))


def test_a_worker_that_exits_is_named_and_the_master_is_stopped(fake_spark: dict[str, str]) -> None:
    fake_spark["FAKE_MODE"] = "worker-dies"
    out = _run(START, fake_spark)
    assert out.returncode == 1
    assert "exited; see" in out.stderr and "worker.log" in out.stderr
    assert out.stdout == ""
    assert _pids(fake_spark) == {}
    master, worker = _daemons(fake_spark)
    assert _wait_gone(master) and _wait_gone(worker)


def test_a_running_master_is_not_started_twice(fake_spark: dict[str, str]) -> None:
    first = _run(START, fake_spark)
    pids = _pids(fake_spark)
    try:
        assert first.returncode == 0, first.stderr
        second = _run(START, fake_spark)
        assert second.returncode == 1
        assert f"a master is already running (pid {pids['master']})" in second.stderr
        assert _pids(fake_spark) == pids  # the running cluster's pid files are untouched
    finally:
        _run(STOP, fake_spark)
    assert all(_wait_gone(pid) for pid in pids.values())


def test_a_master_that_never_comes_up_times_out_and_is_stopped(fake_spark: dict[str, str]) -> None:
    fake_spark.update({"FAKE_MODE": "silent-master", "START_TIMEOUT_S": "01"})  # read as 1, not octal
    out = _run(START, fake_spark)
    assert out.returncode == 1
    assert "timed out after 1 s waiting for 'I have been elected leader' in" in out.stderr  # the setting's 1 s
    assert _pids(fake_spark) == {}
    assert len(_daemons(fake_spark)) == 1 and all(_wait_gone(pid) for pid in _daemons(fake_spark))


@pytest.mark.parametrize("value", ["0", "00", "1.5", "ten", "-3", "2s"])
def test_a_bad_start_timeout_is_refused_before_anything_starts(fake_spark: dict[str, str], value: str) -> None:
    fake_spark["START_TIMEOUT_S"] = value
    out = _run(START, fake_spark)
    assert out.returncode == 2
    assert f"START_TIMEOUT_S must be a whole number of seconds > 0, got '{value}'" in out.stderr
    assert _daemons(fake_spark) == []


def test_daemons_that_ignore_sigterm_are_killed_by_the_stop_script(fake_spark: dict[str, str]) -> None:
    """stop-local-cluster.sh: whatever is still there 10 s after SIGTERM gets SIGKILL (docs/AUDIT.md)."""
    fake_spark["FAKE_MODE"] = "ignores-term"
    started = _run(START, fake_spark)
    pids = _pids(fake_spark)
    assert started.returncode == 0, started.stderr
    stop = _run(STOP, fake_spark)
    assert stop.returncode == 0, stop.stderr
    assert all(_wait_gone(pid) for pid in pids.values())
    assert _pids(fake_spark) == {}
