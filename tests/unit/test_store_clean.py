"""Deleting expired files and a full disk, as RocketMQ 4.9.3's CleanCommitLogService / CleanConsumeQueueService
(broker/store/clean.py, docs/STORAGE.md §9): a real store on a tiny geometry, a fake wall clock for file ages
and the hour, a fake disk-usage function, and trio's MockClock for the service's own timers."""

from __future__ import annotations

import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trimq.broker.store.clean import DELETE_FILES_BATCH_MAX, disk_partition_space_used_ratio, is_it_time_to_do
from trimq.broker.store.commitlog import file_name
from trimq.broker.store.message_store import MessageStore
from trimq.broker.store.store_base import GetMessageStatus, PutMessageStatus, StoreConfig
from trimq.protocol.record import iter_records

SEG = 4096
CQ_FILE = 20 * 4  # 4 units per queue file
HOST = ("10.0.0.1", 10911)
BORN = ("192.168.0.7", 40001)
HOUR_MS = 3_600_000


class Fakes:
    """The wall clock (ms) and the disk's used ratio the store sees."""

    def __init__(self) -> None:
        self.now = time.time_ns() // 1_000_000
        self.disk = 0.5

    def hour(self) -> str:
        return f"{time.localtime(self.now / 1000).tm_hour:02d}"

    def other_hour(self) -> str:
        return f"{(time.localtime(self.now / 1000).tm_hour + 12) % 24:02d}"


@asynccontextmanager
async def running(path: Path, fakes: Fakes, periodic_clean: bool = False, **kw: Any) -> AsyncIterator[MessageStore]:
    """A running store. Unless ``periodic_clean``, its clean loop never runs a pass: the tests call
    ``clean_once`` themselves, and the autojump clock, which also jumps while a worker thread fsyncs, would
    otherwise reach the loop's first pass at a random point of a test (one pass deleting what the next
    assertion counts)."""
    cfg = StoreConfig(str(path), segment_size=SEG, consume_queue_file_size=CQ_FILE, **kw)
    st = MessageStore(cfg, store_host=lambda: HOST, now_ms=lambda: fakes.now, disk_usage=lambda _path: fakes.disk)
    if not periodic_clean:
        st.cleaner.first_delay_s = math.inf
    await st.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(st.run)
        try:
            yield st
        finally:
            nursery.cancel_scope.cancel()
    await st.stop()


async def fill(st: MessageStore, n: int, topics: tuple[str, ...] = ("A", "B"), first: int = 0) -> None:
    """Messages ``first`` to ``first + n - 1`` (~1.1 KB) per topic, interleaved: three records per 4 KiB
    segment."""
    for i in range(first, first + n):
        for t in topics:
            res = await st.put_message(t, 0, b"%s-%04d-" % (t.encode(), i) + bytes(1000), {},
                                       born_timestamp=0, born_host=BORN)
            assert res.ok, res


def first_body(st: MessageStore, topic: str) -> bytes:
    r = st.get_message(topic, 0, st.get_min_offset_in_queue(topic, 0), 1)
    assert r.status is GetMessageStatus.FOUND, r
    (m,) = iter_records(r.body)
    assert m.commit_log_offset >= st.min_phy_offset
    return m.body[:6]


def test_is_it_time_to_do() -> None:
    four = int(time.mktime((2026, 3, 1, 4, 30, 0, 0, 0, -1)) * 1000)  # 04:30 local time
    assert is_it_time_to_do("04", four)
    assert is_it_time_to_do("4", four)
    assert is_it_time_to_do("01;04;13", four)
    assert not is_it_time_to_do("05", four)
    assert not is_it_time_to_do("05;x", four)
    assert not is_it_time_to_do("", four)


def test_disk_ratio_of_a_real_path(tmp_path: Path) -> None:
    ratio = disk_partition_space_used_ratio(str(tmp_path))
    assert 0.0 <= ratio <= 1.0
    assert abs(ratio * 100 - round(ratio * 100)) < 1e-9  # whole percent, rounded up like RocketMQ
    assert disk_partition_space_used_ratio(str(tmp_path / "not" / "yet")) == ratio  # measured at the parent


