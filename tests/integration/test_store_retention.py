"""Expired and over-quota files on a real in-process broker over TCP (docs/STORAGE.md §9): a tiny store
geometry, a fake disk-usage function and wall clock on the broker's store, trio's MockClock for the
broker's timers (moved by hand: an automatic jump while a send waits for a worker thread would fire its
timeout). A consumer whose offset was deleted is moved to the new min offset; a nearly full disk
refuses sends with SERVICE_NOT_AVAILABLE and the broker keeps serving."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from tests.integration.conftest import call
from trimq.protocol.codes import RequestCode as RC
from trimq.protocol.codes import ResponseCode
from trimq.protocol.record import iter_records
from trimq.runtime.client import RemotingClient

SEG = 4096
CQ_FILE = 20 * 16
SETTINGS = {"mapped_file_size_commit_log": SEG, "mapped_file_size_consume_queue": CQ_FILE,
            "delete_commit_log_files_interval_ms": 0, "delete_consume_queue_files_interval_ms": 0}


def samples(broker: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The broker's metrics as the registry would serve them: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in broker.metrics.registry.collect() for s in family.samples}


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock()  # no autojump: time moves only by advance()


async def advance(clock: trio.testing.MockClock, seconds: float) -> None:
    """Move the broker's timers on and let every task that wakes up do its work."""
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()


def send_ext(topic: str, queue_id: int) -> dict[str, Any]:
    return {"producerGroup": "pg", "topic": topic, "queueId": queue_id, "sysFlag": 0, "bornTimestamp": 1234,
            "flag": 0, "properties": ""}


def pull_ext(topic: str, queue_id: int, offset: int) -> dict[str, Any]:
    return {"consumerGroup": "cg", "topic": topic, "queueId": queue_id, "queueOffset": offset, "maxMsgNums": 32,
            "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}


async def test_cleaning_moves_consumers_to_the_new_min_offset_and_a_full_disk_refuses_sends(
        broker_factory: Callable[..., Any], rclient: RemotingClient, clock: trio.testing.MockClock) -> None:
    disk = [0.5]
    async with broker_factory(metrics_port=0, **SETTINGS) as broker:
        store = broker.store
        store.disk_usage = lambda _path: disk[0]
        store.now_ms = lambda: time.time_ns() // 1_000_000
        a = broker.address
        for i in range(30):  # ~1.1 KB records, three per 4 KiB segment
            r = await call(rclient, a, RC.SEND_MESSAGE, send_ext("Ret", 0), b"m%02d-" % i + bytes(1000))
            assert r.code == ResponseCode.SUCCESS, r.remark
        assert len(store.commitlog.segments) == 10
        disk[0] = 0.87  # above disk_space_clean_forcibly_ratio (85 %): the first pass deletes at once
        await advance(clock, 61)  # the first pass runs one minute after start
        assert len(store.commitlog.segments) == 1
        min_offset = (await call(rclient, a, RC.GET_MIN_OFFSET, {"topic": "Ret", "queueId": 0})).ext["offset"]
        assert min_offset == 27

        # A consumer still at offset 2 is told where the queue starts now (RocketMQ: OFFSET_TOO_SMALL ->
        # PULL_OFFSET_MOVED), and reads on from there.
        r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Ret", 0, 2))
        assert r.code == ResponseCode.PULL_OFFSET_MOVED and r.ext["nextBeginOffset"] == min_offset
        assert r.ext["minOffset"] == min_offset and r.ext["maxOffset"] == 30
        r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Ret", 0, min_offset))
        assert r.code == ResponseCode.SUCCESS
        assert [m.body[:4] for m in iter_records(r.body)] == [b"m27-", b"m28-", b"m29-"]

        disk[0] = 0.95  # above disk_space_warning_level_ratio (90 %)
        await advance(clock, 10)  # the disk check runs every 10 s
        r = await call(rclient, a, RC.SEND_MESSAGE, send_ext("Ret", 0), b"refused")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "disk is full" in (r.remark or "")
        m = samples(broker)
        assert m[("trimq_storage_disk_full", ())] == 1 and m[("trimq_storage_writable", ())] == 0
        assert m[("trimq_storage_disk_used_ratio", (("path", "commitlog"),))] == 0.95
        r = await call(rclient, a, RC.PULL_MESSAGE, pull_ext("Ret", 0, min_offset))  # still serving
        assert r.code == ResponseCode.SUCCESS
        disk[0] = 0.5
        await advance(clock, 10)
        r = await call(rclient, a, RC.SEND_MESSAGE, send_ext("Ret", 0), b"accepted")
        assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == 30
        m = samples(broker)
        assert m[("trimq_storage_deleted_files_total", (("kind", "commitlog"),))] == 9
        assert m[("trimq_storage_deleted_files_total", (("kind", "consumequeue"),))] == 1
        assert m[("trimq_storage_disk_full", ())] == 0 and m[("trimq_storage_writable", ())] == 1
        clock.autojump_threshold = 0  # the shutdown's drain timers may run now
