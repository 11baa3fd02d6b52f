"""``bench.stop_signals.raise_on_stop_signals``: how the chaos harness (``HarnessStopped``) and bench.takeover
(``SystemExit``) end the processes they start in sessions of their own when they are hung up or killed."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from bench.stop_signals import raise_on_stop_signals
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
        with raise_on_stop_signals(SystemExit):  # signal.signal would raise ValueError here
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
