"""``deploy/local-cluster.sh``: ``up`` starts a name server, two brokers and N consumers on loopback and records
their PIDs; ``status`` reports them; ``down`` stops exactly those processes, in bounded time.

The script runs as a user runs it (bash, the repository's .venv tools), with its state directory under
``tmp_path``. Whatever happens, the test ends by killing any recorded process still alive (only those).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local-cluster.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not Path("/proc/self/stat").exists(),
                                reason="needs bash and /proc")


def run(state: Path, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    env.update(TRIMQ_CLUSTER_DIR=str(state), TRIMQ_BIN=str(Path(sys.executable).parent),
               TRIMQ_CLUSTER_STOP_TIMEOUT="20", **extra)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


def recorded(state: Path) -> list[tuple[str, int, str]]:
    lines = (state / "pids").read_text().split("\n")
    return [(name, int(pid), started) for name, pid, started in (ln.split() for ln in lines if ln.strip())]


def is_running(pid: int, started: str) -> bool:
    """True while ``pid`` is still the recorded process and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(") ", 1)[1].split()
    return fields[0] != "Z" and fields[19] == started


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "cluster"
    seen: list[tuple[str, int, str]] = []
    try:
        yield state
    finally:
        if (state / "pids").exists():
            seen = recorded(state)
        for _, pid, started in seen:
            if is_running(pid, started):
                os.kill(pid, signal.SIGKILL)


def metrics_port(state: Path, name: str) -> int:
    for line in (state / "addresses").read_text().splitlines():
        if line.startswith(name + " "):
            return int(line.split("metrics=127.0.0.1:")[1].split()[0])
    raise AssertionError(f"no {name} in addresses")


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {s.name + str(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_up_status_down_leaves_no_process_it_started(state: Path) -> None:
    up = run(state, "up", "2")
    assert up.returncode == 0, up.stdout + up.stderr
    procs = recorded(state)
    assert [p[0] for p in procs] == ["namesrv", "broker-a", "broker-b", "consumer-1", "consumer-2"]
    assert all(is_running(pid, started) for _, pid, started in procs), up.stdout + up.stderr

    status = run(state, "status")
    assert status.returncode == 0, status.stdout
    assert status.stdout.count(" running ") == 5
    assert "5 of 5 running" in status.stdout

    # Both brokers registered with the name server (bounded wait: registration follows the broker's start).
    port = metrics_port(state, "namesrv")
    deadline = time.monotonic() + 20
    while scrape(port).get("trimq_namesrv_brokers[('cluster', 'DefaultCluster')]") != 2:
        assert time.monotonic() < deadline, "the brokers did not register with the name server"
        time.sleep(0.1)

    # --log-format json: every line a JSON object with the stable fields, the daemons' start events present.
    events: dict[str, set[str]] = {}
    for name in ("namesrv", "broker-a", "broker-b", "consumer-1"):
        for line in (state / "logs" / f"{name}.log").read_text().splitlines():
            record = json.loads(line)
            assert {"event", "level", "timestamp", "component"} <= set(record), record
            events.setdefault(name, set()).add(record["event"])
    assert {"namesrv.started", "metrics.started"} <= events["namesrv"]
    assert {"store.recovered", "broker.started", "metrics.started"} <= events["broker-a"]
    assert "consumer.cli_started" in events["consumer-1"] or "push_consumer.started" in events["consumer-1"]

    again = run(state, "up")
    assert again.returncode == 1 and "already up" in again.stderr
    assert all(is_running(pid, started) for _, pid, started in procs)  # a refused `up` touches nothing

    t0 = time.monotonic()
    down = run(state, "down", timeout=90)
    assert down.returncode == 0, down.stdout + down.stderr
    assert time.monotonic() - t0 < 60
    assert not any(is_running(pid, started) for _, pid, started in procs), down.stdout
    assert down.stdout.count("stopped ") == 5
    assert "SIGKILL" not in down.stdout  # every daemon stopped gracefully on SIGTERM
    assert not (state / "pids").exists()
    # Graceful stops: the brokers flushed and wrote their checkpoint.
    for b in ("broker-a", "broker-b"):
        assert '"broker.stopped"' in (state / "logs" / f"{b}.log").read_text()

    status = run(state, "status")
    assert status.returncode == 3 and "not up" in status.stdout
    assert run(state, "down").returncode == 0  # nothing to stop is fine


def test_a_failed_start_stops_what_it_started(state: Path) -> None:
    """A broker that refuses its configuration: `up` fails and stops the name server it already started."""
    up = run(state, "up", "1", TRIMQ_BROKER_FLUSH_INTERVAL_MS="0")  # brokers exit 2; the name server does not read it
    assert up.returncode == 1, up.stdout + up.stderr
    assert "broker-a exited during start-up" in up.stderr
    assert "flush_interval_ms = 0" in (state / "logs" / "broker-a.log").read_text()
    assert "stopped namesrv" in up.stderr
    assert not (state / "pids").exists()


def test_down_leaves_a_reused_pid_alone(state: Path, tmp_path: Path) -> None:
    """A recorded PID whose start time no longer matches is somebody else's process: never signalled."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state.mkdir(parents=True)
        (state / "pids").write_text(f"broker-a {other.pid} 1\n")
        down = run(state, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert other.poll() is None  # still running
    finally:
        other.kill()
        other.wait(10)


def test_bad_usage(state: Path) -> None:
    out = run(state, "sideways")
    assert out.returncode == 2 and "usage" in out.stderr
    out = run(state, "up", "many")
    assert out.returncode == 1 and "number of consumers" in out.stderr
