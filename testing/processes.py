"""Brokers run as processes (``trimq-broker``, started by a test, a benchmark or a supervisor): the file where a
broker says which address it listens on, and waiting for it.

A broker writes ``HOST:PORT`` to ``STORE/broker.addr`` once its server listens (written aside, then renamed, so a
reader never sees half of it), which is how a caller learns the port a ``--listen 127.0.0.1:0`` broker bound::

    address_file = fresh_address_file(store)
    proc = subprocess.Popen(["trimq-broker", "--listen", "127.0.0.1:0", "--store", str(store), ...])
    address = listened_address(address_file, proc, 30)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from trimq.broker.broker import ADDRESS_FILE_NAME

__all__ = ["ADDRESS_FILE_NAME", "BrokerNotListeningError", "fresh_address_file", "listened_address"]

# How much of a broker's log an error quotes: its last lines say why it stopped.
LOG_TAIL_CHARS = 3000


class _Process(Protocol):
    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...


class BrokerNotListeningError(RuntimeError):
    """The broker process exited, or did not write its address in time."""


def fresh_address_file(store: str | Path) -> Path:
    """``STORE/broker.addr``, removed if an earlier run left it there (so it cannot be read as this run's)."""
    path = Path(store) / ADDRESS_FILE_NAME
    path.unlink(missing_ok=True)
    return path


def listened_address(address_file: str | Path, proc: _Process, timeout_s: float, *,
                     log: Callable[[], str] | Path | None = None, name: str = "trimq-broker") -> str:
    """The ``HOST:PORT`` the broker process ``proc`` listens on, once it has written ``address_file``; it accepts
    connections when this returns. Raises :class:`BrokerNotListeningError` as soon as the process exits first,
    or after ``timeout_s``; the message quotes the end of ``log`` (its text, or a function returning it)."""
    path = Path(address_file)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            problem = f"{name} exited with {proc.returncode} before it listened"
        elif time.monotonic() > deadline:
            problem = f"{name} did not listen within {timeout_s} s (no {path})"
        else:
            time.sleep(0.02)
            continue
        raise BrokerNotListeningError(problem + _log_tail(log))


def _log_tail(log: Callable[[], str] | Path | None) -> str:
    if log is None:
        return ""
    try:
        text = log.read_text(errors="replace") if isinstance(log, Path) else log()
    except OSError as e:
        return f"\n(its log could not be read: {e})"
    return f"; the end of its log:\n{text[-LOG_TAIL_CHARS:]}"
