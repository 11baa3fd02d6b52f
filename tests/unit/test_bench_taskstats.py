"""bench.taskstats counts trio task steps per task name (TRIMQ_BENCH_STEPS; the benchmarks never run in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from bench.taskstats import StepCounter, summary


def test_counter_counts_each_task_step() -> None:
    counter = StepCounter()

    async def worker() -> None:
        for _ in range(3):
            await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker, name="worker")

    trio.run(main, instruments=[counter])
    report = counter.report()
    # the worker's first step runs to its first checkpoint, then one step after each of the three
    assert report["worker"]["steps"] == 4
    assert all(r["cpu_s"] >= 0 for r in report.values())
    assert counter.idle_wakes == 0  # nothing blocked: every I/O wait of the run had something to run
    assert report["worker"]["steps_after_idle"] == 0


def test_counter_counts_the_steps_right_after_an_idle_wait() -> None:
    # the run loop blocks in its I/O wait while the sleeper sleeps (a real clock: the wait is what is measured)
    counter = StepCounter(idle_s=0.001)

    async def sleeper() -> None:
        for _ in range(2):
            await trio.sleep(0.005)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper, name="sleeper")

    trio.run(main, instruments=[counter])
    report = counter.report()
    assert counter.idle_wakes >= 2
    # the two steps after the sleeps ran right after an idle wait; the first step did not
    assert report["sleeper"]["steps"] == 3
    assert report["sleeper"]["steps_after_idle"] == 2
    assert 0 <= report["sleeper"]["cpu_after_idle_s"] <= report["sleeper"]["cpu_s"]


def test_install_counts_every_later_run_and_write_saves_it(tmp_path: Path) -> None:
    # in a child process: install() replaces trio.run for the rest of the process
    code = ("from bench import taskstats; taskstats.install(); import trio\n"
            "async def main():\n    await trio.lowlevel.checkpoint()\n"
            "trio.run(main); trio.run(main); taskstats.write('probe')")
    env = dict(os.environ, TRIMQ_BENCH_STEPS=str(tmp_path))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=Path(__file__).parents[2])
    (saved,) = tmp_path.glob("probe-*.json")
    saved_counter = json.loads(saved.read_text())
    assert saved_counter["tasks"]["__main__.main"]["steps"] == 4  # two runs of two steps each
    assert saved_counter["idle_s"] == 0.001 and saved_counter["idle_wakes"] >= 0
    text = summary(str(tmp_path))
    assert "probe-" in text and "wakes after >= 1 ms idle" in text


def test_summary_reads_a_counter_saved_before_the_idle_count(tmp_path: Path) -> None:
    # files of earlier runs are a bare task table
    (tmp_path / "broker-1.json").write_text(json.dumps({"serve": {"steps": 4, "cpu_s": 0.002}}))
    text = summary(str(tmp_path))
    assert "broker-1: 4 steps, 0.002 s CPU in task steps" in text
    assert "500.0 us/step  serve" in text and "wakes" not in text
