"""``make ... PY=...`` builds .venv from that interpreter, and refuses a .venv another interpreter made instead of
running on it silently (docs/OPERATIONS.md, *Which Python*). The interpreters and the venv are stand-ins in a
temporary folder: nothing is installed and the repository's own .venv is not touched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _interpreter(path: Path, real: str) -> Path:
    """A stand-in ``python`` answering ``-c '...realpath(sys.executable)'`` with ``real``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {real}\n")
    path.chmod(0o755)
    return path


def _make(venv: Path, *assignments: str, py_in_env: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``make venv-python`` against ``venv``, with PY in the environment only when ``py_in_env`` is given.

    Not the outer make's flags either: under ``make test PY=...`` they carry ``PY`` to every make below it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PY", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    if py_in_env is not None:
        env["PY"] = str(py_in_env)
    return subprocess.run(["make", "-s", "-C", str(ROOT), "venv-python", f"VENV={venv}", *assignments],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_venv_of_another_interpreter_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _interpreter(venv / "bin" / "python", "/opt/pyenv/bin/python3.11")
    other = _interpreter(tmp_path / "other" / "python3", "/usr/bin/python3.11")
    got = _make(venv, f"PY={other}")
    assert got.returncode == 2
    assert (f"make: {venv} runs /opt/pyenv/bin/python3.11, not PY={other} (/usr/bin/python3.11); "
            f"remove {venv} (make clean) to rebuild it with PY") in got.stderr
    assert _make(venv, py_in_env=other).returncode == 2  # PY from the environment is held to it too


def test_the_same_interpreter_or_no_py_goes_on(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _interpreter(venv / "bin" / "python", "/opt/pyenv/bin/python3.11")
    same = _interpreter(tmp_path / "shim" / "python3", "/opt/pyenv/bin/python3.11")  # e.g. pyenv's shim
    assert _make(venv, f"PY={same}").returncode == 0
    got = _make(venv)
    assert got.returncode == 0, got.stderr  # the default python3 does not judge a venv made with PY earlier
