"""``bench.stop_signals.raise_on_stop_signals``: how the chaos harness (``HarnessStopped``) and bench.takeover
(``SystemExit``) end the processes they start in sessions of their own when they are hung up or killed; and
``stop_signals_held``, which lets each of them record a child it starts before a stop can raise."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.stop_signals import (
    children_ended_on_error,
    end_child,
    kill_children,
    raise_on_stop_signals,
    start_recorded,
    stop_signals_held,
)
from tests.chaos.scenario import HarnessStopped


@pytest.mark.parametrize("error", [HarnessStopped, SystemExit])
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_stop_signal_raises_within_the_block_and_the_handlers_come_back(sig: signal.Signals,
                                                                          error: type[BaseException]) -> None:
    assert threading.current_thread() is threading.main_thread()  # where pytest (and its xdist workers) run tests
    before = signal.getsignal(sig)
    with pytest.raises(error, match=sig.name), raise_on_stop_signals(error):
        os.kill(os.getpid(), sig)
        threading.Event().wait(1)  # the handler runs at the next bytecode boundary of the main thread
    assert signal.getsignal(sig) == before


def test_outside_the_main_thread_nothing_changes() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM)}
    seen: list[object] = []

    def other() -> None:
        with raise_on_stop_signals(SystemExit), stop_signals_held():  # signal.signal would raise ValueError here
            seen.append({sig: signal.getsignal(sig) for sig in before})

    worker = threading.Thread(target=other)
    worker.start()
    worker.join(10)
    assert seen == [before]


def _stopped_meanwhile(*args: object) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(1)


def test_both_harnesses_run_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # the run itself is replaced by one that is killed meanwhile: what is checked is the wiring around it
    from bench import takeover
    from tests.chaos import scenario

    monkeypatch.setattr(scenario, "_run_scenario", _stopped_meanwhile)
    with pytest.raises(HarnessStopped, match="SIGTERM"):
        scenario.run_scenario(1)
    monkeypatch.setattr(takeover, "run_scenario", _stopped_meanwhile)
    with pytest.raises(SystemExit, match="SIGTERM"):
        takeover.main(["--scenario", "graceful"])


def _stop_me() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(0.2)  # time for the handler to run, were it to raise


def test_a_held_stop_raises_when_the_outermost_hold_ends() -> None:
    # A stop raising inside subprocess.Popen after its fork loses the child, which leads a session of its own and
    # runs on (tests/chaos/test_scenario_stop.py failed so in 4 runs of 15): inside the hold it only waits.
    done: list[str] = []
    with pytest.raises(SystemExit, match="SIGTERM"), raise_on_stop_signals(SystemExit):
        with stop_signals_held():
            with stop_signals_held():
                _stop_me()
                done.append("inner")
            done.append("outer")  # the inner hold's end does not raise
        done.append("after")
    assert done == ["inner", "outer"]
    with raise_on_stop_signals(SystemExit), stop_signals_held():
        pass  # the stop was delivered once, and is not pending any more


def test_a_held_stop_outranks_what_the_block_raised() -> None:
    with (pytest.raises(HarnessStopped, match="SIGTERM") as stopped, raise_on_stop_signals(HarnessStopped),
          stop_signals_held()):
        _stop_me()
        raise OSError("the child did not start")
    assert isinstance(stopped.value.__context__, OSError)


def test_a_hold_outside_the_handlers_changes_nothing() -> None:
    with stop_signals_held():
        pass
    with raise_on_stop_signals(SystemExit):
        pass
    with stop_signals_held():  # the handlers' block has ended: nothing is held, nothing pending
        pass


def test_a_child_whose_start_was_stopped_is_recorded() -> None:
    started: list[str] = []

    def start() -> str:
        _stop_me()  # as if the stop came inside subprocess.Popen
        return "child"

    with pytest.raises(SystemExit, match="SIGTERM"), raise_on_stop_signals(SystemExit):
        start_recorded(started, start)
    assert started == ["child"]  # so the finally ends it


STEP = """
import os, signal, sys, time
from pathlib import Path
def ended(signum, frame):
    time.sleep(0.3)  # a real step ends its brokers and clients here; a second signal meanwhile would cut it short
    Path(sys.argv[1]).write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, ended)
