"""Atomic JSON files: write to a temp file, fsync, rename over the target, fsync the directory.

A reader therefore sees either the old or the new content, never a torn file, even after a crash or a
power cut. These are blocking calls (fsync): trio code calls them through ``trio.to_thread.run_sync`` when
latency matters, or directly at start-up and shutdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["StateFileError", "fsync_dir", "read_json", "write_bytes_atomic", "write_json_atomic"]


class StateFileError(ValueError):
    """A state file (topics, offsets, epochs, ...) exists but does not hold what it should. The broker refuses to
    start rather than start without it, which would lose that state unnoticed; the message names the file, and
    ``trimq-broker`` reports it in one line (``cannot start: ...``), as it does a port in use."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or a new file inside it is durable (no-op where unsupported)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        # Some filesystems refuse fsync on a directory; the rename itself is still atomic.
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (creates parent directories)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # one temp file per thread: two threads replacing the same file must not write into one temp file (a torn
    # file, or a rename of a file the other thread already renamed)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Serialize ``obj`` as pretty, key-sorted JSON and replace ``path`` with it atomically."""
    data = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n"
    write_bytes_atomic(path, data)


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """Read a JSON file written by :func:`write_json_atomic`; ``default`` when it does not exist.

    A file that exists but does not parse raises :class:`StateFileError` naming the file: silently starting
    from ``default`` would lose state (topics, offsets) without anyone noticing.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return default
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(f"{p}: not valid JSON ({exc})") from exc
    if data is None:  # never written so: read as "no file", it would start every reader from nothing
        raise StateFileError(f"{p}: holds JSON null, not the state it should")
    return data
