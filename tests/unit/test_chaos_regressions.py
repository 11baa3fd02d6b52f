"""Regression tests for the bugs the chaos suite (tests/chaos/) found, each reduced to its cause.

* A consumer paused past its lock (or cut off by a broker restart) that locked its queue again went on from
  its cached messages and in-memory offset, although another client had consumed the queue meanwhile: it
  re-consumed those messages and committed an offset behind the other client's (a rewind). The broker now
  says which re-locked queues nobody else held (``keptMQSet``); the client drops any other re-locked process
  queue and re-creates it from the committed offset. Lock renewals are stamped with the request's send time.
* The orderly loop's lock check and the listener call were separated by waits (the consume limiter, hooks):
  the lock is checked again right before the listener runs.
* (Offsets: a pull's stale commit offset and overlapping UPDATE_CONSUMER_OFFSETs rewinding a queue are in
  tests/unit/test_offsets.py and tests/unit/test_offset_store.py.)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import trio

from trimq.broker.locks import RebalanceLockManager
from trimq.client.config import PushConsumerConfig
from trimq.client.consume.common import ConsumeOrderlyStatus
from trimq.client.consume.orderly import ConsumeMessageOrderlyService
from trimq.client.offset_store import ReadOffsetType
from trimq.client.process_queue import ProcessQueue
from trimq.client.rebalance.impl import PullRequest, RebalanceImpl
from trimq.client.rebalance.strategies import get_strategy
from trimq.client.subscription import build_subscription_data
from trimq.protocol.message import MessageExt
from trimq.protocol.message_queue import MessageQueue

G, T, ME = "g", "Orders", "10.0.0.1@1"


def mq(q: int) -> MessageQueue:
    return MessageQueue(T, "broker-a", q)


def msg(offset: int) -> MessageExt:
    return MessageExt(topic=T, body=b"x", flag=0, properties={}, queue_id=0, queue_offset=offset,
                      commit_log_offset=offset, sys_flag=0, born_timestamp=0, born_host=("127.0.0.1", 1),
                      store_timestamp=0, store_host=("127.0.0.1", 2), reconsume_times=0,
                      prepared_transaction_offset=0, body_crc=0, store_size=10, msg_id=f"ID{offset}")


# --- the broker's view: which re-locked queues nobody else held -------------------------------------------


def test_lock_batch_reports_the_queues_nobody_else_held() -> None:
    now = [0]
    locks = RebalanceLockManager(max_live_ms=3000, now_ms=lambda: now[0])
    r = locks.try_lock_batch_detailed(G, [mq(0), mq(1), mq(2)], "A")
    assert r.locked == {mq(0), mq(1), mq(2)} and r.kept == set()  # new entries
    now[0] = 1000
    assert locks.try_lock_batch_detailed(G, [mq(0)], "A").kept == {mq(0)}  # renewed
    now[0] = 5000  # every lock of A lapsed
    r = locks.try_lock_batch_detailed(G, [mq(1)], "B")  # B steals mq(1)
    assert r.stolen == {mq(1): "A"} and r.kept == set()
    locks.unlock_batch(G, [mq(1)], "B")
    r = locks.try_lock_batch_detailed(G, [mq(0), mq(1), mq(2)], "A")
    # mq(0) and mq(2): A's own lapsed entries, untouched; mq(1): B held it meanwhile.
    assert r.locked == {mq(0), mq(1), mq(2)} and r.kept == {mq(0), mq(2)}


# --- the client: a re-locked queue that someone else may have consumed is re-created -------------------------


class FakeApi:
    def __init__(self) -> None:
        self.others: set[MessageQueue] = set()  # locked by another client
        self.not_kept: set[MessageQueue] = set()  # held again, but someone else held it meanwhile
        self.delay_s = 0.0
        self.detailed = True

    async def lock_batch_mq_detailed(self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue], *,
                                     timeout_ms: Any = None) -> tuple[set[MessageQueue], set[MessageQueue] | None]:
        await trio.sleep(self.delay_s)
        held = {m for m in mqs if m not in self.others}
        return held, (held - self.not_kept) if self.detailed else None

    async def lock_batch_mq(self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue], *,
                            timeout_ms: Any = None) -> set[MessageQueue]:
        return (await self.lock_batch_mq_detailed(addr, group, cid, mqs))[0]

    async def unlock_batch_mq(self, *args: Any, **kw: Any) -> None: ...


class FakeClient:
    client_id = ME

    def __init__(self) -> None:
        self.api = FakeApi()

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        return "127.0.0.1:10911"

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None:
        return [ME]

    async def max_offset(self, m: MessageQueue) -> int:
        return 0

    async def search_offset(self, m: MessageQueue, ts: int) -> int:
        return 0

    async def send_heartbeat_to_all_brokers(self) -> None: ...


class FakeOffsets:
    def __init__(self) -> None:
        self.memory: dict[MessageQueue, int] = {}
        self.stored: dict[MessageQueue, int] = {}

    async def load(self) -> None: ...

    def update_offset(self, m: MessageQueue, offset: int, increase_only: bool) -> None:
        self.memory[m] = offset

    async def read_offset(self, m: MessageQueue, type: ReadOffsetType) -> int:
        return self.stored.get(m, -1)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, m: MessageQueue) -> None: ...

    def remove_offset(self, m: MessageQueue) -> None:
        self.memory.pop(m, None)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return {}


class FakePulls:
    def __init__(self) -> None:
        self.started: list[PullRequest] = []

    def start(self, request: PullRequest) -> None:
        self.started.append(request)

    def cancel(self, process_queue: ProcessQueue) -> None: ...


def make() -> tuple[RebalanceImpl, FakeClient, FakeOffsets, FakePulls, list[int]]:
    client, offsets, pulls = FakeClient(), FakeOffsets(), FakePulls()
    fake: Any = client
    rb = RebalanceImpl(consumer_group=G, config=PushConsumerConfig(consumer_group=G), strategy=get_strategy("AVG"),
                       client=fake, offset_store=offsets, consume_orderly=True, pull_service=pulls)
    rb.subscription_inner[T] = build_subscription_data(T, "*")
    rb.topic_subscribe_info_table[T] = {mq(0), mq(1)}
    wakeups: list[int] = []
    rb.on_stale_queue = lambda: wakeups.append(1)
    return rb, client, offsets, pulls, wakeups


async def test_relocked_queue_someone_else_held_is_recreated_from_the_committed_offset(autojump_clock: Any) -> None:
    rb, client, offsets, pulls, wakeups = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, True)
    old = rb.process_queue_table[mq(0)]
    old.put_message([msg(10), msg(11)])
    offsets.memory[mq(0)] = 10  # what this client had consumed before it was paused
    # Paused past its lock: another client took mq(0) over and committed 40; now this client locks it again.
    client.api.not_kept = {mq(0)}
    offsets.stored[mq(0)] = 40
    await rb.lock_all()
    assert old.dropped and mq(0) not in rb.process_queue_table and mq(0) not in offsets.memory
    assert rb.stale_queues_dropped == 1 and wakeups == [1]
    assert rb.process_queue_table[mq(1)].locked and not rb.process_queue_table[mq(1)].dropped  # kept: untouched
    # The rebalance it asked for re-creates the queue from the committed offset, not from the stale cache.
    client.api.not_kept = set()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, True)
    assert rb.process_queue_table[mq(0)] is not old and pulls.started[-1].next_offset == 40


async def test_kept_lock_survives_a_late_renewal(autojump_clock: Any) -> None:
    # The broker says nobody else held it: a renewal the client itself thinks late (CPU stall) changes nothing.
    rb, _client, _, _, wakeups = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    pq = rb.process_queue_table[mq(0)]
    await trio.sleep(45)  # past the client's 30 s lock lifetime
    assert pq.is_lock_expired(rb.clock())
    await rb.lock_all()
    assert rb.process_queue_table[mq(0)] is pq and pq.locked and not pq.is_lock_expired(rb.clock())
    assert wakeups == []


async def test_without_broker_help_a_lapsed_lock_is_not_trusted(autojump_clock: Any) -> None:
    # A broker that does not send keptMQSet (RocketMQ): the client's own view decides.
    rb, client, _, _, _ = make()
    client.api.detailed = False
    await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1)}, True)
    await trio.sleep(10)
    await rb.lock_all()  # on time: renewed
    assert rb.process_queue_table[mq(0)].locked
    await trio.sleep(31)
    await rb.lock_all()  # too late: someone may have taken and released the queues meanwhile
    assert rb.process_queue_table == {}


async def test_lock_renewal_is_stamped_with_the_send_time(autojump_clock: Any) -> None:
    # A renewal whose answer arrives late (the client was paused in between) must not make the lock look
    # younger than the broker's: the stamp is when the request left.
    rb, client, _, _, _ = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    pq = rb.process_queue_table[mq(0)]
    client.api.delay_s = 5.0
    sent = rb.clock()
    await rb.lock_all()
    assert rb.clock() - sent >= 5000 and pq.last_lock_timestamp == sent


# --- the orderly loop: the lock is checked again right before the listener ------------------------------------


class OrderlyRebalance:
    def __init__(self) -> None:
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self.clustering = True
        self.lock_calls = 0
        self._locks: weakref.WeakKeyDictionary[ProcessQueue, trio.Lock] = weakref.WeakKeyDictionary()

    def consume_lock(self, pq: ProcessQueue) -> trio.Lock:
        return self._locks.setdefault(pq, trio.Lock())

    async def lock(self, m: MessageQueue) -> bool:
        self.lock_calls += 1
        return False


class Offsets:
    def __init__(self) -> None:
        self.updates: list[int] = []

    def update_offset(self, m: MessageQueue, offset: int, increase_only: bool) -> None:
        self.updates.append(offset)


async def test_listener_does_not_run_once_the_lock_lapsed_while_waiting(autojump_clock: Any) -> None:
    def now() -> int:
        return int(trio.current_time() * 1000)

    consumed: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: Any) -> ConsumeOrderlyStatus:
        consumed.extend(m.queue_offset for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    config = PushConsumerConfig(consumer_group=G, consume_thread_min=1, consume_thread_max=1)
    svc = ConsumeMessageOrderlyService(G, config, listener, clock=now)
    rebalance, offsets = OrderlyRebalance(), Offsets()
    svc.attach(rebalance=rebalance, offset_store=offsets, client=FakeClient())  # type: ignore[arg-type]
    pq = ProcessQueue(now(), lock_max_live_time_ms=2000)
    pq.locked = True
    pq.put_message([msg(0), msg(1)])
    rebalance.process_queue_table[mq(0)] = pq
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.limiter.acquire()  # the only consume slot is busy (another queue's listener)
        nursery.start_soon(svc.consume_request, pq, mq(0))
        await trio.sleep(5)  # meanwhile the lock lapses (the process was paused, say)
        svc.limiter.release()
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert consumed == [] and offsets.updates == []
    assert [m.queue_offset for m in pq.messages()] == [0, 1] and pq.consuming_messages() == []
    assert rebalance.lock_calls >= 1  # it tries to lock the queue again instead


# --- the orderly load producer: a broker down stalls only its own queues' keys -----------------------------


def test_orderly_key_shares_give_each_worker_one_queue() -> None:
    from trimq.client.selectors import select_by_hash
    from trimq.tools.producer import orderly_key_shares
    from trimq.tools.records import key_name

    mqs = [MessageQueue(T, b, q) for b in ("broker-a", "broker-b") for q in range(4)]
    for keys, workers in ((200, 32), (5, 64), (1000, 3), (1, 1)):
        shares = orderly_key_shares(mqs, keys, workers, select_by_hash)
        dealt = sorted(k for _, ks in shares for k in ks)
        assert dealt == list(range(keys))
        assert len(shares) <= max(workers, len({select_by_hash(mqs, None, key_name(k, keys)) for k in range(keys)}))
        for q, ks in shares:
            assert ks == sorted(ks) and all(select_by_hash(mqs, None, key_name(k, keys)) == q for k in ks)


async def test_orderly_producer_keeps_sending_to_live_brokers(autojump_clock: Any) -> None:
    from trimq.client.api import SendResult, SendStatus
    from trimq.tools.producer import LoadProducer, ProducerOptions

    mqs = [MessageQueue(T, b, q) for b in ("broker-a", "broker-b") for q in range(2)]
    sent: list[tuple[float, MessageQueue, str, int]] = []
    offsets: dict[MessageQueue, int] = {}

    class Producer:
        async def message_queues(self, topic: str) -> list[MessageQueue]:
            return mqs

        async def send(self, m: Any, message_queue: MessageQueue) -> SendResult:
            await trio.sleep(0.001)
            if message_queue.broker_name == "broker-b" and trio.current_time() < 5:
                raise ConnectionError("broker-b is down")
            off = offsets.get(message_queue, 0)
            offsets[message_queue] = off + 1
            sent.append((trio.current_time(), message_queue, m.keys, off))
            return SendResult(SendStatus.SEND_OK, f"id{len(sent)}", message_queue, off)

    opts = ProducerOptions(topic=T, count=400, keys=20, orderly=True, inflight=8)
    summary = await LoadProducer(Producer(), opts).run()
    assert summary.sent == 400 and summary.failed == 0
    early_a = [s for s in sent if s[0] < 5]
    assert early_a and all(s[1].broker_name == "broker-a" for s in early_a)  # broker-a keys did not wait
    assert len({s[2] for s in early_a}) == len({k for t, q, k, _ in sent if q.broker_name == "broker-a"})


async def test_lock_batch_over_the_wire_says_which_queues_were_kept(tmp_path: Any) -> None:
    # The broker's keptMQSet, as the client API reads it (a real broker on a socket).
    from trimq.broker.broker import open_broker
    from trimq.broker.config import BrokerConfig
    from trimq.client.api import MQClientAPI
    from trimq.runtime.client import RemotingClient

    # RocketMQ's clocks: these bare clients never heartbeat, which the lease profile requires of a lock holder
    # (membership follows the lease, tests/integration/test_leases.py); keptMQSet is the same in both.
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"), lock_profile="rocketmq")
    async with open_broker(config) as broker, RemotingClient(default_timeout_s=10) as rc:
        api, addr = MQClientAPI(rc), broker.address
        held, kept = await api.lock_batch_mq_detailed(addr, G, "A", [mq(0), mq(1)])
        assert held == {mq(0), mq(1)} and kept == set()  # new locks
        held, kept = await api.lock_batch_mq_detailed(addr, G, "A", [mq(0), mq(1)])
        assert kept == {mq(0), mq(1)}  # renewed: nobody else held them
        await api.unlock_batch_mq(addr, G, "A", [mq(1)])
        assert (await api.lock_batch_mq_detailed(addr, G, "B", [mq(0), mq(1)]))[0] == {mq(1)}
        await api.unlock_batch_mq(addr, G, "B", [mq(1)])
        held, kept = await api.lock_batch_mq_detailed(addr, G, "A", [mq(0), mq(1)])
        assert held == {mq(0), mq(1)} and kept == {mq(0)}  # B held mq(1) meanwhile
        assert await api.lock_batch_mq(addr, G, "A", [mq(0)]) == {mq(0)}  # the plain call still works
