"""Shared fixtures for integration tests: in-process brokers and name servers, a client, and daemons run
as subprocesses through the real CLIs.

* ``broker_factory``: ``async with broker_factory(**settings) as broker`` runs a real broker on
  127.0.0.1:0 in its own directory under ``tmp_path`` with small segments (64 KiB commit-log segments,
  64-unit consume-queue files); pass ``store_dir=`` to reopen a store, any BrokerConfig field to override.
* ``namesrv_factory``: ``async with namesrv_factory() as ns`` runs a standalone name server (``ns.address``).
* ``rclient``: a ``runtime.client.RemotingClient`` open for the test.
* ``daemons``: ``await daemons.broker(store, "--flush", "sync", env={...})`` and ``await daemons.namesrv()``
  start ``trimq-broker`` / ``trimq-namesrv`` from ``.venv/bin`` and wait until they serve (the broker's
  ``STORE/broker.addr``, the name server's "namesrv.started" log line). Every process still running at the
  end of the test is killed; ``proc.kill()``, ``proc.terminate()`` and ``proc.wait()`` do what they say.
* ``call`` (plain function, also a fixture): ``await call(rc, addr, code, ext, body)`` -> response.

Small-geometry settings live in ``SMALL_STORE`` so subprocess brokers can use them as ``TRIMQ_*`` variables
(``small_store_env()``).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from trimq.broker.broker import Broker, open_broker
from trimq.broker.config import BrokerConfig
from trimq.namesrv.config import NamesrvConfig
from trimq.namesrv.service import NameServer, open_namesrv
from trimq.protocol.command import RemotingCommand
from trimq.runtime.client import RemotingClient
from trimq.testing.processes import fresh_address_file, listened_address, logged_event

BIN = Path(sys.executable).parent
SMALL_STORE: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 64 * 20,
    "max_hash_slot_num": 1024,  # index files of 84 KiB instead of 420 MB (sparse, but mapped)
    "max_index_num": 2048,
}


def small_store_env(**extra: Any) -> dict[str, str]:
    """``os.environ`` plus TRIMQ_BROKER_* variables for the small store geometry (and ``extra`` settings)."""
    env = dict(os.environ)
    for k, v in {**SMALL_STORE, **extra}.items():
        env["TRIMQ_BROKER_" + k.upper()] = str(v).lower() if isinstance(v, bool) else str(v)
    return env


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None,
               timeout_s: float = 10.0) -> RemotingCommand:
    """One request through the real client transport."""
    return await rc.invoke(addr, RemotingCommand.request(code, ext or {}, body), timeout_s=timeout_s)


@pytest.fixture(name="call")
def call_fixture() -> Callable[..., Any]:
    return call


@pytest.fixture
def broker_factory(tmp_path: Path) -> Callable[..., Any]:
    counter = itertools.count()

    @asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[Broker]:
        values: dict[str, Any] = {"listen": "127.0.0.1:0", "store_dir": str(tmp_path / f"store{next(counter)}"),
                                  **SMALL_STORE}
        values.update(settings)
        async with open_broker(BrokerConfig(**values)) as broker:
            yield broker

    return factory


@pytest.fixture
def namesrv_factory() -> Callable[..., Any]:
    @asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[NameServer]:
        async with open_namesrv(config=NamesrvConfig(**{"listen": "127.0.0.1:0", **settings})) as ns:
            yield ns

    return factory


@pytest.fixture
async def rclient() -> AsyncIterator[RemotingClient]:
    async with RemotingClient(default_timeout_s=10) as rc:
        yield rc


@dataclass
class Daemon:
    """A daemon started by ``daemons``: the process, the address it serves, its log file."""

    proc: subprocess.Popen[bytes]
    address: str
    log: Path

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM (graceful stop); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class Daemons:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Daemon] = []
        self._n = itertools.count()

    def _spawn(self, argv: list[str], env: dict[str, str] | None) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp_path / f"daemon{next(self._n)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env or dict(os.environ), cwd=self.tmp_path)
        return proc, log

    async def broker(self, store: Path, *args: str, env: dict[str, str] | None = None,
                     timeout_s: float = 20) -> Daemon:
        """Run ``trimq-broker --listen 127.0.0.1:0 --store STORE ARGS`` and wait for STORE/broker.addr."""
        addr_file = fresh_address_file(store)
        argv = [str(BIN / "trimq-broker"), "--listen", "127.0.0.1:0", "--store", str(store), "--log-format",
                "json", *args]
        proc, log = self._spawn(argv, env if env is not None else small_store_env())
        try:
            address = await trio.to_thread.run_sync(lambda: listened_address(addr_file, proc, timeout_s, log=log))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        d = Daemon(proc, address, log)
        self.started.append(d)
        return d

    async def namesrv(self, *args: str, env: dict[str, str] | None = None, timeout_s: float = 20) -> Daemon:
        """Run ``trimq-namesrv --listen 127.0.0.1:0 ARGS`` and wait for its "namesrv.started" log line."""
        argv = [str(BIN / "trimq-namesrv"), "--listen", "127.0.0.1:0", "--log-format", "json", *args]
        proc, log = self._spawn(argv, env)
        try:
            started = await trio.to_thread.run_sync(lambda: logged_event(log, proc, "namesrv.started", timeout_s))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        d = Daemon(proc, str(started["address"]), log)
        self.started.append(d)
        return d

    def cleanup(self) -> None:
        for d in self.started:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait(10)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    ds = Daemons(tmp_path)
    try:
        yield ds
    finally:
        ds.cleanup()
