"""bench.own_redis: a benchmark's Redis is started on a free port and proved to be the server answering there.

The stand-in for redis-server is a small process that answers ``INFO server`` with its own pid, as Redis does, and
exits when its port is taken (Redis's behaviour on a failed bind); the squatter answers as another Redis.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from bench.own_redis import (
    HOST,
    free_port,
    redis_pid,
    start_harness_redis,
    start_own_redis,
    stop_redis_process,
    wait_own_redis,
)

FAKE_REDIS = r"""
import os, socket, sys
srv = socket.socket()
try:
    srv.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
srv.listen()
info = b"# Server\r\nredis_version:0\r\nprocess_id:%d\r\n" % os.getpid()
while True:
    conn, _ = srv.accept()
    with conn:
        conn.recv(4096)
        conn.sendall(b"$%d\r\n%s\r\n" % (len(info), info))
"""


def _serve(listener: socket.socket, reply: bytes) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(4096)
            conn.sendall(reply)


@pytest.fixture
def squatter() -> Iterator[socket.socket]:
    """A listener on a port of its own; :func:`_listen_as` makes it answer (as another Redis, or not Redis)."""
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen()
    yield listener
    listener.close()


def _redis_reply(pid: int) -> bytes:
    info = b"# Server\r\nprocess_id:%d\r\nrun_id:x\r\n" % pid
    return b"$%d\r\n%s\r\n" % (len(info), info)


def _start_fake(port: int) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", FAKE_REDIS, str(port)])
    return proc, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)


def _listen_as(listener: socket.socket, reply: bytes) -> int:
    threading.Thread(target=_serve, args=(listener, reply), daemon=True).start()
    return int(listener.getsockname()[1])


def test_redis_pid_reads_info_server(squatter: socket.socket) -> None:
    port = _listen_as(squatter, _redis_reply(4242))
    assert redis_pid(HOST, port) == 4242


def test_redis_pid_is_none_for_another_protocol_or_nothing(squatter: socket.socket) -> None:
    port = _listen_as(squatter, b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert redis_pid(HOST, port) is None
    assert redis_pid(HOST, free_port()) is None


@pytest.mark.parametrize("reply", [b"$40\r\nprocess_id:7\r\n", b"$x\r\n", b"$", b"+OK\r\n",
                                   b"$15\r\nprocess_id:x7\r\n\r\n"],
                         ids=["truncated bulk", "bad size", "no line end", "not a bulk string", "pid not a number"])
def test_redis_pid_is_none_for_a_malformed_reply(squatter: socket.socket, reply: bytes) -> None:
    port = _listen_as(squatter, reply)
    assert redis_pid(HOST, port) is None


def test_a_squatted_port_is_left_for_a_free_one(squatter: socket.socket) -> None:
    """The race the plain connect check lost: the picked port was taken before Redis bound it; another Redis
    answers there. The start moves to the next port and returns the server it started."""
    taken = _listen_as(squatter, _redis_reply(1))
    ports = iter([taken, free_port()])
    proc, port = start_own_redis(_start_fake, _stop, pick_port=lambda: next(ports), timeout=20)
    try:
        assert port != taken
        assert redis_pid(HOST, port) == proc.pid
    finally:
        _stop(proc)


def test_a_squatter_that_is_not_redis_is_left_too(squatter: socket.socket) -> None:
    taken = _listen_as(squatter, b"-ERR not redis\r\n")
    ports = iter([taken, free_port()])
    proc, port = start_own_redis(_start_fake, _stop, pick_port=lambda: next(ports), timeout=20)
    try:
        assert port != taken and redis_pid(HOST, port) == proc.pid
    finally:
        _stop(proc)


def test_every_port_taken_is_a_clear_error(squatter: socket.socket) -> None:
    taken = _listen_as(squatter, _redis_reply(1))
    with pytest.raises(RuntimeError, match=rf"no Redis of our own after 2 ports: {taken} \(.*\), {taken} \(.*\)"):
        start_own_redis(_start_fake, _stop, attempts=2, pick_port=lambda: taken, timeout=20)


def test_a_launcher_that_gives_up_counts_as_a_failed_attempt() -> None:
    calls: list[int] = []

    def start(port: int) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        calls.append(port)
        if len(calls) == 1:
            raise RuntimeError("redis did not start")
        return _start_fake(port)

    proc, port = start_own_redis(start, _stop, timeout=20)
    try:
        assert len(calls) == 2 and port == calls[1]
        assert wait_own_redis(HOST, port, proc, 5)
    finally:
        _stop(proc)


def test_a_server_still_running_beside_another_redis_is_stopped(squatter: socket.socket) -> None:
    """Our process is alive but another Redis answers on the port: ours is stopped and the port left."""
    taken = _listen_as(squatter, _redis_reply(1))
    stopped: list[subprocess.Popen[bytes]] = []

    def start_idle(port: int) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return proc, proc

    def stop(proc: subprocess.Popen[bytes]) -> None:
        stopped.append(proc)
        _stop(proc)

    with pytest.raises(RuntimeError, match=rf"{taken} \(another process answers there\)"):
        start_own_redis(start_idle, stop, attempts=1, pick_port=lambda: taken, timeout=20)
    assert len(stopped) == 1 and stopped[0].returncode is not None


class _HarnessServer:
    """What the harness's Server offers start_harness_redis: the process and stop()."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE_REDIS, str(port)])

    def stop(self) -> None:
        _stop(self.proc)


def _peer_redis() -> Any:
    """A stand-in for the harness's peer_redis module: start_server listens on the module's PORT."""
    mod = SimpleNamespace(PORT=6379, started=[])

    def start_server(server_dir: str, args: Any) -> _HarnessServer:
        mod.started.append(mod.PORT)
        return _HarnessServer(mod.PORT)

    mod.start_server = start_server
    return mod


def test_harness_redis_on_a_free_port_is_told_to_the_caller() -> None:
    mod = _peer_redis()
    heard: list[int] = []
    srv, port = start_harness_redis(mod, "unused", None, on_port=heard.append)
    try:
        assert mod.PORT == port == heard[-1] == mod.started[-1] != 6379
        assert redis_pid(HOST, port) == srv.proc.pid
    finally:
        srv.stop()


def test_harness_redis_on_a_taken_fixed_port_is_one_clear_failure(squatter: socket.socket) -> None:
    """``--redis-port N`` with N served by another Redis: one attempt, no wandering to other ports."""
    taken = _listen_as(squatter, _redis_reply(1))
    mod = _peer_redis()
    with pytest.raises(RuntimeError, match=rf"after 1 ports: {taken} \("):
        start_harness_redis(mod, "unused", None, port=taken)
    assert mod.started == [taken]


IGNORES_SIGTERM = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_server_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    """A hung redis-server must not outlive the benchmark (nor hang it): SIGKILL once SIGTERM has had its time."""
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # the handler is in place
    stop_redis_process(proc, timeout=0.2)
    assert proc.returncode == -9
    proc.stdout.close()


def test_a_server_that_exits_on_sigterm_is_not_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop_redis_process(proc, timeout=10)
    assert proc.returncode == -15
