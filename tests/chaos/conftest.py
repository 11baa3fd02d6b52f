"""Options of the chaos suite: ``--chaos-long`` also runs the long schedules (``make chaos``).

The short run's seed is fixed (``TRIMQ_CHAOS_SEED`` changes it); the long runs use ``TRIMQ_CHAOS_SEEDS``
(comma-separated, default ``11,12,13``). ``TRIMQ_CHAOS_KEEP=1`` keeps the work directory of a passing run
too (a failing run's is always kept and named in the report).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The suite imports the record checker as ``tests.e2e.checker`` (as ``python -m tests.chaos.scenario`` does):
# make the repository root importable however pytest was started.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos-long", action="store_true", default=False,
                     help="also run the long chaos schedules (several seeds, minutes)")
