"""The checker's chaos rules (tests/e2e/checker.py: pauses, broker crashes, sampled committed offsets) on small
hand-made histories: each allows what the system may legitimately do and flags what it must not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.checker import BrokerCrash, Pause, Stop, check

T = "Orders"
Q = (T, "b", 0)


def write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def produced(n: int) -> list[dict[str, Any]]:
    return [{"topic": T, "broker": "b", "queue_id": 0, "queue_offset": i, "key": f"k{i % 2}", "seq": i // 2,
             "msg_id": f"m{i}", "send_time": 0, "ack_time": 0} for i in range(n)]


def consumed(offsets: list[int], client: str, t0: int) -> list[dict[str, Any]]:
    return [{"topic": T, "broker": "b", "queue_id": 0, "queue_offset": o, "keys": None, "msg_id": f"m{o}",
             "reconsume_times": 0, "body_sha1": "", "consume_time": t0 + i, "client_id": client}
            for i, o in enumerate(offsets)]


def run(tmp_path: Path, n: int, *parts: list[dict[str, Any]], **kw: Any) -> Any:
    p = write(tmp_path / "p.jsonl", produced(n))
    cs = [write(tmp_path / f"c{i}.jsonl", part) for i, part in enumerate(parts)]
    return check([p], cs, **kw)


def test_pause_is_a_crash_for_the_group_and_a_late_completion_is_counted(tmp_path: Path) -> None:
    # A consumed 0..3 and was paused at 100 with offset 4 in its listener; B took over at 200 from the
    # committed offset 3; A's listener finished 4 after SIGCONT (at 300): a late completion, then nothing.
    r = run(tmp_path, 8, consumed([0, 1, 2, 3], "A", 10), consumed([3, 4, 5, 6, 7], "B", 200),
            consumed([4], "A", 301), pauses=[Pause("A", 100, 300)])
    assert r.ok, r.text()
    assert r.late_completions == 1 and r.replayed == 1
    assert [t.kind for t in r.takeovers] == ["pause"] and r.takeovers[0].ms == 100


def test_a_resumed_consumer_going_on_with_a_queue_it_lost_is_a_violation(tmp_path: Path) -> None:
    r = run(tmp_path, 8, consumed([0, 1, 2, 3], "A", 10), consumed([3, 4, 5, 6, 7], "B", 200),
            consumed([4, 5, 6], "A", 301), pauses=[Pause("A", 100, 300)])
    assert not r.ok and r.late_completions == 1
    assert "offsets 5..7 consumed again by A after B (which did not crash)" in r.violations[0]


def test_a_resumed_consumer_may_replay_from_the_committed_offset(tmp_path: Path) -> None:
    # Nobody took over during the pause; A's lock lapsed, so it re-reads the committed offset (2) and replays.
    samples = {Q: [(50, 2), (150, 2), (350, 6)]}
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([2, 3, 4, 5], "A", 320),
            pauses=[Pause("A", 100, 300)], committed_samples=samples)
    assert r.ok, r.text()
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([1, 2, 3, 4, 5], "A", 320),
            pauses=[Pause("A", 100, 300)], committed_samples=samples)
    assert not r.ok and "below the committed floor 2" in r.violations[0]


def test_broker_crash_replay_from_the_persisted_offset(tmp_path: Path) -> None:
    # The broker had persisted 2 when it was killed at 100; A (alive) re-reads 2 after the restart.
    crash = BrokerCrash("b", 100, 150, {Q: 2})
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([2, 3, 4, 5], "B", 200), broker_crashes=[crash])
    assert r.ok, r.text()
    assert r.broker_replays == 1
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([1, 2, 3, 4, 5], "B", 200),
            broker_crashes=[crash])
    assert not r.ok and "below the offset it had persisted (2)" in r.violations[0]
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([2, 3, 4, 5], "B", 200))
    assert not r.ok  # without the crash it is a plain duplicate


def test_a_crash_after_a_broker_restart_uses_the_persisted_floor(tmp_path: Path) -> None:
    # B took the queue at 3 (A left gracefully); the broker restarted with 2 persisted; B crashed; C replays from 2.
    r = run(tmp_path, 8, consumed([0, 1, 2], "A", 10), consumed([3, 4, 5], "B", 100), consumed([2, 3, 4, 5, 6, 7],
            "C", 400), stops=[Stop("A", 50, graceful=True), Stop("B", 300, graceful=False)],
            broker_crashes=[BrokerCrash("b", 200, 250, {Q: 2})])
    assert r.ok, r.text()


def test_sampled_committed_offsets_raise_the_floor_and_must_not_go_back(tmp_path: Path) -> None:
    stop = [Stop("A", 200, graceful=False)]
    r = run(tmp_path, 8, consumed([0, 1, 2, 3, 4, 5], "A", 10), consumed([3, 4, 5, 6, 7], "B", 300), stops=stop,
            committed_samples={Q: [(100, 4)]})
    assert not r.ok and "below the committed floor 4" in r.violations[0]
    r = run(tmp_path, 8, consumed([0, 1, 2, 3, 4, 5], "A", 10), consumed([4, 5, 6, 7], "B", 300), stops=stop,
            committed_samples={Q: [(100, 4), (150, 3)]})
    assert not r.ok and r.offset_regressions and "went back from 4" in r.offset_regressions[0]
    r = run(tmp_path, 8, consumed([0, 1, 2, 3, 4, 5], "A", 10), consumed([2, 3, 4, 5, 6, 7], "B", 300), stops=stop,
            committed_samples={Q: [(100, 4), (250, 2)]}, broker_crashes=[BrokerCrash("b", 200, 220, {Q: 2})])
    assert r.ok, r.text()  # a restart reloads what was persisted: not a regression


def test_a_replay_handed_over_gracefully_continues(tmp_path: Path) -> None:
    r = run(tmp_path, 8, consumed([0, 1, 2, 3, 4, 5], "A", 10), consumed([3, 4], "B", 300),
            consumed([5, 6, 7], "C", 400), stops=[Stop("A", 200, graceful=False), Stop("B", 350, graceful=True)])
    assert r.ok, r.text()


def test_a_paused_consumer_starting_a_batch_after_its_lease_is_counted(tmp_path: Path) -> None:
    # A was paused at 100 (lease 50 ms: over at 150 at the latest); B took the queue over and consumed it from
    # 200 to 360. After SIGCONT at 300, A completes its in-flight offset 4 (a late completion, started before
    # the pause) and then starts offset 5 while B still holds the queue: started after its lease (issue 14).
    b = [{**r, "consume_time": 200 + 20 * i} for i, r in enumerate(consumed(list(range(3, 12)), "B", 0))]
    parts = (consumed([0, 1, 2, 3], "A", 10), b, consumed([4, 5], "A", 301))
    r = run(tmp_path, 12, *parts, pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.late_completions == 1 and r.started_after_lease == 1
    assert any("after its lease ran out" in v for v in r.violations)
    assert "started after lease: 1" in r.text()
    r = run(tmp_path, 12, *parts[:2], consumed([4], "A", 301), pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.started_after_lease == 0 and r.ok, r.text()  # the late completion alone is allowed


def test_a_paused_consumer_given_its_queue_back_cleanly_is_not_counted(tmp_path: Path) -> None:
    # After its pause A rejoined; B handed the queue back (A continues at B's frontier) and later took it again
    # (B continues at A's): ownership moved back and forth without overlap, nothing started after a lease.
    b1 = [{**r, "consume_time": 200 + i} for i, r in enumerate(consumed([4, 5, 6], "B", 0))]
    a2 = [{**r, "consume_time": 400 + i} for i, r in enumerate(consumed([7, 8], "A", 0))]
    b2 = [{**r, "consume_time": 500 + i} for i, r in enumerate(consumed([9, 10, 11], "B", 0))]
    r = run(tmp_path, 12, consumed([0, 1, 2, 3], "A", 10), b1 + b2, a2, pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.ok and r.started_after_lease == 0, r.text()


def test_a_resumed_consumer_replaying_on_a_promoted_master_after_the_holders_buffered_records_is_not_counted(
        tmp_path: Path) -> None:
    # Long ASYNC seed 24: A was paused 100-1000 (lease 50); B took the queue at 200 and consumed 4..9; its master was
    # killed at 300 and B went on with what it had pulled until 500; the promoted slave served from 800 with the
    # committed offset 4 of its stale table, granted the queue to A after its restart grace, and A replayed 4..6 at
    # 1100. The broker was down between B's last record and A's replay: no sign that B still held the queue.
    b = [{**r, "consume_time": 200 + 60 * i} for i, r in enumerate(consumed([4, 5, 6, 7, 8, 9], "B", 0))]
    a = [{**r, "consume_time": 1100 + i} for i, r in enumerate(consumed([4, 5, 6], "A", 0))]
    parts = (consumed([0, 1, 2, 3], "A", 10), b, a)
    crash = BrokerCrash("b", 300, 800, {Q: 4})
    r = run(tmp_path, 10, *parts, pauses=[Pause("A", 100, 1000)], lease_ms=50, broker_crashes=[crash])
    assert r.started_after_lease == 0, r.text()
    # the same replay with the broker back before B's last record: B may still hold the queue
    r = run(tmp_path, 10, *parts, pauses=[Pause("A", 100, 1000)], lease_ms=50,
            broker_crashes=[BrokerCrash("b", 150, 190, {Q: 4})])
    assert r.started_after_lease == 2, r.text()  # 5 and 6 (4 completes the call begun before the pause)


# --- key scope (issue 17): queues a key-scope consumer consumed are judged per key --------------------------


def keyed(offsets: list[int], client: str, t0: int) -> list[dict[str, Any]]:
    return [{**r, "keys": f"k{r['queue_offset'] % 2}"} for r in consumed(offsets, client, t0)]


def test_key_scope_records_are_in_order_per_key_not_per_queue(tmp_path: Path) -> None:
    # keys k0 (even offsets) and k1 (odd): K consumes k1's messages ahead of k0's, each key in order
    recs = keyed([1, 3, 0, 5, 2, 4, 7, 6], "K", 10)
    assert not run(tmp_path, 8, recs).ok  # as a queue-scope consumer: out of order
    r = run(tmp_path, 8, recs, key_scope_clients=["K"])
    assert r.ok, r.text()
    bad = keyed([1, 0, 2, 5, 3, 4, 6, 7], "K", 10)  # k1: 5 before 3
    r = run(tmp_path, 8, bad, key_scope_clients=["K"])
    assert not r.ok and r.first_offending_key == "k1"


def test_after_a_key_scope_owner_the_next_one_replays_from_the_committed_prefix(tmp_path: Path) -> None:
    # K (key scope) consumed 0, 1, 3, 5 (k1 ran ahead) and committed the prefix 2; it leaves gracefully, B starts from
    # 2 and consumes 3 and 5 again: allowed replays, as after a crash
    samples = {Q: [(50, 2)]}
    r = run(tmp_path, 8, keyed([0, 1, 3, 5], "K", 10), keyed([2, 3, 4, 5, 6, 7], "B", 200),
            stops=[Stop("K", 100, graceful=True)], committed_samples=samples, key_scope_clients=["K"])
    assert r.ok, r.text()
    assert r.duplicates == 2 and r.replayed == 2
    # a replay below the committed prefix is still a violation
    r = run(tmp_path, 8, keyed([0, 1, 2, 3, 5], "K", 10), keyed([1, 2, 3, 4, 5, 6, 7], "B", 200),
            stops=[Stop("K", 100, graceful=True)], committed_samples={Q: [(50, 3)]}, key_scope_clients=["K"])
    assert not r.ok and any("below the committed floor 3" in v for v in r.violations), r.text()


def test_key_scope_late_completions_are_counted_per_key(tmp_path: Path) -> None:
    # K was paused with one batch of each key in its listener (4 and 5); B took over from 2; after SIGCONT K's two
    # batches complete: one late completion per key
    r = run(tmp_path, 8, keyed([0, 1, 2, 3], "K", 10), keyed([2, 3, 4, 5, 6, 7], "B", 200),
            keyed([4, 5], "K", 301), pauses=[Pause("K", 100, 300)], key_scope_clients=["K"], lease_ms=50)
    assert r.ok, r.text()
    assert r.late_completions == 2 and r.started_after_lease == 0


def test_another_consumers_late_completion_is_no_sign_it_holds_the_queue(tmp_path: Path) -> None:
    # B (paused 100-300) took the queue back at 1000 from 4 while A, paused at 500 with offset 4 in its listener,
    # finished it at 1101, after SIGCONT: A's late completion, not A holding the queue while B consumed 5..7
    # (chaos seed 12 flagged B's records as started after its lease)
    r = run(tmp_path, 8, consumed([0, 1, 2, 3], "A", 10), consumed([4, 5, 6, 7], "B", 1000),
            consumed([4], "A", 1101), pauses=[Pause("B", 100, 300), Pause("A", 500, 1100)], lease_ms=500)
    assert r.late_completions == 1 and r.started_after_lease == 0, r.text()


def test_a_listener_call_begun_before_the_pause_is_judged_by_its_start(tmp_path: Path) -> None:
    # K (key scope) had just taken the queue: it began k0's offset 0 and k1's offset 1 at 60 and was paused at 100;
    # B took over from 0 and consumed 0..7; after SIGCONT (300) K's two calls returned. Their records carry
    # start_time 60: late completions, nothing started after the lease. Without start_time nothing tells them
    # from calls begun after SIGCONT (chaos seed 11 flagged such a record 4 ms after SIGCONT).
    late = [{**r, "start_time": 60} for r in keyed([0, 1], "K", 301)]
    parts = (keyed(list(range(8)), "B", 200), late)
    r = run(tmp_path, 8, *parts, pauses=[Pause("K", 100, 300)], key_scope_clients=["K"], lease_ms=50)
    assert r.ok, r.text()
    assert r.late_completions == 2 and r.started_after_lease == 0
    unstamped = [{k: v for k, v in x.items() if k != "start_time"} for x in late]
    r = run(tmp_path, 8, parts[0], unstamped, pauses=[Pause("K", 100, 300)], key_scope_clients=["K"], lease_ms=50)
    assert not r.ok and r.started_after_lease == 2
    # a call K began after SIGCONT while B held the queue is still counted
    begun_late = [{**r, "start_time": 301} for r in keyed([0, 1], "K", 305)]
    r = run(tmp_path, 8, parts[0], begun_late, pauses=[Pause("K", 100, 300)], key_scope_clients=["K"], lease_ms=50)
    assert r.started_after_lease == 2 and r.late_completions == 0


def test_a_consumer_given_the_queue_again_then_replayed_after_is_not_counted(tmp_path: Path) -> None:
    # Long ASYNC seed 22: A was paused 100-300 (lease 50); B consumed 4..5 at 200; A took the queue again long after
    # SIGCONT and consumed 6..9 at 500; then B got it back and replayed 9 (A's last, not committed yet) at 530.
    b1 = [{**r, "consume_time": 200 + i} for i, r in enumerate(consumed([4, 5], "B", 0))]
    a2 = [{**r, "consume_time": 500 + i} for i, r in enumerate(consumed([6, 7, 8, 9], "A", 0))]
    b2 = [{**r, "consume_time": 530 + i} for i, r in enumerate(consumed([9, 10, 11], "B", 0))]
    r = run(tmp_path, 12, consumed([0, 1, 2, 3], "A", 10), b1 + b2, a2, pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.started_after_lease == 0, r.text()


def test_a_key_scope_consumer_given_the_queue_again_then_replayed_after_is_not_counted(tmp_path: Path) -> None:
    # Long seed 11: K (key scope) was paused 100-300 (lease 50); B consumed 0..3 at 400; K took the queue again at
    # B's frontier and consumed 4..7 at 500 (offsets out of order: per key); it gave the queue back and B replayed
    # 6..7 from K's committed prefix at 520, within a lease of K's records but after K's last one.
    b1 = keyed([0, 1, 2, 3], "B", 400)
    k2 = [{**r, "start_time": 499} for r in keyed([5, 4, 7, 6], "K", 500)]
    b2 = keyed([6, 7], "B", 520)
    r = run(tmp_path, 8, keyed([0], "K", 10), b1 + b2, k2, pauses=[Pause("K", 100, 300)], key_scope_clients=["K"],
            lease_ms=50)
    assert r.started_after_lease == 0, r.text()
    # B consuming while K still does is a sign it held the queue
    b2_during = [{**x, "consume_time": 501} for x in b2]
    r = run(tmp_path, 8, keyed([0], "K", 10), b1 + b2_during, k2, pauses=[Pause("K", 100, 300)],
            key_scope_clients=["K"], lease_ms=50)
    assert r.started_after_lease > 0


def test_a_queue_with_nothing_left_to_consume_is_an_idle_takeover(tmp_path: Path) -> None:
    # A consumed every acknowledged message of the queue (0..3) and was paused; nothing more arrived there, so no
    # takeover can be seen (chaos seed 11: the producer's last seconds all went to the other broker)
    r = run(tmp_path, 4, consumed([0, 1, 2, 3], "A", 10), pauses=[Pause("A", 100, 300)])
    assert r.ok, r.text()
    assert [(t.ms, t.idle) for t in r.takeovers] == [(None, True)] and "q0=idle" in r.text()
    assert r.max_takeover_ms(graceful=False) is None and r.takeover_ms(graceful=False) == []
    # with a message left behind, a missing takeover is not idle
    r = run(tmp_path, 5, consumed([0, 1, 2, 3], "A", 10), consumed([4], "A", 310), pauses=[Pause("A", 100, 300)])
    assert [(t.ms, t.idle) for t in r.takeovers] == [(None, False)]


def test_a_call_stamped_at_sigcont_continuing_where_it_stopped_is_a_late_completion(tmp_path: Path) -> None:
    # A checked its lease and was stopped before its listener began: the call for offset 4 is stamped at SIGCONT
    # (chaos seed 14). It continues exactly where A stopped, so it is the late completion the rule allows.
    b = [{**r, "consume_time": 200 + 20 * i} for i, r in enumerate(consumed(list(range(3, 12)), "B", 0))]
    a = [{**r, "start_time": 300} for r in consumed([4], "A", 300)]
    r = run(tmp_path, 12, consumed([0, 1, 2, 3], "A", 10), b, a, pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.ok and r.late_completions == 1 and r.started_after_lease == 0, r.text()


def test_a_queue_scope_late_completion_on_a_queue_judged_per_key_follows_queue_order(tmp_path: Path) -> None:
    # A (queue scope) consumed 0..4, replayed 3 after a broker restart and was paused with 4 in its listener; K (key
    # scope) took over; A's call for 4 returned after SIGCONT. In queue order it continues where A stopped (3 -> 4):
    # a late completion, although A's last record of key k0 before the pause was 4 itself (chaos seed 14)
    crash = BrokerCrash("b", 20, 30, {Q: 3})
    a = consumed([0, 1, 2, 3, 4], "A", 10) + consumed([3], "A", 40)
    late = [{**r, "start_time": 300} for r in keyed([4], "A", 301)]
    r = run(tmp_path, 8, a, keyed([4, 5, 6, 7], "K", 200), late, pauses=[Pause("A", 100, 300)],
            broker_crashes=[crash], key_scope_clients=["K"], lease_ms=50)
    assert r.ok, r.text()
    assert r.late_completions == 1 and r.started_after_lease == 0


def test_a_broker_restart_in_between_is_no_sign_the_other_consumer_still_held_the_queue(tmp_path: Path) -> None:
    # A was paused (100-300); B took over and consumed up to 7; the broker restarted at 170 (persisted offset 5), which
    # forgets its locks; A resumed, locked the queue and replayed from 5 at 400 (chaos seed 22). B's records before the
    # restart prove nothing about who held the queue after it.
    b = [{**r, "consume_time": 150 + i} for i, r in enumerate(consumed([3, 4, 5, 6, 7], "B", 0))]
    a2 = [{**r, "start_time": 400} for r in consumed([5, 6, 7], "A", 400)]
    r = run(tmp_path, 8, consumed([0, 1, 2, 3], "A", 10), b, a2, pauses=[Pause("A", 100, 300)],
            broker_crashes=[BrokerCrash("b", 170, 180, {Q: 5})], lease_ms=50)
    assert r.ok and r.started_after_lease == 0, r.text()
    # without the restart, the same records are a start after the lease (and a replay nobody allowed)
    r = run(tmp_path, 8, consumed([0, 1, 2, 3], "A", 10), b, a2, pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.started_after_lease == 3 and not r.ok


def test_a_consumer_resuming_its_queue_after_a_broker_restart_in_its_pause_is_its_next_owner(tmp_path: Path) -> None:
    # A consumed 0..3 and was paused at 100; the queue's broker was killed at 150 and served again from 200, its
    # restart grace holding the queue for the lease; A came back at 300 and, first to lock it, went on from 4
    # (chaos seed 24: "never consumed again" although it was). Without the broker's restart it stays a failure.
    parts = (consumed([0, 1, 2, 3], "A", 10), consumed([4, 5], "A", 320))
    r = run(tmp_path, 6, *parts, pauses=[Pause("A", 100, 300)], broker_crashes=[BrokerCrash("b", 150, 200, {Q: 4})])
    assert r.ok, r.text()
    assert [(t.new_owner, t.ms, t.resumed) for t in r.takeovers] == [("A", 220, True)] and "q0=220 resumed" in r.text()
    r = run(tmp_path, 6, *parts, pauses=[Pause("A", 100, 300)])
    assert [(t.ms, t.idle, t.resumed) for t in r.takeovers] == [(None, False, False)]
    # nor when the broker was killed just before the pause and served again (a promotion) during it
    r = run(tmp_path, 6, *parts, pauses=[Pause("A", 100, 300)], broker_crashes=[BrokerCrash("b", 90, 200, {Q: 4})])
    assert [(t.new_owner, t.resumed) for t in r.takeovers] == [("A", True)], r.text()
    # a broker restart after SIGCONT does not count
    r = run(tmp_path, 6, *parts, pauses=[Pause("A", 100, 300)], broker_crashes=[BrokerCrash("b", 310, 315, {Q: 4})])
    assert [(t.ms, t.resumed) for t in r.takeovers] == [(None, False)]


def test_a_consumer_resuming_its_queue_first_is_its_next_owner_though_another_gets_it_later(tmp_path: Path) -> None:
    # Long ASYNC seed 215: A was paused at 100 while its queue's broker restarted (150-200); A came back at 300, was
    # the first to lock the queue and went on from 4; B got the queue seconds later in a rebalance. The takeover of
    # A's pause is A's own resumption (220 ms), not B's later record (reported as an 11.5 s takeover before).
    parts = (consumed([0, 1, 2, 3], "A", 10), consumed([4, 5], "A", 320),
             [{**r, "start_time": 5000} for r in consumed([6, 7], "B", 5000)])
    r = run(tmp_path, 8, *parts, pauses=[Pause("A", 100, 300)], broker_crashes=[BrokerCrash("b", 150, 200, {Q: 4})])
    assert r.ok, r.text()
    assert [(t.new_owner, t.ms, t.resumed) for t in r.takeovers] == [("A", 220, True)], r.text()
    # without the broker's restart A could not have been the first owner after its pause: B's record is the takeover
    r = run(tmp_path, 8, *parts, pauses=[Pause("A", 100, 300)])
    assert [(t.new_owner, t.ms, t.resumed) for t in r.takeovers] == [("B", 4900, False)], r.text()


def test_an_async_failover_may_lose_the_tail_past_what_the_slave_had_and_nothing_else(tmp_path: Path) -> None:
    # b's ASYNC master stored m0..m5 at commit-log offsets 0, 100, ..., 500 and was killed at 50 after
    # acknowledging them all; its slave had 0..299 (kept = 300). m3..m5 went with the master; the promoted
    # slave gave queue offsets 3.. to m6, m7. A consumer read m0..m4 from the old master, then was moved back
    # (PULL_OFFSET_MOVED, or the committed offset the promotion clamped): a replay from the new master's floor.
    from tests.e2e.checker import AsyncFailover
    from trimq.protocol.record import message_id

    recs = produced(8)
    for i, rec in enumerate(recs):
        rec["offset_msg_id"] = message_id(("127.0.0.1", 10911), i * 100 if i < 6 else 300 + (i - 6) * 100)
        rec["ack_time"] = 40 if i < 6 else 60
        if i >= 6:
            rec["queue_offset"] = i - 3
    write(tmp_path / "p.jsonl", recs)
    moved_back = [{**c, "queue_offset": o - 3 if o >= 6 else o} for c, o in
                  zip(consumed([6, 7], "A", 70), [6, 7], strict=True)]
    c = write(tmp_path / "c.jsonl", consumed([0, 1, 2, 3, 4], "A", 10) + moved_back)
    failover = [AsyncFailover("b", 50, 300)]
    crash = [BrokerCrash("b", 50, 55, {Q: 3})]  # the promoted master serves offset 3 (clamped to its queue's end)
    r = check([tmp_path / "p.jsonl"], [c], async_failovers=failover, broker_crashes=crash)
    assert r.ok, r.text()
    assert (r.unsafe_acked, r.unsafe_lost, r.produced, r.consumed_cut) == (3, 3, 5, 2)  # m3, m4 read, then cut
    # without the failover, the same history is a loss of acknowledged messages
    assert not check([tmp_path / "p.jsonl"], [c], broker_crashes=crash).ok
    # and a message the slave had (m2, below kept) must still be consumed
    c2 = write(tmp_path / "c2.jsonl", consumed([0, 1], "A", 10) + moved_back)
    r2 = check([tmp_path / "p.jsonl"], [c2], async_failovers=failover, broker_crashes=crash)
    assert [m["msg_id"] for m in r2.missing] == ["m2"], r2.text()


def test_an_answer_of_the_dying_master_that_arrives_after_the_kill_is_still_its_tail(tmp_path: Path) -> None:
    """Long ASYNC seed 13: the killed master's SEND_OK for a message past ``kept`` reached the producer 5 ms after
    the harness's kill timestamp. Stored by the old master (its address in the offset message id) and acknowledged
    before the promotion, it is in the tail the failover may lose; the new master's messages are not."""
    from tests.e2e.checker import AsyncFailover
    from trimq.protocol.record import message_id

    recs = produced(8)
    for i, rec in enumerate(recs):
        old = i < 6
        rec["offset_msg_id"] = message_id(("127.0.0.1", 10911 if old else 10921),
                                          i * 100 if old else 300 + (i - 6) * 100)
        rec["ack_time"] = (40 if i < 5 else 52) if old else 60
        if not old:
            rec["queue_offset"] = i - 3
    write(tmp_path / "p.jsonl", recs)
    moved_back = [{**c, "queue_offset": o - 3} for c, o in zip(consumed([6, 7], "A", 70), [6, 7], strict=True)]
    c = write(tmp_path / "c.jsonl", consumed([0, 1, 2], "A", 10) + moved_back)
    crash = [BrokerCrash("b", 50, 55, {Q: 3})]
    failover = [AsyncFailover("b", 50, 300, "127.0.0.1:10911", 55)]
    r = check([tmp_path / "p.jsonl"], [c], async_failovers=failover, broker_crashes=crash)
    assert r.ok, r.text()
    assert (r.unsafe_acked, r.unsafe_lost) == (3, 3)  # m3, m4 and the late-answered m5
    # by the kill's timestamp alone, m5 (answered at 52) was a SEND_OK whose offset m7 took
    assert not check([tmp_path / "p.jsonl"], [c], async_failovers=[AsyncFailover("b", 50, 300)],
                     broker_crashes=crash).ok
    # the new master's messages (another address, past kept) must be consumed
    c2 = write(tmp_path / "c2.jsonl", consumed([0, 1, 2], "A", 10) + moved_back[:1])
    r2 = check([tmp_path / "p.jsonl"], [c2], async_failovers=failover, broker_crashes=crash)
    assert [m["msg_id"] for m in r2.missing] == ["m7"], r2.text()