async def test_expired_segments_go_at_delete_when_and_the_queues_follow(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    async with running(tmp_path, fakes, delete_when=fakes.other_hour()) as st:
        await fill(st, 15)  # 30 records: 10 segments
        segments = len(st.commitlog.segments)
        assert segments == 10
        fakes.now += 73 * HOUR_MS  # everything has expired ...
        assert await st.cleaner.clean_once() == (0, 0)  # ... but it is not 04 o'clock and the disk is fine
        st.config.delete_when = fakes.hour()
        fakes.now -= 2 * HOUR_MS  # 71 h: not expired yet
        st.config.delete_when = fakes.hour()
        assert await st.cleaner.clean_once() == (0, 0)
        fakes.now += 2 * HOUR_MS
        st.config.delete_when = fakes.hour()
        deleted, queue_files = await st.cleaner.clean_once()
        assert deleted == segments - 1  # all but the segment being written
        assert [s.start for s in st.commitlog.segments] == [9 * SEG]
        assert not (tmp_path / "commitlog" / file_name(0)).exists()
        assert st.min_phy_offset == 9 * SEG
        # Consume queues: files pointing only below the new start are gone (3 of 4 per queue), min offsets
        # follow: the segment left holds records 27-29, i.e. B's message 13 and A's and B's message 14.
        assert queue_files == 6 and st.deleted_files == {"commitlog": 9, "consumequeue": 6}
        for topic, lo in (("A", 14), ("B", 13)):
            assert (st.get_min_offset_in_queue(topic, 0), st.get_max_offset_in_queue(topic, 0)) == (lo, 15)
            r = st.get_message(topic, 0, 0, 32)  # a consumer below the min offset is told where to go
            assert r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == lo
            assert first_body(st, topic) == b"%s-%04d" % (topic.encode(), lo)
        assert sorted(os.listdir(tmp_path / "consumequeue" / "A" / "0")) == [file_name(3 * CQ_FILE)]
        res = await st.put_message("A", 0, b"after", {}, born_timestamp=0, born_host=BORN)
        assert res.ok and res.queue_offset == 15


async def test_a_pass_deletes_at_most_ten_segments_oldest_first_and_stops_at_a_young_one(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    async with running(tmp_path, fakes) as st:
        await fill(st, 21)  # 42 records: 14 segments
        assert len(st.commitlog.segments) == 14
        young = st.commitlog.segments[12]
        os.utime(young.fd, ns=(time.time_ns() + 10 * HOUR_MS * 1_000_000,) * 2)  # written later than the rest
        fakes.now += 73 * HOUR_MS
        st.config.delete_when = fakes.hour()
        t0 = trio.current_time()
        assert (await st.cleaner.clean_once())[0] == DELETE_FILES_BATCH_MAX
        assert trio.current_time() - t0 >= 0.1 * (DELETE_FILES_BATCH_MAX - 1)  # delete_commit_log_files_interval
        assert (await st.cleaner.clean_once())[0] == 2  # the young one stops the next pass: no hole in the log
        assert st.commitlog.segments[0] is young


async def test_disk_above_the_ratios_deletes_at_any_hour_then_whatever_the_age(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    async with running(tmp_path, fakes, delete_when=fakes.other_hour()) as st:
        await fill(st, 9)  # 6 segments
        fakes.disk = 0.80  # above disk_max_used_space_ratio 75: expired ones go at any hour
        assert (await st.cleaner.clean_once())[0] == 0  # none has expired
        fakes.now += 73 * HOUR_MS
        os.utime(st.commitlog.segments[2].fd, ns=(time.time_ns() + 10 * HOUR_MS * 1_000_000,) * 2)
        assert (await st.cleaner.clean_once())[0] == 2
        fakes.now -= 73 * HOUR_MS
        fakes.disk = 0.87  # above disk_space_clean_forcibly_ratio 85: whatever their age
        st.config.clean_file_forcibly_enable = False
        assert (await st.cleaner.clean_once())[0] == 0
        st.config.clean_file_forcibly_enable = True
        assert (await st.cleaner.clean_once())[0] == 3
        assert len(st.commitlog.segments) == 1  # never the one being written
        assert st.writable  # below disk_space_warning_level_ratio 90 writes go on
        assert st.disk_used_ratio["commitlog"] == 0.87


async def test_a_full_disk_refuses_writes_until_it_is_back_below_and_the_service_cleans_on_its_own(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    fakes.disk = 0.95
    async with running(tmp_path, fakes, periodic_clean=True) as st:
        await trio.sleep(1)  # the disk check runs at start
        res = await st.put_message("A", 0, b"x", {}, born_timestamp=0, born_host=BORN)
        assert res.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk is full" in res.remark and "95%" in res.remark and "90" in res.remark
        assert st.disk_full and not st.writable
        fakes.disk = 0.5
        await trio.sleep(10)  # the next check (every 10 s) marks the disk OK
        assert st.writable and not st.disk_full
        await fill(st, 9)
        fakes.disk = 0.92
        await trio.sleep(60)  # first pass one minute after start; cleans forcibly above 85 %
        assert len(st.commitlog.segments) == 1 and st.deleted_files["commitlog"] == 5
        assert st.get_min_offset_in_queue("A", 0) == 8
        res = await st.put_message("A", 0, b"x", {}, born_timestamp=0, born_host=BORN)
        assert res.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        fakes.disk = 0.6
        await trio.sleep(10)
        assert st.writable


async def test_restart_after_cleaning_keeps_the_offsets_and_rebuilds_a_lost_queue(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    fakes.disk = 0.88
    async with running(tmp_path, fakes) as st:
        await fill(st, 9)
        await fill(st, 3, topics=("B",), first=9)  # 21 records, 7 segments; the last holds B's messages 9-11
        await st.cleaner.clean_once()
        before = {t: (st.get_min_offset_in_queue(t, 0), st.get_max_offset_in_queue(t, 0)) for t in ("A", "B")}
        min_phy = st.min_phy_offset
    assert min_phy == 6 * SEG and before == {"A": (9, 9), "B": (9, 12)}  # every message of A is gone
    fakes.disk = 0.5
    async with running(tmp_path, fakes) as st:
        assert st.recovery.records_verified == 0 and st.min_phy_offset == min_phy
        assert {t: (st.get_min_offset_in_queue(t, 0), st.get_max_offset_in_queue(t, 0)) for t in ("A", "B")} == before
        assert st.get_message("A", 0, 9, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert first_body(st, "B") == b"B-0009"
    # Lose a queue of a log whose start was deleted: it is rebuilt at its old offsets (RocketMQ's
    # fillPreBlank for the deleted part), not renumbered from 0.
    for f in (tmp_path / "consumequeue" / "B" / "0").iterdir():
        f.unlink()
    async with running(tmp_path, fakes) as st:
        assert (st.get_min_offset_in_queue("B", 0), st.get_max_offset_in_queue("B", 0)) == before["B"]
        assert first_body(st, "B") == b"B-%04d" % before["B"][0]
        res = await st.put_message("B", 0, b"next", {}, born_timestamp=0, born_host=BORN)
        assert res.queue_offset == before["B"][1]


async def test_deleted_files_are_closed_only_once_no_flush_thread_can_use_them(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    async with running(tmp_path, fakes, destroy_mapedfile_interval_forcibly_ms=120_000) as st:
        await fill(st, 6)
        first = st.commitlog.segments[0]
        await st._flush_lock.acquire()  # no interval flush meanwhile: only the simulated thread below counts
        st._io_threads += 1  # as if an fsync pass were running in a worker thread
        try:
            st.delete_first_segment()
            assert not first.path.exists()
            st.close_retired()
            assert not first.mm.closed  # still open: the thread may be fsyncing it
            await trio.sleep(121)  # RocketMQ's destroyMapedFileIntervalForcibly
            st.close_retired()
            assert first.mm.closed
        finally:
            st._io_threads -= 1
        second = st.commitlog.segments[0]
        st.delete_first_segment()
        st.close_retired()  # no thread: at once
        assert second.mm.closed
        with pytest.raises(ValueError):
            while True:
                st.delete_first_segment()
        assert len(st.commitlog.segments) == 1
        st._flush_lock.release()


def test_delete_when_is_checked_with_the_other_settings() -> None:
    from trimq.broker.config import BrokerConfig
    from trimq.runtime.settings import ConfigError

    assert BrokerConfig(delete_when="04;16").validate().delete_when == "04;16"
    for bad in ("24", "4pm", "", "04;"):
        with pytest.raises(ConfigError, match="delete_when"):
            BrokerConfig(delete_when=bad).validate()
    with pytest.raises(ConfigError, match="disk_max_used_space_ratio"):
        BrokerConfig(disk_max_used_space_ratio=96).validate()  # RocketMQ clamps it to 10-95


async def test_units_of_a_deleted_segment_are_skipped_until_the_queue_follows(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    fakes = Fakes()
    async with running(tmp_path, fakes) as st:
        await fill(st, 6)  # 4 segments
        st.delete_first_segment()  # the commit-log half of a pass, before the queues follow
        r = st.get_message("A", 0, 0, 32)  # RocketMQ's getMessage skips units whose record is gone
        assert r.status is GetMessageStatus.FOUND
        assert [m.body[:6] for m in iter_records(r.body)] == [b"A-0002", b"A-0003"]
        assert await st.cleaner.delete_expired_consume_queues() == 0  # no file holds only deleted units
        assert st.get_min_offset_in_queue("A", 0) == 2  # segment 0 held A's 0 and 1 (and B's 0)
        assert st.get_message("A", 0, 0, 32).status is GetMessageStatus.OFFSET_TOO_SMALL
