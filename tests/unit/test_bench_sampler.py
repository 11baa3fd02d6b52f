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


def test_the_report_says_the_interval_the_samples_came_at(tmp_path: Path) -> None:
    """The first line gives the CPU sampled over and the effective interval next to the one asked for: Linux fires
    ITIMER_PROF at most once per kernel tick, so 0.25 ms asked is ~4 ms got at HZ=250, and a reader must know."""
    path = tmp_path / "report.txt"
    with sampled_to(str(path)) as sampler:
        _spin(0.1)
    first = path.read_text().splitlines()[0]
    assert sampler.samples > 0 and sampler.cpu_s >= 0.1
    assert first.startswith(f"{sampler.samples} samples over {sampler.cpu_s:.2f} s of process CPU: one per ")
    assert first.endswith(f" ms (asked: {1000 * sampler.interval_s:g} ms)")