def test_a_tail_message_whose_offset_an_unanswered_send_took_is_no_part_of_the_queue(tmp_path: Path) -> None:
    """Long ASYNC seed 79: the old master's m3..m5 went with it (kept = 300); the new master gave offset 3 to m6, offset
    4 to a send it stored but never answered (so the producer has no record of it) and offset 5 to m7. A read m0..m5
    from the old master before the failover, then the new log from 3. m4, with no acknowledged message at its offset,
    was judged as the queue's offset 4, read before the acknowledged m6 at 3."""
    from tests.e2e.checker import AsyncFailover
    from trimq.protocol.record import message_id

    recs = produced(8)
    for i, rec in enumerate(recs):
        old = i < 6
        rec["offset_msg_id"] = message_id(("127.0.0.1", 10911 if old else 10921),
                                          i * 100 if old else 300 + (i - 6) * 200)
        rec["ack_time"] = 40 if old else 60
        if not old:
            rec["queue_offset"] = 3 if i == 6 else 5
    write(tmp_path / "p.jsonl", recs)
    new_log = [{**c, "queue_offset": o, "msg_id": mid} for c, o, mid in
               zip(consumed([3, 4, 5], "A", 70), [3, 4, 5], ["m6", "unanswered", "m7"], strict=True)]
    c = write(tmp_path / "c.jsonl", consumed([0, 1, 2, 3, 4, 5], "A", 10) + new_log)
    failover = [AsyncFailover("b", 50, 300, "127.0.0.1:10911", 55)]
    r = check([tmp_path / "p.jsonl"], [c], async_failovers=failover, broker_crashes=[BrokerCrash("b", 50, 55, {Q: 3})])
    assert r.ok, r.text()
    assert (r.unsafe_acked, r.unsafe_lost, r.tail_read, r.produced, r.consumed_cut) == (3, 2, 1, 5, 3)


