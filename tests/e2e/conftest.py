"""Processes for end-to-end tests: the real ``trimq-*`` command-line tools from this interpreter's
``bin`` directory, each with its own log file under ``tmp_path``; anything still running at the end of a
test is killed.

* ``procs.broker(*args, env=...)``: ``trimq-broker --embedded-namesrv --listen 127.0.0.1:0 --store DIR``,
  waits for ``DIR/broker.addr`` and returns the :class:`Proc` (``.address``);
* ``procs.start(name, [tool, *args], env=...)``: any tool, not waited for;
* ``procs.run(name, [tool, *args])``: run to completion, returns the CompletedProcess (text output).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trimq.testing.processes import ADDRESS_FILE_NAME, listened_address

BIN = Path(os.path.dirname(sys.executable))


def tool(name: str) -> str:
    """Path of a trimq command-line tool installed beside this interpreter."""
    return str(BIN / name)


def env_with(**settings: Any) -> dict[str, str]:
    """``os.environ`` plus ``TRIMQ_BROKER_<NAME>`` variables for the broker ``settings``."""
    env = dict(os.environ)
    for k, v in settings.items():
        env["TRIMQ_BROKER_" + k.upper()] = str(v).lower() if isinstance(v, bool) else str(v)
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    address: str = ""

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit status."""
        self.signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_log(self, needle: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log_text():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {needle!r} in its log within {timeout} s:\n"
                                   f"{self.log_text()[-3000:]}")
            time.sleep(0.05)


class Procs:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Proc] = []
        self._n = itertools.count()

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.tmp_path / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=out, env=env or dict(os.environ), cwd=self.tmp_path)
        p = Proc(name, popen, log)
        self.started.append(p)
        return p

    def run(self, name: str, argv: list[str], env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=env or dict(os.environ), cwd=self.tmp_path,
                              timeout=timeout)

    def broker(self, *args: str, env: dict[str, str] | None = None, timeout: float = 20) -> Proc:
        store = self.tmp_path / f"store{next(self._n)}"
        p = self.start("broker", [tool("trimq-broker"), "--embedded-namesrv", "--listen", "127.0.0.1:0", "--store",
                                  str(store), "--log-format", "json", "--log-level", "warning", *args], env)
        p.address = listened_address(store / ADDRESS_FILE_NAME, p.popen, timeout, log=p.log_text)
        return p

    def cleanup(self) -> None:
        for p in self.started:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.cleanup()
