"""What every test shares: the logging configuration is put back after each test.

The daemons' and tools' ``main()`` functions that tests call in-process configure structlog for the whole process
(``trimq-admin`` at level ``error``, for one): a later test that captures warnings with
``structlog.testing.capture_logs`` would see none of them, depending on which tests ran before it in the same
process (found with two pytest-xdist workers, which order tests differently).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _logging_configuration_restored() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