def test_a_replay_after_two_broker_crashes_follows_the_lower_floor(tmp_path: Path) -> None:
    """Long ASYNC seed 76: the broker restarted having persisted 2, then failed over to a promoted slave that had no
    offset for the queue (its metadata sync had not run yet): the holder replays from 0, as the second allows."""
    crashes = [BrokerCrash("b", 100, 150, {Q: 2}), BrokerCrash("b", 200, 250, {})]
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([0, 1, 2, 3, 4, 5], "A", 300),
            broker_crashes=crashes)
    assert r.ok, r.text()
    assert r.broker_replays == 1
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 10), consumed([0, 1, 2, 3, 4, 5], "A", 300),
            broker_crashes=crashes[:1])
    assert not r.ok and "below the offset it had persisted (2)" in r.violations[0]  # the first crash alone


def test_a_listener_call_spanning_a_broker_crash_explains_the_successors_replay(tmp_path: Path) -> None:
    # Long ASYNC seed 180: A, resumed after its pause and owner again, began a listener call for offset 7 at 330; the
    # queue's broker was killed at 350 and its promoted slave served from 390, without A's lock and with the offset
    # A had committed (7). A's call returned at 500; B, granted the queue by the new master, replayed 7 at 510, and A
    # took the queue back later. The crash inside A's call explains B's replay: nobody started after a lease.
    a1 = consumed([0, 1, 2, 3], "A", 10)
    b1 = [{**r, "consume_time": 150 + i} for i, r in enumerate(consumed([4, 5], "B", 0))]
    a2 = [*consumed([6], "A", 320), {**consumed([7], "A", 500)[0], "start_time": 330}]
    b2 = [{**r, "consume_time": 510 + i} for i, r in enumerate(consumed([7, 8, 9], "B", 0))]
    a3 = consumed([10, 11], "A", 540)
    r = run(tmp_path, 12, a1 + a2 + a3, b1 + b2, pauses=[Pause("A", 100, 300)],
            broker_crashes=[BrokerCrash("b", 350, 390, {Q: 7})], lease_ms=50)
    assert r.ok and r.started_after_lease == 0, r.text()
    # without the crash, the same records are a start after the lease
    r = run(tmp_path, 12, a1 + a2 + a3, b1 + b2, pauses=[Pause("A", 100, 300)], lease_ms=50)
    assert r.started_after_lease >= 1 and not r.ok


