"""The pull service's decisions (one pull_once at a time) with a scripted fake broker API, and the API's
decoding of pull bodies (real commit-log records, exact tag filtering)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from trimq.client.api import PullResult, PullStatus, process_pull_messages
from trimq.client.config import PushConsumerConfig
from trimq.client.errors import MQBrokerError
from trimq.client.offset_store import OffsetTable, ReadOffsetType
from trimq.client.process_queue import ProcessQueue
from trimq.client.pull import PullService, flow_control_reason
from trimq.client.rebalance.impl import PullRequest, RebalanceImpl
from trimq.client.rebalance.strategies import get_strategy
from trimq.client.subscription import build_subscription_data
from trimq.protocol.codes import ResponseCode
from trimq.protocol.message import MessageConst, MessageExt, encode_properties
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.record import encode_record, iter_records
from trimq.runtime.client import RemotingConnectError, RemotingTimeoutError

G, T = "g1", "TopicA"
MQ = MessageQueue(T, "broker-a", 0)


def record(offset: int, tags: str | None = None, body: bytes = b"x") -> bytes:
    props = {MessageConst.TAGS: tags} if tags else {}
    return encode_record(topic=T, body=body, queue_id=0, queue_offset=offset, physical_offset=1000 + offset,
                         properties=encode_properties(props))


def msgs(*offsets: int, size: int = 1) -> list[MessageExt]:
    return list(iter_records(b"".join(record(o, body=b"x" * size) for o in offsets)))


def test_process_pull_messages_filters_tags_exactly_and_sets_offsets() -> None:
    body = record(0, "TagA") + record(1, "TagB") + record(2) + record(3, "TagA")
    kept, dropped = process_pull_messages(body, {"TagA"}, 0, 10, "addr")
    assert [m.queue_offset for m in kept] == [0, 3] and dropped == 2
    assert kept[0].properties[MessageConst.MIN_OFFSET] == "0"
    assert kept[0].properties[MessageConst.MAX_OFFSET] == "10"
    everything, dropped = process_pull_messages(body, set(), 0, 10, "addr")
    assert len(everything) == 4 and dropped == 0
    from trimq.client.errors import MQClientError

    with pytest.raises(MQClientError, match="undecodable records"):
        process_pull_messages(b"\x00" * 50, None, 0, 0, "addr")


def test_flow_control_reasons_in_rocketmq_order() -> None:
    cfg = PushConsumerConfig(consumer_group=G, pull_threshold_for_queue=2, pull_threshold_size_for_queue=1,
                             consume_concurrently_max_span=5)
    pq = ProcessQueue(0)
    assert flow_control_reason(pq, cfg, False) is None
    pq.put_message(msgs(0, 1, 2))
    assert flow_control_reason(pq, cfg, False) == "count"
    pq = ProcessQueue(0)
    pq.put_message(msgs(0, size=2 * 1024 * 1024 + 10))
    assert flow_control_reason(pq, cfg, False) == "size"  # 2 MiB (integer MiB) > 1
    pq = ProcessQueue(0)
    pq.put_message(msgs(0, 9))
    assert flow_control_reason(pq, cfg, False) == "span"
    assert flow_control_reason(pq, cfg, True) is None  # orderly ignores the span


class FakeApi:
    def __init__(self) -> None:
        self.results: list[PullResult | Exception] = []
        self.calls: list[dict[str, Any]] = []

    async def unlock_batch_mq(self, addr: str, *args: Any, **kw: Any) -> None: ...

    async def pull_message(self, addr: str, **kw: Any) -> PullResult:
        self.calls.append(kw)
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


class FakeClient:
    client_id = "me"

    def __init__(self) -> None:
        self.api = FakeApi()

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        return "broker-a:1"

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None:
        return ["me"]

    async def max_offset(self, mq: MessageQueue) -> int:
        return 0

    async def search_offset(self, mq: MessageQueue, ts: int) -> int:
        return 0

    async def send_heartbeat_to_all_brokers(self) -> None: ...


class MemStore:
    def __init__(self) -> None:
        self.table = OffsetTable()
        self.stored: dict[MessageQueue, int] = {}
        self.persisted: list[MessageQueue] = []
        self.master_epochs: dict[MessageQueue, int] = {}
        self.lock_epochs: dict[MessageQueue, int] = {}

    async def load(self) -> None: ...

    def set_master_epoch(self, mq: MessageQueue, epoch: int) -> None:
        self.master_epochs[mq] = epoch

    def master_epoch(self, mq: MessageQueue) -> int | None:
        return self.master_epochs.get(mq)

    def lock_epoch(self, mq: MessageQueue) -> int | None:
        return self.lock_epochs.get(mq)

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        self.table.update(mq, offset, increase_only)

    async def read_offset(self, mq: MessageQueue, type: ReadOffsetType) -> int:
        if type is ReadOffsetType.READ_FROM_MEMORY:
            v = self.table.get(mq)
            return -1 if v is None else v
        return self.stored.get(mq, -1)

    async def persist_all(self, mqs: Any) -> None: ...

    async def persist(self, mq: MessageQueue) -> None:
        self.persisted.append(mq)

    def remove_offset(self, mq: MessageQueue) -> None:
        self.table.remove(mq)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return {}


class Recorder:
    def __init__(self) -> None:
        self.submitted: list[tuple[ProcessQueue, list[int], bool, MessageQueue]] = []

    def submit(self, process_queue: ProcessQueue, msgs: Any, dispatch_to_consume: bool,
               message_queue: MessageQueue) -> None:
        self.submitted.append((process_queue, [m.queue_offset for m in msgs], dispatch_to_consume, message_queue))


def setup(orderly: bool = False, **cfg: Any) -> tuple[PullService, RebalanceImpl, FakeClient, MemStore, Recorder,
                                                       PullRequest]:
    config = PushConsumerConfig(consumer_group=G, **cfg)
    client, store, rec = FakeClient(), MemStore(), Recorder()
    fake: Any = client
    rb = RebalanceImpl(consumer_group=G, config=config, strategy=get_strategy("AVG"), client=fake,
                       offset_store=store, consume_orderly=orderly)
    rb.subscription_inner[T] = build_subscription_data(T, "TagA || TagB")
    ps = PullService(consumer_group=G, config=config, client=fake, rebalance=rb, offset_store=store,
                     consume_service=rec, consume_orderly=orderly)
    rb.pull_service = ps
    pq = rb.new_process_queue()
    rb.process_queue_table[MQ] = pq
    return ps, rb, client, store, rec, PullRequest(G, MQ, pq, 5)


def found(next_begin: int, *offsets: int) -> PullResult:
    return PullResult(PullStatus.FOUND, next_begin, 0, 100, msgs(*offsets))


async def test_found_puts_messages_and_submits(autojump_clock: Any) -> None:
    ps, _rb, client, store, rec, pr = setup(pull_interval=250)
    client.api.results = [found(7, 5, 6), found(8, 7)]
    assert await ps.pull_once(pr) == 0.25
    call = client.api.calls[0]
    assert (call["queue_offset"], call["max_msg_nums"], call["suspend_timeout_millis"], call["timeout_ms"]) == (
        5, 32, 15_000, 30_000)
    assert call["subscription"] == "TagA || TagB" and call["tags"] == {"TagA", "TagB"}
    assert call["sys_flag"] == 0x2 | 0x4 and call["commit_offset"] == 0  # nothing to commit yet
    assert pr.next_offset == 7 and pr.process_queue.msg_count == 2
    assert rec.submitted == [(pr.process_queue, [5, 6], True, MQ)]
    store.update_offset(MQ, 6, True)
    await ps.pull_once(pr)
    assert client.api.calls[1]["sys_flag"] == 0x1 | 0x2 | 0x4 and client.api.calls[1]["commit_offset"] == 6
    assert rec.submitted[1][2] is False  # a consume task is already running for the queue


async def test_no_new_msg_moves_offset_only_when_nothing_cached(autojump_clock: Any) -> None:
    ps, _rb, client, store, _rec, pr = setup()
    client.api.results = [PullResult(PullStatus.NO_NEW_MSG, 9, 0, 9), PullResult(PullStatus.NO_MATCHED_MSG, 12, 0, 12)]
    assert await ps.pull_once(pr) == 0.0
    assert pr.next_offset == 9 and store.table.get(MQ) == 9  # correctTagsOffset
    pr.process_queue.put_message(msgs(9))
    assert await ps.pull_once(pr) == 0.0
    assert pr.next_offset == 12 and store.table.get(MQ) == 9  # cached messages: keep the stored offset


async def test_a_pull_carries_the_master_epoch_its_position_was_reached_in(autojump_clock: Any) -> None:
    # The broker moves a position reached under an older master epoch back when that epoch's tail was lost (an
    # ASYNC_MASTER failover): every pull says which epoch its offset belongs to, the last answer's.
    ps, _rb, client, _store, _rec, pr = setup()
    first, second = found(7, 5, 6), PullResult(PullStatus.NO_NEW_MSG, 7, 0, 7)
    first.master_epoch = second.master_epoch = 3
    client.api.results = [first, second, PullResult(PullStatus.NO_NEW_MSG, 7, 0, 7)]
    await ps.pull_once(pr)
    assert client.api.calls[0]["master_epoch"] is None  # from the offset store: no epoch known
    await ps.pull_once(pr)
    assert client.api.calls[1]["master_epoch"] == 3 and pr.master_epoch == 3
    await ps.pull_once(pr)  # a broker that does not say keeps the last epoch known
    assert client.api.calls[2]["master_epoch"] == 3



async def test_a_first_pull_says_the_epoch_of_the_log_its_stored_offset_was_read_from(autojump_clock: Any) -> None:
    # Long ASYNC seed 24: a position read from the old master's offsets, pulled from the promoted one.
    ps, _rb, client, store, _rec, pr = setup()
    store.master_epochs[MQ] = 2
    client.api.results = [PullResult(PullStatus.NO_NEW_MSG, 7, 0, 7)]
    await ps.pull_once(pr)
    assert client.api.calls[0]["master_epoch"] == 2


async def test_the_offset_store_learns_the_master_epoch_of_a_kept_position_never_of_a_moved_one(
        autojump_clock: Any) -> None:
    # Commits carry it (chaos long ASYNC seed 12): a position the broker moved back was reached in the older epoch,
    # so a moved answer's newer epoch must not be stamped on the offset still held (the batch under way's).
    ps, _rb, client, store, _rec, pr = setup()
    kept = found(7, 5, 6)
    kept.master_epoch = 1
    client.api.results = [kept]
    await ps.pull_once(pr)
    assert store.master_epochs == {MQ: 1}
    moved = PullResult(PullStatus.OFFSET_ILLEGAL, 3, 0, 4)
    moved.master_epoch = 2
    client.api.results = [moved]
    await ps.pull_once(pr)
    assert store.master_epochs == {MQ: 1}


async def test_a_pulls_commit_offset_says_the_lock_epoch_it_was_consumed_under(autojump_clock: Any) -> None:
    # Long ASYNC seed 24: without it, a commit in a promoted master's restart grace ranked below an older one.
    ps, _rb, client, store, _rec, pr = setup()
    store.lock_epochs[MQ] = (3 << 32) | 7
    client.api.results = [found(7, 5, 6)]
    await ps.pull_once(pr)
    assert client.api.calls[-1]["commit_offset"] == 0 and client.api.calls[-1]["lock_epoch"] is None  # nothing stored
    store.update_offset(MQ, 5, False)
    client.api.results = [found(9, 7, 8)]
    await ps.pull_once(pr)
    assert client.api.calls[-1]["commit_offset"] == 5 and client.api.calls[-1]["lock_epoch"] == (3 << 32) | 7


async def test_flow_control_and_pause_and_errors(autojump_clock: Any) -> None:
    ps, rb, client, _store, _rec, pr = setup(pull_threshold_for_queue=1)
    pr.process_queue.put_message(msgs(1, 2))
    assert await ps.pull_once(pr) == 0.05
    assert client.api.calls == [] and ps.stats["flow_control"] == 1
    ps, rb, client, _store, _rec, pr = setup()
    ps.paused = True
    assert await ps.pull_once(pr) == 1.0
    ps.paused = False
    client.api.results = [RemotingTimeoutError("no response"), MQBrokerError(ResponseCode.SYSTEM_ERROR, "x")]
    assert await ps.pull_once(pr) == 3.0
    assert await ps.pull_once(pr) == 3.0
    assert ps.stats["errors"] == 2
    del rb.subscription_inner[T]
    assert await ps.pull_once(pr) == 3.0


async def test_orderly_pulls_only_while_locked_and_rereads_offset_first(autojump_clock: Any) -> None:
    ps, _rb, client, store, _rec, pr = setup(orderly=True)
    assert await ps.pull_once(pr) == 3.0  # not locked: wait
    assert client.api.calls == []
    pr.process_queue.locked = True
    store.stored[MQ] = 3  # the broker's stored offset is behind the in-memory one
    client.api.results = [found(4, 3)]
    await ps.pull_once(pr)
    assert client.api.calls[0]["queue_offset"] == 3 and pr.locked_first
    store.stored[MQ] = 0
    client.api.results = [found(5, 4)]
    await ps.pull_once(pr)
    assert client.api.calls[1]["queue_offset"] == 4  # re-read only once


class HAFakeClient(FakeClient):
    """A client with a master ("m:1") and a slave ("s:1") for broker-a (issue 15)."""

    def __init__(self) -> None:
        super().__init__()
        self.down: set[str] = set()
        self.failures: list[str] = []

    def find_broker_addr_in_subscribe(self, broker_name: str, broker_id: int = 0) -> tuple[str, int] | None:
        order = [(a, b) for a, b in (("m:1", 0), ("s:1", 1)) if b == broker_id] + [("m:1", 0), ("s:1", 1)]
        return next(((a, b) for a, b in order if a not in self.down), order[0])

    async def find_broker_addr_for_read(self, broker_name: str, broker_id: int = 0,
                                        topic: str | None = None) -> tuple[str, int] | None:
        return self.find_broker_addr_in_subscribe(broker_name, broker_id)

    def note_failure(self, addr: str, exc: BaseException) -> None:
        self.failures.append(addr)
        self.down.add(addr)

    def master_down(self, broker_name: str) -> bool:
        return "m:1" in self.down


async def test_a_pull_that_cannot_reach_the_master_goes_to_the_slave_at_once(autojump_clock: Any) -> None:
    ps, rb, _client, _store, _rec, pr = setup()
    client = HAFakeClient()
    ps.client = rb.client = client  # type: ignore[assignment]
    client.api.results = [RemotingConnectError("connection refused"), found(7, 5, 6),
                          PullResult(PullStatus.NO_NEW_MSG, 7, 0, 7, suggest_which_broker_id=0)]
    assert await ps.pull_once(pr) == 0.0  # no 3 s pause: the slave is listed
    assert client.failures == ["m:1"]
    await ps.pull_once(pr)
    assert pr.next_offset == 7 and ps.stats["from_slave"] == 1
    # the slave suggests the master (0): once it is back, reads return to it
    client.down.clear()
    await ps.pull_once(pr)
    assert ps.stats["from_slave"] == 1 and MQ not in ps.pull_from_which_node
    # a suggestion to read from broker id 1 is followed until another answer says otherwise
    client.api.results = [PullResult(PullStatus.NO_NEW_MSG, 7, 0, 7, suggest_which_broker_id=1),
                          PullResult(PullStatus.NO_NEW_MSG, 7, 0, 7)]
    await ps.pull_once(pr)
    assert ps.pull_from_which_node[MQ] == 1
    await ps.pull_once(pr)
    assert ps.stats["from_slave"] == 2


async def test_orderly_queues_of_a_broker_whose_master_is_down_pause_visibly(autojump_clock: Any) -> None:
    ps, rb, _client, _store, _rec, pr = setup(orderly=True)
    client = HAFakeClient()
    ps.client = rb.client = client  # type: ignore[assignment]
    client.down.add("m:1")
    with capture_logs() as logs:
        assert await ps.pull_once(pr) == 1.0
    assert client.api.calls == [] and ps.stats["paused_master_down"] == 1
    assert ps.info()["pausedMasterDown"] == [MQ.to_wire()]
    assert [e["event"] for e in logs] == ["pull.orderly_paused_master_down"]
    client.down.clear()  # back (not locked yet: the ordinary wait)
    assert await ps.pull_once(pr) == 3.0 and ps.info()["pausedMasterDown"] == []


async def test_dropped_queue_stops_the_loop(autojump_clock: Any) -> None:
    ps, _rb, _client, _store, _rec, pr = setup()
    pr.process_queue.dropped = True
    assert await ps.pull_once(pr) is None


async def test_offset_illegal_drops_then_fixes_offset_after_10s(autojump_clock: Any) -> None:
    ps, rb, client, store, _rec, pr = setup()
    client.api.results = [PullResult(PullStatus.OFFSET_ILLEGAL, 40, 40, 90)]
    t0 = trio.current_time()
    assert await ps.pull_once(pr) is None
    assert trio.current_time() - t0 == pytest.approx(10.0)
    assert pr.process_queue.dropped and MQ not in rb.process_queue_table
    assert MQ in store.persisted


async def test_offset_illegal_of_a_queue_taken_again_meanwhile_stores_nothing(autojump_clock: Any) -> None:
    # Long ASYNC chaos seed 19: a consumer resumed from a pause got OFFSET_ILLEGAL for a queue it had lost; during the
    # 10 s wait its rebalance took the queue again (a new process queue, consuming from the broker's offset). Storing
    # and persisting the old answer's offset then rewound the queue under the new lock grant.
    ps, rb, client, store, _rec, pr = setup()
    client.api.results = [PullResult(PullStatus.OFFSET_ILLEGAL, 40, 40, 90)]
    newer = ProcessQueue(0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ps.pull_once, pr)
        await trio.sleep(1)
        assert pr.process_queue.dropped
        rb.process_queue_table[MQ] = newer  # taken again; its owner consumes from 85
        store.update_offset(MQ, 85, False)
    assert rb.process_queue_table[MQ] is newer and not newer.dropped
    assert store.table.get(MQ) == 85 and MQ not in store.persisted


async def test_a_position_moved_back_by_a_newer_master_epoch_is_fixed_at_once(autojump_clock: Any) -> None:
    # After a failover that lost records the consumer had read, the broker moves its position back (its log began a
    # newer epoch than the pull's): nothing to let settle for 10 s.
    ps, rb, client, store, _rec, pr = setup()
    pr.master_epoch = 1
    moved = PullResult(PullStatus.OFFSET_ILLEGAL, 3, 0, 4)
    moved.master_epoch = 2
    client.api.results = [moved]
    t0 = trio.current_time()
    assert await ps.pull_once(pr) is None
    assert trio.current_time() - t0 < 0.1
    assert pr.process_queue.dropped and MQ not in rb.process_queue_table
    assert MQ in store.persisted and pr.next_offset == 3


async def test_orderly_a_moved_back_position_is_stored_after_the_batch_under_way(autojump_clock: Any) -> None:
    ps, rb, client, store, _rec, pr = setup(orderly=True)
    pr.master_epoch = 1
    moved = PullResult(PullStatus.OFFSET_ILLEGAL, 3, 0, 4)
    moved.master_epoch = 2
    client.api.results = [moved]
    pr.process_queue.locked = True
    pr.locked_first = True
    lock = rb.consume_lock(pr.process_queue)
    persisted: list[int | None] = []

    async def persist(mq: MessageQueue) -> None:
        persisted.append(store.table.get(mq))

    store.persist = persist  # type: ignore[method-assign]

    async def batch_under_way() -> None:
        async with lock:
            await trio.sleep(0.5)
            store.update_offset(MQ, 6, False)  # an orderly batch commits even on a dropped queue

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch_under_way)
        await trio.sleep(0.01)
        nursery.start_soon(ps.pull_once, pr)
    assert persisted and set(persisted) == {3}  # stored after the batch's commit, never overwritten by it


async def test_loops_run_until_cancelled(autojump_clock: Any) -> None:
    ps, _rb, client, _store, rec, pr = setup()
    client.api.results = [found(6, 5), *(PullResult(PullStatus.NO_NEW_MSG, 6, 0, 6) for _ in range(3))]

    async def slow_pull(addr: str, **kw: Any) -> PullResult:
        if not client.api.results:
            await trio.sleep_forever()  # a long poll held by the broker
        r = client.api.results.pop(0)
        assert isinstance(r, PullResult)
        return r

    client.api.pull_message = slow_pull  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        ps.bind(nursery)
        ps.start(pr)
        await trio.sleep(1)
        assert ps.active_loops == 1 and len(rec.submitted) == 1
        ps.cancel(pr.process_queue)  # the rebalance dropped the queue: the long poll is abandoned
    assert ps.active_loops == 0


async def test_resume_pulls_at_once_but_leaves_a_flow_control_nap_alone(autojump_clock: Any) -> None:
    # Before: resume() only cleared the flag, so a loop pulled up to pull_time_delay_mills_when_suspend (1 s) later.
    ps, _rb, client, _store, rec, pr = setup(pull_threshold_for_queue=1)
    client.api.results = [found(7, 5, 6)]
    ps.paused = True
    async with trio.open_nursery() as nursery:
        ps.bind(nursery)
        ps.start(pr)
        await trio.sleep(0.5)  # the loop naps out the pause's 1 s
        assert client.api.calls == []
        resumed = trio.current_time()
        ps.resume()
        while not rec.submitted:
            await trio.sleep(0.001)
        assert trio.current_time() - resumed < 0.1  # not at the end of the pause's nap (0.5 s away)
        # the queue now holds 2 messages over its threshold of 1: flow control naps 50 ms, which resume() keeps
        await trio.sleep(0.01)
        assert ps.stats["flow_control"] == 1
        ps.resume()
        await trio.sleep(0.03)
        assert ps.stats["flow_control"] == 1  # the nap ran on
        await trio.sleep(0.03)
        assert ps.stats["flow_control"] == 2
        ps.cancel(pr.process_queue)
