"""The chaos suite: a whole cluster as real processes under a seeded schedule of SIGKILLs, SIGSTOPs and
broker restarts, judged from record files (tests/chaos/scenario.py, docs/CHAOS.md).

* ``test_chaos_short`` (in ``make test``, about 35 s): one consumer SIGKILL, one consumer pause past its
  locks, one broker SIGKILL and one SIGKILL of broker-a's SYNC_MASTER with its slave promoted (issue 15: nothing
  acknowledged may be lost), one after the other, with the default seed (``TRIMQ_CHAOS_SEED`` to change).
  One consumer of the three (slot ``c3``) runs with ``order_scope="key"`` (issue 17).
* ``test_chaos_long`` (``make chaos``: ``pytest tests/chaos --chaos-long``): a dozen overlapping events per
  seed, for several seeds (``TRIMQ_CHAOS_SEEDS``).
* ``test_chaos_long_async`` (``make chaos`` too): the same schedules with broker-a's pair an ASYNC_MASTER and its
  slave (``TRIMQ_CHAOS_ASYNC_SEEDS``): a promotion may lose the tail the slave never had, exactly that, and a
  consumer that read it is moved back onto the promoted log without skipping anything there.

Every run asserts the checker's verdict (tests/e2e/checker.py): nothing acknowledged lost, per-key order
except replays after crashes, pauses and broker restarts, no replay below the committed offset, committed
offsets never going backwards between broker restarts, late completions of a paused consumer bounded, nothing
started by a paused consumer after its lease ran out (issue 14); and
that each stopped consumer's queues were taken over. The report (counts, takeover times, fenced updates)
is printed; on failure it names the seed, the first offending key and the kept work directory.
"""

from __future__ import annotations

import os

import pytest

from .scenario import LONG, LONG_ASYNC, SHORT, ChaosResult, run_scenario

DEFAULT_SEED = 1
LONG_SEEDS = [int(s) for s in os.environ.get("TRIMQ_CHAOS_SEEDS", "11,12,13").split(",") if s.strip()]
ASYNC_SEEDS = [int(s) for s in os.environ.get("TRIMQ_CHAOS_ASYNC_SEEDS", "11,12,13").split(",") if s.strip()]

pytestmark = pytest.mark.slow


def verdict(result: ChaosResult) -> None:
    print(f"\n{result.text()}")
    assert result.ok, result.text()
    r = result.report
    # every acknowledged send is judged, but those allowed to be lost (not SEND_OK, or an ASYNC failover's tail) and
    # an ASYNC failover's tail read before the cut
    assert result.producer_status == 0
    assert r.produced + r.unsafe_lost + r.tail_read == result.producer_summary.get("sent"), result.text()
    assert r.takeovers, "no stopped consumer owned a queue: the schedule did not exercise a takeover"
    late = [t for t in r.takeovers if t.ms is None and not t.idle]
    assert not late, f"queues of a stopped consumer never consumed again: {late}\n{result.text()}"
    assert r.duplicates <= r.replayed + r.late_completions, result.text()
    assert r.started_after_lease == 0, result.text()  # a paused consumer starts nothing once its lease ran out
    assert result.key_scope_records > 0, result.text()  # the key-scope consumer (issue 17) took part


def test_chaos_short() -> None:
    seed = int(os.environ.get("TRIMQ_CHAOS_SEED", DEFAULT_SEED))
    verdict(run_scenario(seed, SHORT))


@pytest.mark.parametrize("seed", LONG_SEEDS)
def test_chaos_long(seed: int, request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--chaos-long", default=False):
        pytest.skip("long chaos schedules run with --chaos-long (make chaos)")
    verdict(run_scenario(seed, LONG))


@pytest.mark.parametrize("seed", ASYNC_SEEDS)
def test_chaos_long_async(seed: int, request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--chaos-long", default=False):
        pytest.skip("long chaos schedules run with --chaos-long (make chaos)")
    verdict(run_scenario(seed, LONG_ASYNC))
