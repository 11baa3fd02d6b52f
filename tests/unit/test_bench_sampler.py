"""bench.sampler's context managers: what the benchmark's processes write under ``TRIMQ_BENCH_SAMPLE``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.sampler import sampled_if_asked, sampled_to


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_sampled_to_writes_the_report_even_when_the_block_raises(tmp_path: Path) -> None:
    path = tmp_path / "made" / "report.txt"  # the directory is created
    with pytest.raises(RuntimeError), sampled_to(str(path)):
        _spin(0.05)
        raise RuntimeError("the block failed")
    assert not path.read_text().startswith("0 samples")  # the spin was sampled


def test_nothing_is_sampled_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIMQ_BENCH_SAMPLE", raising=False)
    with sampled_if_asked("produce") as inline:
        assert inline is False
    monkeypatch.setenv("TRIMQ_BENCH_SAMPLE", str(tmp_path))
    with sampled_if_asked("produce") as inline:
        assert inline is True
        _spin(0.05)
    assert [p.name for p in tmp_path.iterdir()] == [f"produce-{os.getpid()}.txt"]
