"""ConsumerOffsetManager: deterministic start, fencing against the real lock manager, RocketMQ's file layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from trimq.broker.locks import RebalanceLockManager
from trimq.broker.store.offsets import ConsumerOffsetManager, OffsetStoreError, QueueProgress, offset_file_path
from trimq.protocol.message_queue import MessageQueue

G = "order_group"
T = "TopicA"


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class TinyStore:
    """Answers the two store questions consume progress asks (max offset, store time of an offset)."""

    def __init__(self, max_offsets: dict[int, int]) -> None:
        self.max_offsets = max_offsets

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.max_offsets.get(queue_id, 0)

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        return 1_000 + queue_offset


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def locks(clock: FakeClock) -> RebalanceLockManager:
    return RebalanceLockManager(max_live_ms=60_000, now_ms=clock)


@pytest.fixture
def om(clock: FakeClock, locks: RebalanceLockManager) -> ConsumerOffsetManager:
    return ConsumerOffsetManager(None, broker_name="broker-a", lock_manager=locks,
                                 is_orderly=lambda g: g == G, now_ms=clock)


def mq(qid: int) -> MessageQueue:
    return MessageQueue(T, "broker-a", qid)


def test_no_stored_offset_is_always_minus_one(om: ConsumerOffsetManager) -> None:
    assert om.query_offset(G, T, 0) == -1
    om.commit_offset(G, T, 1, 5, "c1", source="update")
    assert om.query_offset(G, T, 0) == -1  # a sibling queue's offset does not make this one known
    assert om.query_offset("other", T, 1) == -1


def test_commit_and_query(om: ConsumerOffsetManager, clock: FakeClock) -> None:
    assert om.commit_offset(G, T, 0, 42, "c1", source="update")
    assert om.query_offset(G, T, 0) == 42
    assert om.last_update_timestamp(G, T, 0) == clock.now
    assert om.commit_offset(G, T, 0, 7, "c1", source="update")  # rewinding is allowed, as in RocketMQ
    assert om.query_offset(G, T, 0) == 7
    assert om.applied_updates == 2
    assert om.topics_of_group(G) == [T]
    assert om.groups_of_topic(T) == [G]
    assert om.queue_offsets(G, T) == {0: 7}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_bad_offsets_are_refused(om: ConsumerOffsetManager, bad: object) -> None:
    with pytest.raises(ValueError, match="offset must be a non-negative integer"):
        om.commit_offset(G, T, 0, bad, "c1", source="update")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        om.reset_offset(G, T, 0, bad)  # type: ignore[arg-type]


def test_fenced_update_is_refused_and_counted(om: ConsumerOffsetManager, locks: RebalanceLockManager) -> None:
    assert locks.try_lock(G, mq(0), "owner")
    om.commit_offset(G, T, 0, 10, "owner", source="update")
    assert om.fencing_owner(G, T, 0, "paused") == "owner"
    assert not om.commit_offset(G, T, 0, 3, "paused", source="update")
    assert not om.commit_offset(G, T, 0, 3, None, source="pull")  # anonymous: not the owner either
    assert om.query_offset(G, T, 0) == 10
    assert om.fenced_updates[G] == 2
    assert om.commit_offset(G, T, 0, 11, "owner", source="update")
    assert om.query_offset(G, T, 0) == 11
    # a queue nobody holds accepts anyone's update
    assert om.commit_offset(G, T, 1, 4, "paused", source="update")


def test_fencing_does_not_renew_the_lock(om: ConsumerOffsetManager, locks: RebalanceLockManager,
                                         clock: FakeClock) -> None:
    locks.try_lock(G, mq(0), "owner")
    clock.now += 60_000
    assert not om.commit_offset(G, T, 0, 1, "paused", source="update")
    clock.now += 1  # the owner's lock lapses: a check must not have renewed it, so another client can take it
    assert locks.try_lock_detailed(G, mq(0), "next").name == "STOLEN"
    assert om.commit_offset(G, T, 0, 1, "next", source="update")
    assert om.fenced_updates[G] == 1


def test_between_owners_only_the_last_holder_may_commit(om: ConsumerOffsetManager, locks: RebalanceLockManager,
                                                        clock: FakeClock) -> None:
    # Found by the chaos suite: c3 released a queue gracefully (committing 1799) and, before its next owner
    # locked it, a consumer resuming from SIGSTOP persisted its stale 1484 — accepted, since nobody held a live
    # lock — and the next owner consumed 1484..1798 again.
    assert om.commit_offset(G, T, 0, 5, "anyone", source="update")  # never locked: anyone may
    locks.try_lock(G, mq(0), "c3")
    assert om.commit_offset(G, T, 0, 1799, "c3", source="update")
    locks.unlock_batch(G, [mq(0)], "c3")
    assert not om.commit_offset(G, T, 0, 1484, "zombie", source="update")
    assert not om.commit_offset(G, T, 0, 1484, "zombie", source="pull")
    assert om.query_offset(G, T, 0) == 1799 and om.fenced_updates[G] == 2
    assert om.commit_offset(G, T, 0, 1800, "c3", source="update")  # the last holder still may (late persist)
    locks.try_lock(G, mq(0), "c1")  # the next owner locks first, then commits
    assert om.commit_offset(G, T, 0, 1810, "c1", source="update")
    clock.now += 120_000  # its lock lapses: still c1's offset until someone else locks the queue
    assert not om.commit_offset(G, T, 0, 3, "c3", source="update")
    assert om.commit_offset(G, T, 0, 1811, "c1", source="update")


def test_not_orderly_groups_are_not_fenced(om: ConsumerOffsetManager, locks: RebalanceLockManager) -> None:
    locks.try_lock("concurrent_group", mq(0), "owner")
    assert om.commit_offset("concurrent_group", T, 0, 1, "other", source="update")
    assert ConsumerOffsetManager(None).commit_offset(G, T, 0, 1, "x", source="update")  # no lock manager


def test_fencing_uses_this_brokers_name(locks: RebalanceLockManager) -> None:
    om = ConsumerOffsetManager(None, broker_name="broker-b", lock_manager=locks, is_orderly=lambda g: True)
    locks.try_lock(G, mq(0), "owner")  # broker-a's queue 0 is not broker-b's
    assert om.commit_offset(G, T, 0, 1, "other", source="update")
    locks.try_lock(G, MessageQueue(T, "broker-b", 0), "owner")
    assert not om.commit_offset(G, T, 0, 2, "other", source="update")


def test_fenced_updates_are_logged_rate_limited(locks: RebalanceLockManager, clock: FakeClock) -> None:
    om = ConsumerOffsetManager(None, lock_manager=locks, is_orderly=lambda g: True, now_ms=clock,
                               fenced_log_interval_ms=10_000)
    locks.try_lock(G, mq(0), "owner")
    with capture_logs() as logs:
        for _ in range(5):
            om.commit_offset(G, T, 0, 1, "paused", source="update")
        clock.now += 10_000  # one log interval later; the lock (same clock) is still live
        om.commit_offset(G, T, 0, 1, "paused", source="pull")
    fenced = [e for e in logs if e["event"] == "offset.fenced"]
    assert [(e["suppressed"], e["source"], e["owner"], e["log_level"]) for e in fenced] == [
        (0, "update", "owner", "warning"), (4, "pull", "owner", "warning")]
    assert fenced[-1]["fenced_total"] == 6


def test_reset_offset_ignores_locks(om: ConsumerOffsetManager, locks: RebalanceLockManager) -> None:
    locks.try_lock(G, mq(0), "owner")
    om.reset_offset(G, T, 0, 99)
    assert om.query_offset(G, T, 0) == 99
    assert om.fenced_updates[G] == 0


def test_remove_offsets(om: ConsumerOffsetManager) -> None:
    om.commit_offset(G, T, 0, 1, "c", source="update")
    om.commit_offset(G, "TopicB", 0, 1, "c", source="update")
    om.commit_offset("g2", T, 0, 1, "c", source="update")
    assert om.remove_offsets(G, "TopicB") == 1
    assert om.remove_offsets(G) == 1
    assert om.topics_of_group(G) == [] and om.groups_of_topic(T) == ["g2"]


def test_progress_with_and_without_a_store(om: ConsumerOffsetManager, clock: FakeClock) -> None:
    om.commit_offset(G, T, 1, 30, "c", source="update")
    om.commit_offset(G, T, 5, 2, "c", source="update")  # a queue outside the configured range still shows
    store = TinyStore({0: 10, 1: 40, 5: 1})
    rows = om.progress(G, T, range(2), store)
    assert rows == [
        QueueProgress(T, 0, 10, -1, 10, 0, 0),
        QueueProgress(T, 1, 40, 30, 10, 1_029, clock.now),
        QueueProgress(T, 5, 1, 2, 0, 1_001, clock.now),
    ]
    assert [(r.broker_offset, r.lag, r.last_timestamp) for r in om.progress(G, T, range(2))] == [
        (-1, -1, 0), (-1, -1, 0), (-1, -1, 0)]


# ------------------------------------------------------------------------------------------------ persistence


def test_file_layout_is_rocketmqs(tmp_path: Path) -> None:
    path = offset_file_path(str(tmp_path))
    assert path == str(tmp_path / "config" / "consumerOffset.json")
    om = ConsumerOffsetManager(path)
    assert not om.dirty and not om.persist()
    om.commit_offset(G, T, 0, 12, "c", source="update")
    om.commit_offset(G, T, 10, 3, "c", source="update")
    om.commit_offset("g2", "%RETRY%g2", 0, 1, "c", source="update")
    assert om.dirty
    assert om.persist()
    assert not om.dirty and not om.persist()
    doc = json.loads(Path(path).read_text())
    assert doc["offsetTable"] == {"TopicA@order_group": {"0": 12, "10": 3}, "%RETRY%g2@g2": {"0": 1}}
    # plus the commit versions (issue 15), which RocketMQ ignores
    assert set(doc) == {"offsetTable", "commitVersionTable"}
    assert set(doc["commitVersionTable"]["TopicA@order_group"]) == {"0", "10"}
    assert not list(Path(path).parent.glob("*.tmp"))

    again = ConsumerOffsetManager(path)
    assert again.load() == 3
    assert again.query_offset(G, T, 10) == 3
    assert again.query_offset("g2", "%RETRY%g2", 0) == 1
    assert not again.dirty


def test_snapshot_then_later_update_stays_dirty(tmp_path: Path) -> None:
    om = ConsumerOffsetManager(offset_file_path(str(tmp_path)))
    om.commit_offset(G, T, 0, 1, "c", source="update")
    version, data = om.snapshot()
    om.commit_offset(G, T, 0, 2, "c", source="update")  # lands while the snapshot is being written
    om.mark_persisted(version)
    assert om.dirty
    assert data["offsetTable"] == {"TopicA@order_group": {"0": 1}}


def test_load_missing_file_is_empty(tmp_path: Path) -> None:
    om = ConsumerOffsetManager(offset_file_path(str(tmp_path)))
    assert om.load() == 0
    assert ConsumerOffsetManager(None).load() == 0


def test_load_reads_a_rocketmq_file_and_skips_bad_entries(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(json.dumps({"offsetTable": {
        "TopicTest@please_rename_unique_group_name_4": {"0": 250, "1": 249, "2": 250, "3": 250},
        "no-separator": {"0": 1},
        "T@g": {"x": 1, "1": -5, "2": "7", "3": 8},
    }}))
    om = ConsumerOffsetManager(str(path))
    with capture_logs() as logs:
        assert om.load() == 5
    assert om.query_offset("please_rename_unique_group_name_4", "TopicTest", 1) == 249
    assert om.queue_offsets("g", "T") == {3: 8}
    assert sum(e["event"] == "offset.load_skipped" for e in logs) == 4


@pytest.mark.parametrize(("content", "error"), [
    ("{not json", ValueError),
    ('["offsetTable"]', OffsetStoreError),
    ('{"offsetTable": []}', OffsetStoreError),
    ("{}", OffsetStoreError),
])
def test_load_refuses_a_file_that_is_not_an_offset_table(tmp_path: Path, content: str,
                                                          error: type[Exception]) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text(content)
    with pytest.raises(error) as exc:
        ConsumerOffsetManager(str(path)).load()
    assert str(path) in str(exc.value)


def test_stale_pull_commit_never_rewinds(om: ConsumerOffsetManager, locks: RebalanceLockManager) -> None:
    # Found by the chaos suite: a long-poll carrying commit offset 582 was applied after the same client's
    # UPDATE_CONSUMER_OFFSET of 594 (the broker runs a connection's requests as concurrent tasks), and the
    # queue's next owner consumed 582..593 again.
    assert locks.try_lock(G, mq(0), "owner")
    assert om.commit_offset(G, T, 0, 594, "owner", source="update")
    assert om.commit_offset(G, T, 0, 582, "owner", source="pull")  # accepted, ignored
    assert om.query_offset(G, T, 0) == 594 and om.stale_pull_commits == 1
    assert om.commit_offset(G, T, 0, 600, "owner", source="pull")
    assert om.query_offset(G, T, 0) == 600
    assert om.commit_offset(G, T, 0, 100, "owner", source="update")  # explicit updates may still rewind
    assert om.query_offset(G, T, 0) == 100


def test_a_pull_commit_by_the_live_holder_ranks_under_its_grant(om: ConsumerOffsetManager,
                                                               locks: RebalanceLockManager) -> None:
    """Long chaos seed 56: a demoted master handed its new master a commit made before the failover under a later
    lock sequence of the old lifetime; the holder's pull commits (no epoch said) ranked below it, so it was taken,
    moved the offset ahead of the holder, and the holder's next commit rewound it. A pull commit by the live holder
    now ranks as made under its grant."""
    assert locks.try_lock(G, mq(0), "c1")
    granted = locks.current_epoch(G, mq(0))
    assert granted is not None
    assert om.commit_offset(G, T, 0, 5, "c1", source="pull")
    assert om.commit_version(G, T, 0).lock_epoch == granted
    # a client that does not hold the queue stamps nothing (and for an orderly group it is fenced anyway)
    assert om.commit_offset("concurrent", T, 0, 5, "c2", source="pull")
    assert om.commit_version("concurrent", T, 0).lock_epoch == 0
