"""How the chaos harness reads a consumer's exit status (tests/chaos/scenario.py: ``consumer_end_problem``)."""

from __future__ import annotations

import signal

from tests.chaos.scenario import consumer_end_problem


def test_the_harness_own_stops_are_no_problem() -> None:
    assert consumer_end_problem("c1.0", 0) is None  # SIGTERM at the end of the run
    assert consumer_end_problem("c1.0", -signal.SIGKILL) is None  # a kill_consumer event


def test_any_other_end_is_a_finding() -> None:
    assert consumer_end_problem("c2.1", 1) == "c2.1 ended with status 1"
    assert consumer_end_problem("c2.1", -signal.SIGSEGV) == f"c2.1 ended with status {-signal.SIGSEGV}"


def test_a_consumer_still_running_is_said_so_not_given_a_status() -> None:
    assert consumer_end_problem("c3.1", None) == "c3.1 had not ended when the run was judged"


def test_a_hang_up_is_named_as_not_the_harness_s_doing() -> None:
    # Seed 42 on 2026-12-07: a run in the background of a shell that exited while c1.0 was stopped ended
    # "c1.0 ended with status -1". The harness now keeps its processes out of the shell's reach
    # (test_scenario_hang_up.py); a SIGHUP seen since is named as coming from elsewhere.
    problem = consumer_end_problem("c1.0", -signal.SIGHUP)
    assert problem is not None
    assert problem.startswith(f"c1.0 ended with status {-signal.SIGHUP} (SIGHUP: not sent by the harness")
