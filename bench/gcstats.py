"""Garbage-collector pauses of a benchmark process (``TRIMQ_BENCH_GC=dir``): every collection's generation and
duration, via ``gc.callbacks``; ``report()`` summarises them per generation (count, total, max ms)."""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any

_starts: list[float] = []
_pauses: list[tuple[int, float]] = []


def _callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _starts.append(time.perf_counter())
    elif _starts:
        _pauses.append((int(info.get("generation", -1)), (time.perf_counter() - _starts.pop()) * 1000))


def install() -> None:
    if _callback not in gc.callbacks:
        gc.callbacks.append(_callback)


def report() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for gen in (0, 1, 2):
        ms = [d for g, d in _pauses if g == gen]
        out[f"gen{gen}"] = {"count": len(ms), "total_ms": round(sum(ms), 2), "max_ms": round(max(ms, default=0), 2)}
    return out


def write(name: str) -> None:
    d = os.environ.get("TRIMQ_BENCH_GC")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{name}-{os.getpid()}.json"), "w") as f:
            json.dump(report(), f)
