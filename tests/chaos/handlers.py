"""Handlers the chaos suite gives ``trimq-consumer --handler`` (imported by module path, the repository root on
PYTHONPATH)."""

from __future__ import annotations

import random
from typing import Any

import trio


async def jitter(msgs: list[Any], context: Any) -> bool:
    """Success after 0-20 ms: an I/O-bound listener, so a key-scope consumer has many keys of a queue in flight at
    once and finishes them out of queue order."""
    await trio.sleep(random.uniform(0.0, 0.02))
    return True
