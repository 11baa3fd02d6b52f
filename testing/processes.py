"""Daemons run as processes (``trimq-broker``, ``trimq-namesrv``, started by a test, a benchmark or a supervisor):
the file where a broker says which address it listens on, a name server's log line saying the same, and waiting
for them.

A broker writes ``HOST:PORT`` to ``STORE/broker.addr`` once its server listens (written aside, then renamed, so a
reader never sees half of it), which is how a caller learns the port a ``--listen 127.0.0.1:0`` broker bound::

    address_file = fresh_address_file(store)
    proc = subprocess.Popen(["trimq-broker", "--listen", "127.0.0.1:0", "--store", str(store), ...])
    address = listened_address(address_file, proc, 30)

A name server writes no file; with ``--log-format json`` its ``namesrv.started`` line carries the address:
``logged_event(log_path, proc, "namesrv.started", 20)["address"]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from trimq.broker.broker import ADDRESS_FILE_NAME

__all__ = ["ADDRESS_FILE_NAME", "DaemonNotReadyError", "first_event", "fresh_address_file", "listened_address",
           "logged_event"]

_T = TypeVar("_T")

# How much of a broker's log an error quotes: its last lines say why it stopped.
LOG_TAIL_CHARS = 3000


class _Process(Protocol):
    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...


class DaemonNotReadyError(RuntimeError):
    """The daemon process exited, or did not write its address (or log the event waited for) in time."""


def fresh_address_file(store: str | Path) -> Path:
    """``STORE/broker.addr``, removed if an earlier run left it there (so it cannot be read as this run's)."""
    path = Path(store) / ADDRESS_FILE_NAME
    path.unlink(missing_ok=True)
    return path


def listened_address(address_file: str | Path, proc: _Process, timeout_s: float, *,
                     log: Callable[[], str] | Path | None = None, name: str = "trimq-broker") -> str:
    """The ``HOST:PORT`` the broker process ``proc`` listens on, once it has written ``address_file``; it accepts
    connections when this returns. Raises :class:`DaemonNotReadyError` as soon as the process exits first,
    or after ``timeout_s``; the message quotes the end of ``log`` (its text, or a function returning it)."""
    path = Path(address_file)

    def address() -> str | None:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return None

    return _wait(address, proc, timeout_s, "listen", f" (no {path})", log, name)


def logged_event(log: Path, proc: _Process, event: str, timeout_s: float, *, name: str = "trimq-namesrv"
                 ) -> dict[str, Any]:
    """The first line of ``log`` (a daemon's ``--log-format json`` output) whose event is ``event``, as a dict,
    e.g. ``logged_event(log, proc, "namesrv.started", 20)["address"]`` for a name server on port 0. Raises
    :class:`DaemonNotReadyError` as soon as the process exits first, or after ``timeout_s``."""

    def found() -> dict[str, Any] | None:
        try:
            text = log.read_text(errors="replace")
        except FileNotFoundError:
            return None
        return first_event(text, event)

    return _wait(found, proc, timeout_s, f"log {event}", "", log, name)


def first_event(log_text: str, event: str) -> dict[str, Any] | None:
    """The first JSON log line of ``log_text`` whose event is ``event``, or None."""
    for line in log_text.splitlines():
        if f'"{event}"' in line:
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a line being written, or not JSON
            if isinstance(obj, dict) and obj.get("event") == event:
                return obj
    return None


def _wait(probe: Callable[[], _T | None], proc: _Process, timeout_s: float, goal: str, detail: str,
          log: Callable[[], str] | Path | None, name: str) -> _T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found is not None:
            return found
        if proc.poll() is not None:
            problem = f"{name} exited with {proc.returncode} before it could {goal}"
        elif time.monotonic() > deadline:
            problem = f"{name} did not {goal} within {timeout_s} s{detail}"
        else:
            time.sleep(0.02)
            continue
        raise DaemonNotReadyError(problem + _log_tail(log))


def _log_tail(log: Callable[[], str] | Path | None) -> str:
    if log is None:
        return ""
    try:
        text = log.read_text(errors="replace") if isinstance(log, Path) else log()
    except OSError as e:
        return f"\n(its log could not be read: {e})"
    return f"; the end of its log:\n{text[-LOG_TAIL_CHARS:]}"
