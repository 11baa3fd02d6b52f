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
    """Steps and thread CPU seconds per task name (a task runs in the thread of its ``trio.run``), and how many of
    them ran right after the process had been idle: the first batch of steps after an I/O wait that blocked for at
    least ``idle_s`` (the run loop had nothing to run). On the benchmark's VM the same work costs more CPU there
    than back to back (bench/RESULTS.md, *The cost of waking up*)."""

    def __init__(self, idle_s: float = 0.001) -> None:
        self.idle_s = idle_s
        self.steps: dict[str, list[float]] = {}  # name -> [steps, cpu s, steps after idle, cpu s after idle]
        self.idle_wakes = 0
        self._started = 0.0
        self._wait_started = 0.0
        self._after_idle = False

    def before_io_wait(self, timeout: float) -> None:
        self._wait_started = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        self._after_idle = time.perf_counter() - self._wait_started >= self.idle_s
        if self._after_idle:
            self.idle_wakes += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = time.thread_time() - self._started
        row = self.steps.get(task.name)
        if row is None:
            row = self.steps[task.name] = [0, 0.0, 0, 0.0]
        row[0] += 1
        row[1] += spent
        if self._after_idle:
            row[2] += 1
            row[3] += spent

    def report(self) -> dict[str, dict[str, float]]:
        """``{task name: {"steps": n, "cpu_s": seconds, "steps_after_idle": n, "cpu_after_idle_s": seconds}}``, the
        most expensive task first."""
        rows = sorted(self.steps.items(), key=lambda kv: -kv[1][1])
        return {name: {"steps": int(n), "cpu_s": round(s, 6), "steps_after_idle": int(ni),
                       "cpu_after_idle_s": round(si, 6)} for name, (n, s, ni, si) in rows}


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
            json.dump({"tasks": _counter.report(), "idle_wakes": _counter.idle_wakes, "idle_s": _counter.idle_s}, f)


def summary(d: str, top: int = 6) -> str:
    """Every process's counter in ``d``: steps, CPU in steps and the ``top`` tasks by CPU, and the steps that ran
    right after the process had been idle (files written before the idle count are a bare task table)."""
    lines = []
    for fname in sorted(os.listdir(d)):
        if not fname.endswith(".json"):
            continue
        with open(os.path.join(d, fname)) as f:
            saved: dict[str, Any] = json.load(f)
        rows: dict[str, dict[str, float]] = saved.get("tasks", saved)
        steps = sum(r["steps"] for r in rows.values())
        cpu = sum(r["cpu_s"] for r in rows.values())
        lines.append(f"{fname[:-5]}: {steps:.0f} steps, {cpu:.3f} s CPU in task steps")
        if "idle_wakes" in saved:
            idle_steps = sum(r.get("steps_after_idle", 0) for r in rows.values())
            idle_cpu = sum(r.get("cpu_after_idle_s", 0.0) for r in rows.values())
            warm_steps, warm_cpu = steps - idle_steps, cpu - idle_cpu
            lines.append(f"  {saved['idle_wakes']} wakes after >= {saved['idle_s'] * 1000:g} ms idle; "
                         f"{idle_steps:.0f} steps right after them {_per_step(idle_cpu, idle_steps)}, "
                         f"the other {warm_steps:.0f} {_per_step(warm_cpu, warm_steps)}")
        for task, r in list(rows.items())[:top]:
            per_step = r["cpu_s"] / r["steps"] * 1e6
            after = ""
            idle_n = r.get("steps_after_idle", 0)
            if idle_n:
                idle_cpu_s = r["cpu_after_idle_s"]
                after = (f"  (after idle: {idle_n:.0f} {_per_step(idle_cpu_s, idle_n)}, "
                         f"else {_per_step(r['cpu_s'] - idle_cpu_s, r['steps'] - idle_n)})")
            lines.append(f"  {r['steps']:8.0f} steps {r['cpu_s']:8.3f} s {per_step:8.1f} us/step  {task}{after}")
    return "\n".join(lines)


def _per_step(cpu_s: float, steps: float) -> str:
    return f"{cpu_s / steps * 1e6:.1f} us/step" if steps else "-"


if __name__ == "__main__":
    print(summary(sys.argv[1]))