signal.signal(signal.SIGINT, ended)
Path(sys.argv[1] + ".ready").write_text(str(os.getpid()))
time.sleep(60)
"""


def _stop_when_ready(mark: Path) -> None:
    """SIGTERM to this process once the STEP child at ``mark`` has its handler (from another thread)."""

    def stop() -> None:
        deadline = time.monotonic() + 10
        while not Path(f"{mark}.ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop, daemon=True).start()


def test_a_step_that_times_out_is_told_to_stop_before_it_is_killed(tmp_path: Path) -> None:
    # bench.run_all killed a step that ran past its timeout with SIGKILL, which left the brokers it had started in
    # sessions of their own running; SIGTERM lets the step end them (its raise_on_stop_signals and finally).
    from bench import run_all

    mark = tmp_path / "ended"
    assert run_all.run_step("step", [sys.executable, "-c", STEP, str(mark)], timeout=3) == -1
    assert mark.read_text() == "SIGTERM"


def test_a_stopped_run_tells_its_step_to_stop(tmp_path: Path) -> None:
    from bench import run_all

    mark = tmp_path / "ended"
    _stop_when_ready(mark)
    with pytest.raises(SystemExit, match="SIGTERM"), raise_on_stop_signals(SystemExit):
        run_all.run_step("step", [sys.executable, "-c", STEP, str(mark)], timeout=30)
    assert mark.read_text() == "SIGTERM"


def test_after_a_ctrl_c_the_step_ends_what_it_started_undisturbed(tmp_path: Path) -> None:
    # The terminal's ^C reaches the step and bench.run_all alike: run_all waits for the step to end its brokers and
    # clients instead of breaking into that with a SIGTERM.
    from bench import run_all

    mark = tmp_path / "ended"

    def ctrl_c() -> None:
        deadline = time.monotonic() + 10
        while not (Path(f"{mark}.ready").exists() and Path(f"{mark}.ready").read_text()) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(int(Path(f"{mark}.ready").read_text()), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_all.run_step("step", [sys.executable, "-c", STEP, str(mark)], timeout=30)
    assert mark.read_text() == "SIGINT"


def test_children_are_told_to_stop_when_the_block_raises_and_left_when_it_does_not() -> None:
    with children_ended_on_error(5) as started:
        kept = start_recorded(started, lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    assert kept.poll() is None
    try:
        with pytest.raises(ValueError), children_ended_on_error(5) as started:
            child = start_recorded(started, lambda: subprocess.Popen([sys.executable, "-c",
                                                                      "import time; time.sleep(60)"]))
            raise ValueError("the run failed")
        assert child.returncode == -signal.SIGTERM
    finally:
        kill_children([kept])


def test_a_second_stop_does_not_break_into_the_cleanup_of_the_first() -> None:
    # A closed terminal hangs up the whole job (the step and bench.run_all), and run_all then adds a SIGTERM to the
    # step: a second exception raised in the step's finally would stop it ending its brokers.
    cleaned: list[str] = []
    with pytest.raises(SystemExit, match="SIGHUP"), raise_on_stop_signals(SystemExit):
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            threading.Event().wait(1)
        finally:
            _stop_me()
            cleaned.append("ended")
    assert cleaned == ["ended"]


@pytest.mark.parametrize("harness", ["wakes", "spark_bench"])
def test_the_diagnostics_tell_their_run_to_stop(tmp_path: Path, harness: str) -> None:
    # bench.wakes and bench.spark_bench run a bench or an audit as a child: a stopped harness tells it to stop
    # (SIGTERM, so that it ends what it started) instead of leaving it running.
    from bench import spark_bench, wakes

    mark = tmp_path / "ended"
    cmd = [sys.executable, "-c", STEP, str(mark)]
    _stop_when_ready(mark)
    with pytest.raises(SystemExit, match="SIGTERM"), raise_on_stop_signals(SystemExit):
        if harness == "wakes":
            wakes.count_switches(cmd)
        else:
            spark_bench.run_timed(cmd)
    assert mark.read_text() == "SIGTERM"


def test_the_ha_bench_ends_its_clusters_on_a_stop_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench.ha runs its clusters inside trio: a SIGTERM cancels the run (trio's signal receiver), so each cluster's
    # block ends its daemons, and then the bench exits naming the signal; before, the daemons outlived it.
    import trio

    from bench import ha

    ended: list[str] = []

    async def run(args: object) -> dict[str, object]:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await trio.sleep(10)
            return {}
        finally:
            ended.append("clusters ended")

    monkeypatch.setattr(ha, "run", run)
    with pytest.raises(SystemExit, match="SIGTERM"):
        trio.run(ha.run_until_stopped, argparse.Namespace())
    assert ended == ["clusters ended"]


IGNORES_SIGTERM = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
Path(sys.argv[1]).touch()
time.sleep(60)
"""


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM, str(ready)])
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    end_child(child, grace_s=0.3)
    assert child.returncode == -signal.SIGKILL
    end_child(child)  # an ended child: nothing to do


def test_kill_children_reaps_the_running_and_leaves_the_ended() -> None:
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(10)
    kill_children([running, ended])
    assert running.returncode == -signal.SIGKILL and ended.returncode == 0
