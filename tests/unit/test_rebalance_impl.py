"""RebalanceImpl's logic with fakes of the network (client instance, offset store, pull service).

Time runs on trio's MockClock (``autojump_clock``): the 1 s consume-lock wait, the 20 s delayed unlock and
the 120 s pull expiry take no real time. The end-to-end behaviour against a real broker is in
tests/integration/test_client_e2e.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from trimq.client.config import PushConsumerConfig
from trimq.client.errors import MQBrokerError, OffsetUnavailableError
from trimq.client.offset_store import ReadOffsetType
from trimq.client.process_queue import ProcessQueue
from trimq.client.rebalance.impl import PullRequest, RebalanceImpl
from trimq.client.rebalance.strategies import get_strategy
from trimq.client.subscription import build_subscription_data
from trimq.protocol.codes import ResponseCode
from trimq.protocol.message import MessageExt
from trimq.protocol.message_queue import MessageQueue

G = "g1"
T = "TopicA"
ME = "10.0.0.1@100"


def mq(q: int, topic: str = T, broker: str = "broker-a") -> MessageQueue:
    return MessageQueue(topic, broker, q)


def msg(offset: int) -> MessageExt:
    return MessageExt(topic=T, body=b"x", flag=0, properties={}, queue_id=0, queue_offset=offset,
                      commit_log_offset=offset, sys_flag=0, born_timestamp=0, born_host=("127.0.0.1", 1),
                      store_timestamp=0, store_host=("127.0.0.1", 2), reconsume_times=0,
                      prepared_transaction_offset=0, body_crc=0, store_size=100, msg_id="X")


class FakeApi:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    async def lock_batch_mq(self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue],
                            *, timeout_ms: Any = None) -> set[MessageQueue]:
        mqs = list(mqs)
        self.client.lock_calls.append((addr, sorted(mqs)))
        return {m for m in mqs if m not in self.client.locked_by_others}

    async def unlock_batch_mq(self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue], *,
                              oneway: bool = False, timeout_ms: Any = None) -> None:
        self.client.unlock_calls.append((trio.current_time(), sorted(mqs)))


class FakeClient:
    client_id = ME

    def __init__(self) -> None:
        self.api = FakeApi(self)
        self.cids: list[str] | None = [ME]
        self.max_offsets: dict[MessageQueue, int] = {}
        self.search_calls: list[tuple[MessageQueue, int]] = []
        self.fail_max_offset = False
        self.locked_by_others: set[MessageQueue] = set()
        self.lock_calls: list[tuple[str, list[MessageQueue]]] = []
        self.unlock_calls: list[tuple[float, list[MessageQueue]]] = []
        self.heartbeats = 0
        self.route_fetch_errors: dict[str, str] = {}

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        return f"{broker_name}:10911"

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None:
        return self.cids

    async def max_offset(self, m: MessageQueue) -> int:
        if self.fail_max_offset:
            raise MQBrokerError(ResponseCode.SYSTEM_ERROR, "store not ready", "x")
        return self.max_offsets.get(m, 100)

    async def search_offset(self, m: MessageQueue, ts: int) -> int:
        self.search_calls.append((m, ts))
        return 7

    async def send_heartbeat_to_all_brokers(self) -> None:
        self.heartbeats += 1


class FakeOffsetStore:
    def __init__(self) -> None:
        self.stored: dict[MessageQueue, int] = {}
        self.memory: dict[MessageQueue, int] = {}
        self.persisted: list[MessageQueue] = []
        self.removed: list[MessageQueue] = []

    async def load(self) -> None: ...

    def update_offset(self, m: MessageQueue, offset: int, increase_only: bool) -> None:
        self.memory[m] = offset

    async def read_offset(self, m: MessageQueue, type: ReadOffsetType) -> int:
        return self.stored.get(m, -1)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, m: MessageQueue) -> None:
        self.persisted.append(m)

    def remove_offset(self, m: MessageQueue) -> None:
        self.removed.append(m)
        self.memory.pop(m, None)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return {}


class FakePullService:
    def __init__(self) -> None:
        self.started: list[PullRequest] = []
        self.cancelled: list[ProcessQueue] = []

    def start(self, request: PullRequest) -> None:
        self.started.append(request)

    def cancel(self, process_queue: ProcessQueue) -> None:
        self.cancelled.append(process_queue)


def make(orderly: bool = False, strategy: str = "AVG", **cfg: Any) -> tuple[RebalanceImpl, FakeClient,
                                                                            FakeOffsetStore, FakePullService]:
    client, store, pulls = FakeClient(), FakeOffsetStore(), FakePullService()
    config = PushConsumerConfig(consumer_group=G, **cfg)
    fake: Any = client
    rb = RebalanceImpl(consumer_group=G, config=config, strategy=get_strategy(strategy), client=fake,
                       offset_store=store, consume_orderly=orderly, pull_service=pulls)
    rb.subscription_inner[T] = build_subscription_data(T, "*")
    rb.topic_subscribe_info_table[T] = {mq(i) for i in range(4)}
    return rb, client, store, pulls


# --- compute_pull_from_where ------------------------------------------------------------------------------


@pytest.mark.parametrize(("cfw", "topic", "expected"), [
    ("CONSUME_FROM_LAST_OFFSET", T, 100),
    ("CONSUME_FROM_LAST_OFFSET", "%RETRY%g1", 0),
    ("CONSUME_FROM_FIRST_OFFSET", T, 0),
    ("CONSUME_FROM_FIRST_OFFSET", "%RETRY%g1", 0),
    ("CONSUME_FROM_TIMESTAMP", T, 7),
    ("CONSUME_FROM_TIMESTAMP", "%RETRY%g1", 100),
    # deprecated values behave as LAST
    ("CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST", T, 100),
    ("CONSUME_FROM_MIN_OFFSET", T, 100),
    ("CONSUME_FROM_MAX_OFFSET", T, 100),
    ("CONSUME_FROM_MIN_OFFSET", "%RETRY%g1", 0),
])
async def test_compute_pull_from_where_without_stored_offset(cfw: str, topic: str, expected: int) -> None:
    rb, client, _, _ = make(consume_from_where=cfw, consume_timestamp="20240102030405")
    assert await rb.compute_pull_from_where(mq(0, topic)) == expected
    if cfw == "CONSUME_FROM_TIMESTAMP" and topic == T:
        assert client.search_calls == [(mq(0), rb.config.consume_timestamp_ms)]


@pytest.mark.parametrize("cfw", ["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"])
async def test_stored_offset_wins(cfw: str) -> None:
    rb, _, store, _ = make(consume_from_where=cfw)
    store.stored[mq(1)] = 33
    store.stored[mq(2)] = 0  # zero is a real stored offset
    assert await rb.compute_pull_from_where(mq(1)) == 33
    assert await rb.compute_pull_from_where(mq(2)) == 0


async def test_compute_pull_from_where_failures_raise() -> None:
    rb, client, store, _ = make()
    store.stored[mq(0)] = -2  # offset unreadable (broker down): never treated as a new group
    with pytest.raises(OffsetUnavailableError, match="could not be read"):
        await rb.compute_pull_from_where(mq(0))
    client.fail_max_offset = True
    with pytest.raises(OffsetUnavailableError, match="CONSUME_FROM_LAST_OFFSET"):
        await rb.compute_pull_from_where(mq(1))


# --- message_queue_changed ------------------------------------------------------------------------------------


def _hold(rb: RebalanceImpl, n: int) -> None:
    for i in range(n):
        rb.process_queue_table[mq(i)] = rb.new_process_queue()


@pytest.mark.parametrize(("queues", "per_queue"), [(1, 1024), (2, 512), (3, 341), (2048, 1)])
async def test_message_queue_changed_splits_topic_thresholds(queues: int, per_queue: int) -> None:
    rb, *_ = make(pull_threshold_for_topic=1024, pull_threshold_size_for_topic=1024)
    _hold(rb, queues)
    rb.message_queue_changed(T, set(), set())
    assert rb.config.pull_threshold_for_queue == per_queue
    assert rb.config.pull_threshold_size_for_queue == per_queue


async def test_message_queue_changed_leaves_minus_one_alone_and_bumps_version() -> None:
    rb, *_ = make()
    _hold(rb, 3)
    v = rb.subscription_inner[T].sub_version
    rb.message_queue_changed(T, set(), set())
    assert (rb.config.pull_threshold_for_queue, rb.config.pull_threshold_size_for_queue) == (1000, 100)
    assert rb.subscription_inner[T].sub_version > v
    assert rb.heartbeat_needed
    rb2, *_ = make(pull_threshold_for_topic=1024)
    rb2.message_queue_changed(T, set(), set())  # no queue held: thresholds untouched
    assert rb2.config.pull_threshold_for_queue == 1000


# --- update_process_queue_table_in_rebalance ----------------------------------------------------------------


async def test_new_queues_get_process_queues_and_pull_requests(autojump_clock: Any) -> None:
    rb, client, store, pulls = make()
    store.stored[mq(1)] = 40
    changed = await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, False)
    assert changed
    assert set(rb.process_queue_table) == {mq(0), mq(1)}
    assert {(p.message_queue, p.next_offset) for p in pulls.started} == {(mq(0), 100), (mq(1), 40)}
    assert all(p.process_queue is rb.process_queue_table[p.message_queue] for p in pulls.started)
    assert set(store.removed) == {mq(0), mq(1)}  # removeDirtyOffset
    assert not any(pq.locked for pq in rb.process_queue_table.values())  # concurrently: no broker locks
    assert client.lock_calls == []
    # same set again: nothing changes
    assert not await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, False)
    assert len(pulls.started) == 2


async def test_removed_queue_is_dropped_persisted_and_forgotten(autojump_clock: Any) -> None:
    rb, client, store, pulls = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, False)
    pq1 = rb.process_queue_table[mq(1)]
    other_topic = mq(0, "Other")
    rb.process_queue_table[other_topic] = rb.new_process_queue()
    assert await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, False)
    assert pq1.dropped and pulls.cancelled == [pq1]
    assert mq(1) not in rb.process_queue_table and other_topic in rb.process_queue_table
    assert store.persisted == [mq(1)]
    assert client.unlock_calls == []  # concurrently: nothing to unlock


async def test_pull_expired_queue_is_recreated(autojump_clock: Any) -> None:
    rb, _, _, pulls = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, False)
    old = rb.process_queue_table[mq(0)]
    await trio.sleep(119)
    assert not await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, False)
    await trio.sleep(2)  # not pulled for more than pull_max_idle_time (120 s)
    assert await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, False)
    assert old.dropped
    assert rb.process_queue_table[mq(0)] is not old  # RocketMQ removes it; the same pass re-adds it
    assert len(pulls.started) == 2


async def test_orderly_new_queues_are_locked_first_and_marked_locked_at_once(autojump_clock: Any) -> None:
    rb, client, _, pulls = make(orderly=True)
    queues = {mq(0), mq(1), mq(0, broker="broker-b"), mq(2)}
    client.locked_by_others = {mq(2)}
    await trio.sleep(5)
    assert await rb.update_process_queue_table_in_rebalance(T, queues, True)
    # one LOCK_BATCH_MQ per broker, before any pull request exists
    assert sorted(client.lock_calls) == [("broker-a:10911", [mq(0), mq(1), mq(2)]),
                                         ("broker-b:10911", [mq(0, broker="broker-b")])]
    assert set(rb.process_queue_table) == queues - {mq(2)}  # not locked: not consumed
    for pq in rb.process_queue_table.values():
        assert pq.locked  # RocketMQ #2621: locked at once, not after the next lockAll
        assert pq.last_lock_timestamp == rb.clock()
        assert not pq.is_lock_expired(rb.clock())
    assert {p.message_queue for p in pulls.started} == queues - {mq(2)}


async def test_orderly_queue_without_start_offset_is_unlocked_at_once(autojump_clock: Any) -> None:
    rb, client, store, _ = make(orderly=True)
    store.stored[mq(0)] = -2
    assert not await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    assert mq(0) not in rb.process_queue_table
    assert [q for _, q in client.unlock_calls] == [[mq(0)]]


async def test_orderly_removal_unlocks_at_once_when_empty(autojump_clock: Any) -> None:
    rb, client, store, _ = make(orderly=True)
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    t0 = trio.current_time()
    assert await rb.update_process_queue_table_in_rebalance(T, set(), True)
    assert client.unlock_calls == [(t0, [mq(0)])]
    assert store.persisted == [mq(0)]


async def test_orderly_removal_with_cached_messages_unlocks_at_once_by_default(autojump_clock: Any) -> None:
    # trimq: the consume lock taken by the removal already guarantees nothing of the queue is consumed, so the
    # next owner gets it without RocketMQ's 20 s wait (found by the demo: 20 s stalls after a reshuffle).
    rb, client, _, _ = make(orderly=True)
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    rb.process_queue_table[mq(0)].put_message([msg(5)])
    t0 = trio.current_time()
    assert await rb.update_process_queue_table_in_rebalance(T, set(), True)
    assert client.unlock_calls == [(t0, [mq(0)])]


async def test_orderly_removal_with_cached_messages_unlocks_after_the_configured_delay(autojump_clock: Any) -> None:
    rb, client, _, _ = make(orderly=True, unlock_delay_time_mills=20_000)  # RocketMQ's default
    async with trio.open_nursery() as nursery:
        rb.bind(nursery)
        await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, True)
        rb.process_queue_table[mq(0)].put_message([msg(5)])
        rb.process_queue_table[mq(1)].put_message([msg(6)])
        t0 = trio.current_time()
        assert await rb.update_process_queue_table_in_rebalance(T, set(), True)
        assert client.unlock_calls == []
        # mq(1) comes back before the delayed unlock fires: its new lock must not be released
        await rb.update_process_queue_table_in_rebalance(T, {mq(1)}, True)
    assert client.unlock_calls == [(t0 + 20, [mq(0)])]


async def test_orderly_removal_waits_at_most_1s_for_the_consume_lock(autojump_clock: Any) -> None:
    rb, client, _, pulls = make(orderly=True)
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    pq = rb.process_queue_table[mq(0)]
    lock = rb.consume_lock(pq)
    released = trio.Event()
    async with trio.open_nursery() as nursery:
        async def consume() -> None:
            async with lock:  # a long-running orderly consumption
                await released.wait()

        nursery.start_soon(consume)
        await trio.sleep(0.1)
        t0 = trio.current_time()
        assert not await rb.update_process_queue_table_in_rebalance(T, set(), True)
        assert trio.current_time() - t0 == pytest.approx(1.0)
        assert pq.dropped and mq(0) in rb.process_queue_table and pq.try_unlock_times == 1
        assert client.unlock_calls == []
        released.set()
    # next rebalance gets the lock and removes it
    assert await rb.update_process_queue_table_in_rebalance(T, set(), True)
    assert mq(0) not in rb.process_queue_table and [q for _, q in client.unlock_calls] == [[mq(0)]]
    assert pulls.cancelled.count(pq) == 2


# --- rebalance_by_topic / do_rebalance --------------------------------------------------------------------


async def test_rebalance_by_topic_allocates_share(autojump_clock: Any) -> None:
    rb, client, _, _ = make()
    client.cids = ["10.0.0.2@1", ME, "10.0.0.0@9"]  # unsorted on purpose: RocketMQ sorts them
    assert await rb.rebalance_by_topic(T, False)
    # sorted ids: 10.0.0.0@9, 10.0.0.1@100 (me), 10.0.0.2@1 -> AVG gives index 1 of 4 queues: [mq(2)]
    assert set(rb.process_queue_table) == {mq(2)}
    assert rb.heartbeat_needed


async def test_allocation_failure_aborts_the_topic(autojump_clock: Any) -> None:
    class Broken:
        name = "BROKEN"

        def allocate(self, *a: Any) -> list[MessageQueue]:
            raise ValueError("cidAll is null or cidAll empty")

    rb, client, _, _ = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, False)
    rb.strategy = Broken()
    assert not await rb.rebalance_by_topic(T, False)
    assert set(rb.process_queue_table) == {mq(0)}  # nothing dropped
    client.cids = None  # consumer list unavailable: also no change
    rb.strategy = get_strategy("AVG")
    assert not await rb.rebalance_by_topic(T, False)
    assert set(rb.process_queue_table) == {mq(0)}


async def test_a_topic_without_queues_says_why_no_name_server_answered(autojump_clock: Any) -> None:
    """"topic not exist" while the name server was unreachable named no cause; the route's error is logged with it."""
    rb, client, _, _ = make()
    del rb.topic_subscribe_info_table[T]
    with capture_logs() as logs:
        assert not await rb.rebalance_by_topic(T, False)
    assert [e.get("route_error") for e in logs if e["event"] == "rebalance.topic_not_exist"] == [None]
    client.route_fetch_errors = {T: "cannot connect to ns:9876: Connection refused"}
    await trio.sleep(11)  # (the warning is rate-limited per topic: once per 10 s)
    with capture_logs() as logs:
        assert not await rb.rebalance_by_topic(T, False)
    assert [e.get("route_error") for e in logs if e["event"] == "rebalance.topic_not_exist"] == [
        "cannot connect to ns:9876: Connection refused"]


