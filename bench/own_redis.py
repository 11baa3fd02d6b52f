"""A Redis server of the benchmark's own, on a free port, and proof that the port is served by it.

Redis cannot listen on port 0 and report the port it got, so a benchmark picks a free port and starts
``redis-server`` on it. Between the pick and Redis's bind another process may take the port; Redis then
exits, and a plain connect check passes against the squatter (another benchmark's Redis would mix both
runs' streams, anything else fails later with a puzzling error). :func:`start_own_redis` therefore asks
the server on the port for its ``process_id`` (``INFO server``) and tries a new port unless it is the
process it started.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench.stop_signals import end_child

__all__ = ["HOST", "free_port", "redis_pid", "start_harness_redis", "start_own_redis", "stop_redis_process",
           "wait_own_redis"]

HOST = "127.0.0.1"
ATTEMPTS = 5

H = TypeVar("H")


def free_port(host: str = HOST) -> int:
    """A port nothing listens on at this moment (the kernel's pick for a bind to port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def redis_pid(host: str, port: int, timeout: float = 0.5) -> int | None:
    """The process id of the Redis server answering on ``host:port``; None when nothing, or no Redis, answers."""
    try:
        with socket.create_connection((host, port), timeout) as s:
            s.sendall(b"INFO server\r\n")  # an inline command: no client library, any Redis answers it
            buf = b""
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                buf += chunk
            head, _, body = buf.partition(b"\r\n")
            if not head.startswith(b"$"):
                return None
            size = int(head[1:])
            while len(body) < size:
                chunk = s.recv(65536)
                if not chunk:
                    return None
                body += chunk
    except (OSError, ValueError):
        return None
    for line in body[:size].split(b"\r\n"):
        if line.startswith(b"process_id:"):
            pid = line[len(b"process_id:"):]
            return int(pid) if pid.isdigit() else None
    return None


def wait_own_redis(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> bool:
    """Wait until the Redis on ``host:port`` is ``proc``. False when ``proc`` exits (it could not bind), another
    Redis answers there, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        pid = redis_pid(host, port)
        if pid == proc.pid:
            return True
        if pid is not None:
            return False
        time.sleep(0.05)
    return False


def stop_redis_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Stop a ``redis-server`` the benchmark started: SIGTERM (Redis writes its append-only file out and exits),
    SIGKILL if it is still running after ``timeout`` seconds, so that a hung server never outlives the run."""
    end_child(proc, timeout)


def start_own_redis(start: Callable[[int], tuple[H, subprocess.Popen[bytes]]], stop: Callable[[H], None],
                    host: str = HOST, attempts: int = ATTEMPTS, timeout: float = 30.0,
                    pick_port: Callable[[], int] | None = None) -> tuple[H, int]:
    """Start a Redis through ``start(port)`` (returning a handle and the ``redis-server`` process) on free ports
    until the one it serves is its own; returns the handle and the port. A ``start`` that raises RuntimeError
    (a launcher that gave up) counts as a failed attempt. Raises RuntimeError after ``attempts`` failures."""
    pick = pick_port or (lambda: free_port(host))
    tried: list[str] = []
    for _ in range(attempts):
        port = pick()
        try:
            handle, proc = start(port)
        except RuntimeError as exc:
            tried.append(f"{port} ({exc})")
            continue
        if wait_own_redis(host, port, proc, timeout):
            return handle, port
        code = proc.poll()
        if code is None:
            stop(handle)
            tried.append(f"{port} (another process answers there)")
        else:  # reaped already: a stop by pid now could reach a process that took the pid over
            tried.append(f"{port} (redis-server exited with {code})")
    raise RuntimeError(f"no Redis of our own after {attempts} ports: {', '.join(tried)}")


def start_harness_redis(peer_redis: Any, server_dir: str, args: Any, port: int = 0,
                        on_port: Callable[[int], None] | None = None) -> tuple[Any, int]:
    """The harness's Redis (``peer_redis.start_server``, which listens on ``peer_redis.PORT``) proved to be ours:
    on ``port`` (one attempt) or on free ports; ``on_port`` hears each port before its start (to hand it to role
    processes). Returns the harness Server and the port."""

    def start(chosen: int) -> tuple[Any, subprocess.Popen[bytes]]:
        peer_redis.PORT = chosen
        if on_port is not None:
            on_port(chosen)
        srv = peer_redis.start_server(server_dir, args)
        return srv, srv.proc

    if port:
        return start_own_redis(start, lambda srv: srv.stop(), attempts=1, pick_port=lambda: port)
    return start_own_redis(start, lambda srv: srv.stop())
