"""docs/examples/fenced_writes.py (docs/EMBEDDING.md "Fencing your own writes") runs and its fence holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fenced_writes_example_refuses_the_ex_holders_write(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "fenced_writes.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused" in out.stdout and "fenced writes: OK" in out.stdout, out.stdout
