"""bench.recorders: which recorder a benchmark process's environment asks for, and that it is written however the
block it wraps ends."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import gcstats
from bench.recorders import recorder_asked, recording


@pytest.fixture
def no_recorder_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("TRIMQ_BENCH_STEPS", raising=False)
    monkeypatch.delenv("TRIMQ_BENCH_GC", raising=False)
    yield monkeypatch
    if gcstats._callback in gc.callbacks:  # recording() installed it in this (the test) process
        gc.callbacks.remove(gcstats._callback)


def test_the_first_variable_set_wins(no_recorder_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert recorder_asked() is None
    no_recorder_env.setenv("TRIMQ_BENCH_GC", str(tmp_path))
    assert recorder_asked() == "gcstats"
    no_recorder_env.setenv("TRIMQ_BENCH_STEPS", str(tmp_path))
    assert recorder_asked() == "taskstats"


def test_recording_writes_when_the_block_raises(no_recorder_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    no_recorder_env.setenv("TRIMQ_BENCH_GC", str(tmp_path))
    with pytest.raises(RuntimeError), recording("gcstats", "broker"):
        assert gcstats._callback in gc.callbacks  # installed for the block
        gc.collect()
        raise RuntimeError("the block failed")
    report = json.loads((tmp_path / f"broker-{os.getpid()}.json").read_text())
    assert report["gen2"]["count"] >= 1  # the collection above was recorded
