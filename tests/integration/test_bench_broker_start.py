"""The benchmarks' broker start (bench.peer_trimq.start_server): the broker binds its own port.

It used to pick a free port first and hand it to the broker, and bench.takeover once failed with "Address already
in use" when another process took that port in between. Now the broker listens on port 0 and the port is read
back from STORE/broker.addr, so no such window exists.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import peer_trimq
from bench.own_redis import free_port


def _fake_broker(address_file: Path, pid_file: Path, address: str) -> list[str]:
    """A process that writes its pid, then ``address`` to ``address_file`` as a broker does (aside, then renamed),
    and stays up."""
    fake = ("import os, sys, time; path, pid_file, address = sys.argv[1:]\n"
            "open(pid_file, 'w').write(str(os.getpid()))\n"
            "open(path + '.tmp', 'w').write(address + '\\n'); os.replace(path + '.tmp', path)\n"
            "time.sleep(60)")
    return [sys.executable, "-c", fake, str(address_file), str(pid_file), address]


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    peer_trimq.add_args(parser)
    return parser.parse_args([])


def test_auto_port_is_the_one_the_broker_bound(tmp_path: Path) -> None:
    first, second = _args(), _args()
    # a store kept from an earlier run reports a port no broker listens on: it must not be believed
    (tmp_path / "a" / "store").mkdir(parents=True)
    (tmp_path / "a" / "store" / "broker.addr").write_text("127.0.0.1:1\n")
    a = peer_trimq.start_server(str(tmp_path / "a"), first)
    try:
        b = peer_trimq.start_server(str(tmp_path / "b"), second)
        try:
            for args, name in ((first, "a"), (second, "b")):
                reported = (tmp_path / name / "store" / "broker.addr").read_text().strip()
                assert reported == f"{peer_trimq.HOST}:{args.trimq_port}"
                with socket.create_connection((peer_trimq.HOST, args.trimq_port), timeout=5):
                    pass
            assert first.trimq_port != second.trimq_port
            assert first.trimq_port_fixed == 0  # the next run picks a fresh port again
        finally:
            b.stop()
    finally:
        a.stop()


def test_a_port_taken_before_the_broker_binds_cannot_stop_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race itself: whatever port the command line names is taken by another socket just before the broker
    process starts. With a port picked ahead this failed; with port 0 there is nothing to take."""
    taken: list[socket.socket] = []
    popen = subprocess.Popen

    def take_port_then_start(cmd: list[str], *args: Any, **kwargs: Any) -> Any:
        if "--listen" in cmd:
            port = int(cmd[cmd.index("--listen") + 1].rpartition(":")[2])
            if port:
                squatter = socket.socket()
                squatter.bind((peer_trimq.HOST, port))
                squatter.listen()
                taken.append(squatter)
        return popen(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", take_port_then_start)
    args = _args()
    srv = peer_trimq.start_server(str(tmp_path), args)
    try:
        assert not taken
        with socket.create_connection((peer_trimq.HOST, args.trimq_port), timeout=5):
            pass
    finally:
        srv.stop()
        for squatter in taken:
            squatter.close()


def test_listened_port_is_0_when_the_broker_exits_or_never_writes(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert peer_trimq.listened_port(str(tmp_path / "broker.addr"), gone, 30) == 0  # at once, not after 30 s
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert peer_trimq.listened_port(str(tmp_path / "broker.addr"), silent, 0.1) == 0
    finally:
        silent.kill()
        silent.wait()


def test_a_recorder_asked_for_wraps_the_broker_and_writes_on_stop(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    steps = tmp_path / "steps"
    monkeypatch.setenv("TRIMQ_BENCH_STEPS", str(steps))
    srv = peer_trimq.start_server(str(tmp_path / "broker"), _args())
    srv.stop()  # SIGTERM: the broker stops gracefully and the wrapper writes what it counted
    (saved,) = steps.glob("broker-*.json")
    assert any("serve" in task for task in json.loads(saved.read_text())["tasks"])


def test_the_gc_recorder_wraps_the_broker_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gc_dir = tmp_path / "gc"
    monkeypatch.setenv("TRIMQ_BENCH_GC", str(gc_dir))
    srv = peer_trimq.start_server(str(tmp_path / "broker"), _args())
    srv.stop()
    (saved,) = gc_dir.glob("broker-*.json")
    assert isinstance(json.loads(saved.read_text()), dict)


def test_an_unknown_instrument_is_a_clear_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.instrumented_broker", "flamegraph", "out", "--listen",
                           "127.0.0.1:0"], capture_output=True, text=True, cwd=str(peer_trimq._REPO), timeout=60)
    assert proc.returncode == 1
    assert "unknown instrument 'flamegraph': one of sample, profile, taskstats, gcstats" in proc.stderr


@pytest.mark.parametrize("instrument", ["profile", "sample"])
def test_an_instrumented_broker_with_a_bad_flag_says_so_and_still_writes(tmp_path: Path, instrument: str) -> None:
    """The CLI's own message and exit code, as ``trimq-broker`` gives them, and the instrument's file is written
    although the broker never served."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.instrumented_broker", instrument, str(out), "--flush", "nope"],
                          capture_output=True, text=True, cwd=str(peer_trimq._REPO), timeout=60)
    assert proc.returncode == 2
    assert "Usage: trimq-broker" in proc.stderr
    assert "Error: Invalid value for '--flush': 'nope' is not one of 'async', 'sync'." in proc.stderr
    assert "Traceback" not in proc.stderr
    assert out.stat().st_size > 0


def test_a_sampled_broker_writes_its_samples_on_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMQ_BENCH_SAMPLE", str(tmp_path))
    monkeypatch.setenv("TRIMQ_BENCH_SAMPLE_INTERVAL_MS", "0.25")
    srv = peer_trimq.start_server(str(tmp_path / "broker"), _args())
    srv.stop()
    assert (tmp_path / "broker.txt").read_text().strip()


def test_a_profiled_broker_dumps_its_profile_on_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pstats

    monkeypatch.setenv("TRIMQ_BENCH_PROFILE", str(tmp_path))
    srv = peer_trimq.start_server(str(tmp_path / "broker"), _args())
    srv.stop()
    stats = pstats.Stats(str(tmp_path / "broker.prof"))
    assert any(func[2] == "main" for func in stats.stats)  # type: ignore[attr-defined]


def test_a_broker_that_does_not_start_is_a_clear_error(tmp_path: Path) -> None:
    """launch_broker: a process that exits before it listens fails at once, naming its log (not after 30 s)."""
    log = str(tmp_path / "broker.log")
    cmd = [sys.executable, "-c", "import sys; print('bad flag: --flush nope'); sys.exit(2)"]
    with pytest.raises(RuntimeError, match=rf"trimq-broker did not start \(see {log}\)"):
        peer_trimq.launch_broker(cmd, peer_trimq.broker_env(), log, str(tmp_path / "broker.addr"))
    assert "bad flag" in Path(log).read_text()


def test_a_fixed_port_is_read_back_and_a_taken_one_fails_at_once(tmp_path: Path) -> None:
    """``--trimq-port N``: the broker's own broker.addr says it listens on N. When N is taken the broker exits, and
    the start fails then, naming the log, instead of waiting 30 s on a port nobody of ours will open."""
    free = free_port(peer_trimq.HOST)
    args = _args()
    args.trimq_port = free
    srv = peer_trimq.start_server(str(tmp_path / "free"), args)
    try:
        assert args.trimq_port == args.trimq_port_fixed == free
        with socket.create_connection((peer_trimq.HOST, free), timeout=5):
            pass
    finally:
        srv.stop()

    with socket.socket() as squatter:
        squatter.bind((peer_trimq.HOST, 0))
        squatter.listen()
        taken = _args()
        taken.trimq_port = squatter.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=r"trimq-broker did not start \(see .*server\.log\)"):
            peer_trimq.start_server(str(tmp_path / "taken"), taken)
        assert time.monotonic() - began < 20  # the broker's exit ended the wait, not the 30 s timeout
    assert "in use" in (tmp_path / "taken" / "server.log").read_text().lower()


def test_a_broker_on_another_port_than_the_fixed_one_is_stopped(tmp_path: Path) -> None:
    """launch_broker with a fixed port: an address file naming another port (not the broker asked for) is an error,
    and the process is stopped, not left running."""
    address_file, pid_file = tmp_path / "broker.addr", tmp_path / "pid"
    cmd = _fake_broker(address_file, pid_file, "127.0.0.1:1")
    with pytest.raises(RuntimeError, match="trimq-broker did not start"):
        peer_trimq.launch_broker(cmd, peer_trimq.broker_env(), str(tmp_path / "broker.log"), str(address_file),
                                 port=free_port(peer_trimq.HOST))
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # stopped and reaped


def test_a_broker_on_its_own_port_listens_there(tmp_path: Path) -> None:
    """start_broker_on_own_port (bench.key_scope, bench.sdk_loops): a real broker, its store and broker.log under
    the work directory, listening on the port it bound and reported."""
    srv, port = peer_trimq.start_broker_on_own_port(str(tmp_path), peer_trimq.broker_env())
    try:
        with socket.create_connection((peer_trimq.HOST, port), timeout=5):
            pass
        assert (tmp_path / "store" / "broker.addr").read_text().strip().endswith(f":{port}")
        assert (tmp_path / "broker.log").exists()
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def test_an_address_file_without_a_port_is_an_error_and_the_process_is_stopped(tmp_path: Path) -> None:
    """listened_port gives 0 for a broker.addr that does not end in a port number (it raised ValueError, and
    launch_broker then left the process running); launch_broker stops the process and raises RuntimeError."""
    address_file, pid_file = tmp_path / "broker.addr", tmp_path / "pid"
    cmd = _fake_broker(address_file, pid_file, "not an address")
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="trimq-broker did not start"):
        peer_trimq.launch_broker(cmd, peer_trimq.broker_env(), str(tmp_path / "broker.log"), str(address_file))
    assert time.monotonic() - began < 20  # the file was read and refused: no wait for the 30 s
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # stopped and reaped


def test_a_storage_bench_broker_that_cannot_start_says_why_and_leaves_nothing_open(tmp_path: Path) -> None:
    """bench.storage_bench's BrokerProc: a broker that exits before it listens (a bad flag here) is an error at once,
    quoting the broker's own words, with its log file closed (its error path ends the process and closes the log)."""
    from bench.storage_bench import BrokerProc
    from trimq.testing.processes import DaemonNotReadyError

    store = tmp_path / "store"
    with pytest.raises(DaemonNotReadyError, match=r"exited with 2 before it could listen") as raised:
        BrokerProc(store, "bogus")
    assert "Invalid value for '--flush'" in str(raised.value)
    log = tmp_path / "store.log"  # (raised keeps the failed constructor's frame, and with it any file left open)
    open_files = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")}
    assert str(log) not in open_files