def test_another_paused_consumers_late_completion_is_no_takeover(tmp_path: Path) -> None:
    # Long ASYNC seed 215: K (key scope) began a call for 6 at 25 and was paused 26-150; A took the queue back and
    # consumed 6..9; K's call returned at 151, during A's own pause (100-300). Nobody else took the queue from A, and A
    # went on from 10 after SIGCONT in a call begun then. K's late completion, begun before A's pause, is no sign
    # that someone took A's queue over, so A's 10 is no late completion: it was left out of the walk, and key k0 read
    # "consumed 12 before acknowledged offset(s) from 10".
    k_late = [{**r, "start_time": 25} for r in keyed([6], "K", 151)]
    a_after = [{**r, "start_time": 310} for r in keyed(list(range(10, 16)), "A", 310)]
    r = run(tmp_path, 16, keyed([0, 1, 2, 3], "A", 10) + keyed([6, 7, 8, 9], "A", 60) + a_after,
            keyed([4, 5], "K", 20) + k_late, pauses=[Pause("K", 26, 150), Pause("A", 100, 300)],
            key_scope_clients=["K"], lease_ms=20)
    assert r.ok, r.text()
    assert r.late_completions == 1 and r.started_after_lease == 0, r.text()  # K's own, begun before its pause
    # and no takeover of A's queue is measured from K's record: nobody took it over
    assert [(t.client_id, t.new_owner, t.ms) for t in r.takeovers if t.client_id == "A"] == [("A", None, None)]
