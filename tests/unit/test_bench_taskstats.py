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


def test_install_counts_every_later_run_and_write_saves_it(tmp_path: Path) -> None:
    # in a child process: install() replaces trio.run for the rest of the process
    code = ("from bench import taskstats; taskstats.install(); import trio\n"
            "async def main():\n    await trio.lowlevel.checkpoint()\n"
            "trio.run(main); trio.run(main); taskstats.write('probe')")
    env = dict(os.environ, TRIMQ_BENCH_STEPS=str(tmp_path))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=Path(__file__).parents[2])
    (saved,) = tmp_path.glob("probe-*.json")
    rows = json.loads(saved.read_text())
    assert rows["__main__.main"]["steps"] == 4  # two runs of two steps each
    assert "probe-" in summary(str(tmp_path))
