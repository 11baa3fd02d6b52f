"""A small statistical CPU profiler for the benchmark processes (py-spy is not available here).

``with CpuSampler(thread_id) as s: ...`` samples the stack of one thread every ``interval_s`` of process CPU
time (SIGPROF) and ``s.report()`` lists functions by samples where they were running (self) and on the stack
(total). Unlike cProfile it adds no cost per call, so call-heavy code is not over-weighted. ``sampled_to(path)``
samples the calling thread for a block and writes the report to a file; ``sampled_if_asked(name)`` does so only
under ``TRIMQ_BENCH_SAMPLE=dir``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any


class CpuSampler:
    def __init__(self, thread_id: int | None = None, interval_s: float | None = None) -> None:
        """``thread_id`` None: the busiest other thread (sampled: whichever non-main thread has a frame).
        ``interval_s`` None: ``$TRIMQ_BENCH_SAMPLE_INTERVAL_MS`` (default 2 ms) of process CPU time, rounded up by
        the kernel to its tick (:meth:`header`)."""
        self.thread_id = thread_id
        self.main_id = threading.main_thread().ident
        if interval_s is None:
            interval_s = float(os.environ.get("TRIMQ_BENCH_SAMPLE_INTERVAL_MS", "2")) / 1000
        self.interval_s = interval_s
        self.self_counts: collections.Counter[str] = collections.Counter()
        self.total_counts: collections.Counter[str] = collections.Counter()
        self.lines: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.cpu_s = 0.0
        """Process CPU time the sampler ran over (set when it stops)."""
        self._cpu0 = 0.0
        self._old: Any = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.thread_id == threading.get_ident():
            f = frame  # the code the signal interrupted (the handler runs in the sampled thread)
        else:
            frames = sys._current_frames()
            if self.thread_id is not None:
                f = frames.get(self.thread_id)
            else:
                f = next((fr for tid, fr in frames.items() if tid != self.main_id), None)
        if f is None:
            return
        self.lines[f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}({f.f_code.co_name})"] += 1
        self.samples += 1
        seen = set()
        leaf = True
        while f is not None:
            code = f.f_code
            name = f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_firstlineno}({code.co_name})"
            if leaf:
                self.self_counts[name] += 1
                leaf = False
            if name not in seen:
                self.total_counts[name] += 1
                seen.add(name)
            f = f.f_back

    def __enter__(self) -> CpuSampler:
        self._old = signal.signal(signal.SIGPROF, self._handler)
        self._cpu0 = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, self.interval_s, self.interval_s)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        self.cpu_s = time.process_time() - self._cpu0
        signal.signal(signal.SIGPROF, self._old or signal.SIG_DFL)

    def header(self) -> str:
        """How many samples, over how much CPU, at what effective interval. Linux fires ITIMER_PROF at most once
        per kernel tick (4 ms at HZ=250), so an interval asked below that samples no more often than the tick."""
        line = f"{self.samples} samples"
        if self.samples and self.cpu_s > 0:
            line += (f" over {self.cpu_s:.2f} s of process CPU: one per {1000 * self.cpu_s / self.samples:.2f} ms"
                     f" (asked: {1000 * self.interval_s:g} ms)")
        return line

    def report(self, top: int = 40) -> str:
        n = max(self.samples, 1)
        lines = [self.header(), "self%  total%  function"]
        for name, c in self.self_counts.most_common(top):
            lines.append(f"{100 * c / n:5.1f}  {100 * self.total_counts[name] / n:6.1f}  {name}")
        lines.append("")
        lines.append("by line (self):")
        for name, c in self.lines.most_common(top):
            lines.append(f"{100 * c / n:5.1f}  {name}")
        lines.append("")
        lines.append("by total (on the stack):")
        for name, c in self.total_counts.most_common(top):
            lines.append(f"{100 * self.self_counts[name] / n:5.1f}  {100 * c / n:6.1f}  {name}")
        return "\n".join(lines)


@contextlib.contextmanager
def sampled_to(path: str, top: int = 60) -> Iterator[CpuSampler]:
    """Sample the calling thread while the block runs (it must be the main thread, where Python runs the signal
    handler, to see the code that holds the CPU) and write the report to ``path`` when the block ends, however it
    ends; ``path``'s directory is created."""
    sampler = CpuSampler(threading.get_ident())
    try:
        with sampler:
            yield sampler
    finally:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as fh:
            fh.write(sampler.report(top))


@contextlib.contextmanager
def sampled_if_asked(name: str) -> Iterator[bool]:
    """With ``TRIMQ_BENCH_SAMPLE=dir``: :func:`sampled_to` ``dir/NAME-PID.txt`` for the block, which gets True (the
    caller must then run its code in this, the main thread); otherwise nothing is sampled and the block gets False."""
    sample_dir = os.environ.get("TRIMQ_BENCH_SAMPLE")
    if not sample_dir:
        yield False
        return
    with sampled_to(os.path.join(sample_dir, f"{name}-{os.getpid()}.txt")):
        yield True
