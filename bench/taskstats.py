"""Trio task steps of a benchmark process (``TRIMQ_BENCH_STEPS=dir``): how many steps each task took and the CPU
time of its thread they spent, through a trio Instrument. It answers "how many task switches does a batch cost,
and where does a batch's CPU go between the tasks" (bench/RESULTS.md, "Where the latency goes").

``install()`` makes every later ``trio.run`` of the process carry the counter (the broker's CLI calls ``trio.run``
itself), ``write(name)`` saves it as ``dir/<name>-<pid>.json``; ``python -m bench.taskstats DIR`` prints them all.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any

import trio


class StepCounter(trio.abc.Instrument):
    """Steps and thread CPU seconds per task name (a task runs in the thread of its ``trio.run``)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[float]] = {}
        self._started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = time.thread_time() - self._started
        row = self.steps.get(task.name)
        if row is None:
            self.steps[task.name] = [1, spent]
        else:
            row[0] += 1
            row[1] += spent

    def report(self) -> dict[str, dict[str, float]]:
        """``{task name: {"steps": n, "cpu_s": seconds}}``, the most expensive task first."""
        rows = sorted(self.steps.items(), key=lambda kv: -kv[1][1])
        return {name: {"steps": int(n), "cpu_s": round(s, 6)} for name, (n, s) in rows}


_counter: StepCounter | None = None


def install() -> StepCounter:
    """Count the task steps of every ``trio.run`` this process makes from now on (one counter for all)."""
    global _counter
    if _counter is None:
        _counter = StepCounter()
        original = trio.run

        @functools.wraps(original)
        def run(*args: Any, instruments: Any = (), **kwargs: Any) -> Any:
            return original(*args, instruments=(*instruments, _counter), **kwargs)

        trio.run = run  # type: ignore[assignment]
    return _counter


def write(name: str) -> None:
    """Save the counter as ``$TRIMQ_BENCH_STEPS/<name>-<pid>.json`` (nothing without the variable)."""
    d = os.environ.get("TRIMQ_BENCH_STEPS")
    if d and _counter is not None:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{name}-{os.getpid()}.json"), "w") as f:
            json.dump(_counter.report(), f)


def summary(d: str, top: int = 6) -> str:
    """Every process's counter in ``d``: steps, CPU in steps and the ``top`` tasks by CPU."""
    lines = []
    for fname in sorted(os.listdir(d)):
        if not fname.endswith(".json"):
            continue
        with open(os.path.join(d, fname)) as f:
            rows: dict[str, dict[str, float]] = json.load(f)
        steps = sum(r["steps"] for r in rows.values())
        cpu = sum(r["cpu_s"] for r in rows.values())
        lines.append(f"{fname[:-5]}: {steps:.0f} steps, {cpu:.3f} s CPU in task steps")
        for task, r in list(rows.items())[:top]:
            per_step = r["cpu_s"] / r["steps"] * 1e6
            lines.append(f"  {r['steps']:8.0f} steps {r['cpu_s']:8.3f} s {per_step:8.1f} us/step  {task}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
