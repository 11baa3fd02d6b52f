"""The recorders a benchmark process can carry (``TRIMQ_BENCH_STEPS``, ``TRIMQ_BENCH_GC``): which one the environment
asks for, and installing it around a block. Shared by the benchmark's client processes (``bench.peer_trimq``) and
its broker (``bench.instrumented_broker``), so that one variable asks for the same recorder everywhere."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

#: Recorders of a benchmark process, by the variable that asks for one (the first set wins): bench modules with
#: ``install()`` (before ``trio.run``) and ``write(name)`` (after it).
RECORDER_VARIABLES = (("TRIMQ_BENCH_STEPS", "taskstats"), ("TRIMQ_BENCH_GC", "gcstats"))
RECORDERS = tuple(module for _, module in RECORDER_VARIABLES)


def recorder_asked() -> str | None:
    """The recorder module this process's environment asks for, if any."""
    return next((module for variable, module in RECORDER_VARIABLES if os.environ.get(variable)), None)


@contextlib.contextmanager
def recording(module: str, name: str) -> Iterator[None]:
    """Install the recorder ``bench.<module>`` for the block (every ``trio.run`` started in it carries it) and
    write what it recorded under ``name`` when the block ends, however it ends."""
    recorder = importlib.import_module(f"bench.{module}")
    recorder.install()
    try:
        yield
    finally:
        recorder.write(name)
