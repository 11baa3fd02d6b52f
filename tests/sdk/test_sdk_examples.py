"""The SDK's runnable examples (issue 18 item 4) keep working: the trio service here; the FastAPI-style asyncio
service and the plain-thread worker run in tests/e2e/test_examples.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_trio_service_example_runs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "trio_service.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "each account in order: True" in out.stdout and "will be retried" in out.stdout
