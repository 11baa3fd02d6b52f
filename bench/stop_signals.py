"""A harness that starts child processes in sessions of their own ends them itself, also when it is stopped.

Children in sessions of their own: the chaos harness's cluster (tests/chaos/scenario.py) and ``bench.takeover``'s
clients, which SIGSTOP consumers (a stopped process in the job of a shell that exits is hung up by the kernel: an
orphaned process group holding a stopped process gets SIGHUP and SIGCONT, POSIX; chaos seed 42 lost a consumer so),
and every broker or Redis server the shared bench harness starts (its ``Server``). No terminal hang-up or ``kill``
of the job reaches them, so the harness, which would die of the signal, turns it into an exception
(:func:`raise_on_stop_signals`) and its ``finally`` ends them: the chaos harness, ``bench.run_all`` (which tells
its running step to stop, :func:`end_child`) and its steps (``bench.peer_bench``, ``takeover``, ``key_scope``,
``sdk_loops``, ``storage_bench``, ``spark_bench``; ``bench.ha`` runs in trio and cancels itself instead), and
``bench.wakes``.

The ``finally`` must know of each child: start it and record it inside :func:`stop_signals_held`
(:func:`start_recorded`), or an exception raised in ``subprocess.Popen`` after its fork would lose it (Popen
neither returns nor ends the child), to run on alone in its session (tests/chaos/test_scenario_stop.py failed so
in 4 runs of 15).
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: What ends a harness from outside: its terminal closing, or a ``kill``.
STOP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


@dataclass
class _Guard:
    error: Callable[[str], BaseException]
    held: int = 0
    pending: str | None = None  # a stop signal that came while held
    raised: bool = False  # one stop raised: later ones must not break into the finally that ends the children


_guards: list[_Guard] = []  # the main thread's raise_on_stop_signals blocks, innermost last


@contextmanager
def raise_on_stop_signals(error: Callable[[str], BaseException]) -> Iterator[None]:
    """Within the block, a SIGHUP or SIGTERM to this process raises ``error(text)``, the text naming the signal
    (at once, or where :func:`stop_signals_held` holds it, when that block ends), once: later ones are ignored, so
    that they do not break into the cleanup the first one started. The previous handlers come back after it.
    Only the main thread can set handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    guard = _Guard(error)

    def stop(signum: int, frame: Any) -> None:
        text = f"{signal.Signals(signum).name}: the harness was told to stop, or its terminal closed"
        if guard.raised:
            return  # already stopping (a closed terminal hangs up the whole job, and bench.run_all adds a SIGTERM)
        if guard.held:
            guard.pending = guard.pending or text
            return
        guard.raised = True
        raise error(text)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    _guards.append(guard)
    try:
        yield
    finally:
        _guards.remove(guard)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Within the block a stop signal waits, and raises when the (outermost such) block ends, also when the block
    itself raised. Start a child and record it where the harness's ``finally`` ends it, both inside one such block.
    Outside :func:`raise_on_stop_signals`, or outside the main thread, it changes nothing."""
    if not _guards or threading.current_thread() is not threading.main_thread():
        yield
        return
    guard = _guards[-1]
    guard.held += 1
    try:
        yield
    finally:
        guard.held -= 1
        if not guard.held and guard.pending is not None:
            text, guard.pending, guard.raised = guard.pending, None, True
            raise guard.error(text)  # the stop outranks what the block raised (that becomes its __context__)


def start_recorded(started: list[T], start: Callable[[], T]) -> T:
    """``start()`` (a child process, or a server running one), appended to ``started``, the list a ``finally`` ends,
    inside :func:`stop_signals_held`: a stop raises only once the child is on the list."""
    with stop_signals_held():
        child = start()
        started.append(child)
    return child


@contextmanager
def children_ended_on_error(grace_s: float = 60.0) -> Iterator[list[subprocess.Popen[Any]]]:
    """A list to record children on (:func:`start_recorded`); when the block raises (a stop signal, a ^C, an
    error), each child on it is told to stop (:func:`end_child`, SIGKILL after ``grace_s``) before the exception
    goes on: a bench run or an audit ends what it started itself."""
    started: list[subprocess.Popen[Any]] = []
    try:
        yield started
    except BaseException:
        for child in started:
            end_child(child, grace_s)
        raise


def kill_children(children: list[subprocess.Popen[Any]]) -> None:
    """SIGKILL each child still running and reap it: clients that hold nothing to hand back (the servers they used
    are ended with :func:`end_child`, or their harness's ``stop``)."""
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait(5)


def end_child(proc: subprocess.Popen[Any], grace_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``: a bench step or a trimq daemon ends what it started on SIGTERM (some
    of its children lead sessions of their own), where a SIGKILL would leave them running."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