async def test_broadcasting_takes_every_queue(autojump_clock: Any) -> None:
    rb, client, _, _ = make(message_model="BROADCASTING")
    client.cids = [ME, "someone-else"]
    assert await rb.rebalance_by_topic(T, False)
    assert set(rb.process_queue_table) == {mq(i) for i in range(4)}


async def test_do_rebalance_truncates_unsubscribed_topics_and_heartbeats(autojump_clock: Any) -> None:
    rb, client, _, pulls = make()
    await rb.do_rebalance()
    assert set(rb.process_queue_table) == {mq(i) for i in range(4)}
    assert client.heartbeats == 1
    await rb.do_rebalance()
    assert client.heartbeats == 1  # unchanged: no extra heartbeat
    del rb.subscription_inner[T]
    held = list(rb.process_queue_table.values())
    await rb.do_rebalance()
    assert rb.process_queue_table == {} and all(pq.dropped for pq in held)
    assert set(pulls.cancelled) == set(held)


async def test_lock_all_marks_locked_and_lost(autojump_clock: Any) -> None:
    rb, client, _, _ = make(orderly=True)
    await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, True)
    client.locked_by_others = {mq(1)}
    await trio.sleep(25)
    await rb.lock_all()
    assert rb.process_queue_table[mq(0)].locked and rb.process_queue_table[mq(0)].last_lock_timestamp == rb.clock()
    assert not rb.process_queue_table[mq(1)].locked
    await rb.unlock_all()
    assert not rb.process_queue_table[mq(0)].locked
    assert [q for _, q in client.unlock_calls] == [[mq(0), mq(1)]]
    # Re-locking a queue whose lock was let go cannot trust its cache (another client may have consumed it
    # meanwhile): the process queue is dropped for the next rebalance to re-create (test_stale_relock_*).
    assert not await rb.lock(mq(0)) and not await rb.lock(mq(1))
    assert mq(0) not in rb.process_queue_table and mq(1) in rb.process_queue_table
