"""Key scope (issue 17): the KeyBacklog core, the ConsumeLock, the ProcessQueue's completed prefix, and the keyed
consume service with a fake network on MockClock.

* per-key order under random listener delays and failures (hypothesis): no two messages of one key in the listener
  at once, each key's deliveries in queue order, every committed offset at or below the first incomplete message;
* a poison key goes to the DLQ after ``max_reconsume_times`` (16 by default in key scope) while the other keys flow;
* a takeover mid-flight (the owner stops at a random moment, a new owner starts from the committed offset) replays
  only from the committed prefix, and per-key order among first deliveries holds across the two owners.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.consume_fakes import FakeApi, FakeClient
from trimq.client.config import PushConsumerConfig
from trimq.client.consume.common import ConsumeOrderlyContext, ConsumeOrderlyStatus
from trimq.client.consume.orderly_keyed import ConsumeMessageKeyedService
from trimq.client.consume_lock import ConsumeLock
from trimq.client.errors import MQClientError
from trimq.client.key_backlog import KeyBacklog, message_key
from trimq.client.process_queue import ProcessQueue
from trimq.client.pull import flow_control_reason
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue

G, T = "kg", "Orders"
MQ = MessageQueue(T, "broker-a", 0)
S = ConsumeOrderlyStatus


def msg(offset: int, key: str | None, *, keys: str | None = None) -> MessageExt:
    props: dict[str, str] = {}
    if key is not None:
        props[MessageConst.SHARDING_KEY] = key
    if keys is not None:
        props[MessageConst.KEYS] = keys
    return MessageExt(topic=T, body=b"x", flag=0, properties=props, queue_id=0, queue_offset=offset,
                      commit_log_offset=1000 + offset, sys_flag=0, born_timestamp=0, born_host=("127.0.0.1", 1),
                      store_timestamp=0, store_host=("127.0.0.1", 10911), reconsume_times=0,
                      prepared_transaction_offset=0, body_crc=0, store_size=0, msg_id=f"ID{offset:04d}")


# --- the pure parts -----------------------------------------------------------------------------------------


def test_message_key_is_the_sharding_key_else_keys_else_one_key() -> None:
    assert message_key(msg(0, "order-7", keys="k1 k2")) == "order-7"
    assert message_key(msg(0, None, keys="k1 k2")) == "k1 k2"
    assert message_key(msg(0, None)) == ""


def test_backlog_takes_the_oldest_ready_key_one_turn_per_key() -> None:
    b = KeyBacklog()
    assert b.add([msg(0, "a"), msg(1, "b"), msg(2, "a"), msg(3, "c"), msg(4, "b")]) == 5
    assert b.add([msg(2, "a")]) == 0  # known
    t1 = b.take()
    assert t1 is not None and (t1.key, [m.queue_offset for m in t1.msgs]) == ("a", [0])
    t2 = b.take()
    assert t2 is not None and t2.key == "b"
    t3 = b.take()
    assert t3 is not None and t3.key == "c"
    assert b.take() is None and b.turns == 3  # "a" and "b" have a turn: their next messages wait
    b.release(t2)  # not consumed (e.g. the lease lapsed): back at the head of "b"
    t4 = b.take(max_batch=5)
    assert t4 is not None and t4.key == "b" and [m.queue_offset for m in t4.msgs] == [1, 4]
    assert b.finish(t1) and not b.finish(t1)
    t5 = b.take()
    assert t5 is not None and [m.queue_offset for m in t5.msgs] == [2]
    assert len(b) == 4  # 2, 3, 1, 4 uncompleted
    b.drop(t4, [t4.msgs[0]])
    assert [m.queue_offset for m in t4.msgs] == [4] and 1 not in b
    found = b.discard(4)  # an operator skips the rest of "b"'s turn: the key is free again
    assert found is not None and found[0] == "b" and b.turn("b") is None
    assert b.discard(99) is None


def test_backlog_out_of_order_add_keeps_queue_order() -> None:
    b = KeyBacklog()
    b.add([msg(5, "a"), msg(7, "a")])
    b.add([msg(3, "a")])  # the broker re-sent an older message (offset went back)
    t = b.take(3)
    assert t is not None and [m.queue_offset for m in t.msgs] == [3, 5, 7]


async def test_consume_lock_shared_and_exclusive(autojump_clock: trio.testing.MockClock) -> None:
    lock = ConsumeLock()
    lock.acquire_shared_nowait()
    lock.acquire_shared_nowait()
    got: list[str] = []

    async def exclusive() -> None:
        async with lock:
            got.append("exclusive")
            await trio.sleep(1)

    async def late_shared() -> None:
        await trio.sleep(0.5)
        async with lock.shared():  # held back by the waiting exclusive (writer preference)
            got.append("shared")

    async with trio.open_nursery() as n:
        n.start_soon(exclusive)
        n.start_soon(late_shared)
        await trio.sleep(1)
        assert got == [] and lock.locked()
        lock.release_shared()
        lock.release_shared()
    assert got == ["exclusive", "shared"]
    # an exclusive wait that gives up lets the shared waiters through
    lock.acquire_shared_nowait()
    with trio.move_on_after(1):
        await lock.acquire()
    lock.acquire_shared_nowait()
    assert lock.shared_holders == 2
    with pytest.raises(RuntimeError):
        lock.release()


def test_completed_prefix_and_span_flow_control_in_key_scope() -> None:
    pq = ProcessQueue(0)
    pq.put_message([msg(o, "k" if o == 0 else f"x{o}") for o in range(10)])
    backlog = pq.enable_key_scope()
    assert len(backlog) == 10
    assert pq.complete([msg(o, "x") for o in range(1, 10)], 0) == 0  # offset 0 pins the prefix
    assert pq.completed_prefix() == 0 and pq.msg_count == 1
    pq.put_message([msg(5000, "y")])
    cfg = PushConsumerConfig(consumer_group=G, order_scope="key")
    assert flow_control_reason(pq, cfg, True) == "span"  # a stuck key stops the pull past the span limit
    assert flow_control_reason(pq, PushConsumerConfig(consumer_group=G), True) is None  # queue scope: no span rule
    assert pq.complete([msg(0, "k"), msg(5000, "y")], 0) == 5001
    assert pq.completed_prefix() is None
    pq.clear()
    assert len(backlog) == 0 and pq.complete([msg(5001, "y")], 0) == -1  # a reset emptied it: nothing to commit
    # backpressure: a blocked key's waiting messages count in the cache, so the pull pauses as in queue scope
    small = PushConsumerConfig(consumer_group=G, order_scope="key", pull_threshold_for_queue=100)
    pq.put_message([msg(o, "stuck") for o in range(10_000, 10_101)])
    assert flow_control_reason(pq, small, True) == "count"


# --- the service ----------------------------------------------------------------------------------------------


class FakeRebalance:
    def __init__(self, clock: Callable[[], int]) -> None:
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self.clock = clock
        self._locks: weakref.WeakKeyDictionary[ProcessQueue, ConsumeLock] = weakref.WeakKeyDictionary()
        self.epoch = 7

    @property
    def clustering(self) -> bool:
        return True

    def consume_lock(self, pq: ProcessQueue) -> ConsumeLock:
        return self._locks.setdefault(pq, ConsumeLock())

    def lock_epoch(self, mq: MessageQueue) -> int:
        return self.epoch

    async def lock(self, mq: MessageQueue) -> bool:
        pq = self.process_queue_table.get(mq)
        if pq is not None:
            pq.locked = True
            pq.last_lock_timestamp = self.clock()
        return True


class CheckedOffsets:
    """The offset store, checking every commit against what the test knows is complete."""

    def __init__(self, *complete: set[int]) -> None:
        self.complete = complete  # consumed, dead-lettered, ...
        self.updates: list[int] = []

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        missing = [o for o in range(offset) if not any(o in c for c in self.complete)]
        assert not missing, f"committed {offset} while {missing[:5]} were not complete"
        self.updates.append(offset)


def now_ms() -> int:
    return int(trio.current_time() * 1000)


def make_service(listener: Any, offsets: Any, **cfg: Any) -> ConsumeMessageKeyedService:
    cfg.setdefault("suspend_current_queue_time_millis", 100)
    config = PushConsumerConfig(consumer_group=G, order_scope="key", **cfg)
    svc = ConsumeMessageKeyedService(G, config, listener, clock=now_ms, wall_clock=lambda: 1_700_000_000_000)
    svc.attach(rebalance=FakeRebalance(now_ms), offset_store=offsets, client=FakeClient())  # type: ignore[arg-type]
    return svc


def new_pq(svc: ConsumeMessageKeyedService) -> ProcessQueue:
    pq = ProcessQueue(now_ms(), lock_max_live_time_ms=10**9)
    pq.locked = True
    assert svc.rebalance is not None
    svc.rebalance.process_queue_table[MQ] = pq
    return pq


def feed(svc: ConsumeMessageKeyedService, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
    """What the pull loop does with a pull's messages."""
    dispatch = pq.put_message(msgs)
    svc.submit(pq, msgs, dispatch, MQ)


class Recorder:
    """A listener recording what it sees and checking the per-key rules as it runs."""

    def __init__(self, msgs: list[MessageExt], delays: dict[int, float], fail_first: set[int],
                 poison: frozenset[str] = frozenset()) -> None:
        self.by_key: dict[str, list[int]] = {}
        for m in msgs:
            self.by_key.setdefault(message_key(m), []).append(m.queue_offset)
        self.delays = delays
        self.fail_first = set(fail_first)
        self.poison = poison
        self.active: set[str] = set()
        self.peak = 0
        self.calls: list[tuple[str, int]] = []  # (key, offset) per delivery
        self.done: set[int] = set()  # offsets that returned SUCCESS
        self.dead: set[int] = set()  # offsets the test knows were dead-lettered
        self.epochs: set[int | None] = set()

    async def __call__(self, msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        keys = {message_key(m) for m in msgs}
        assert len(keys) == 1, "a batch holds one key"
        (key,) = keys
        assert key not in self.active, f"two batches of key {key!r} in the listener at once"
        # strictly in queue order per key: the batch is the key's next uncompleted messages (a retry: the same ones)
        offs = [m.queue_offset for m in msgs]
        remaining = [o for o in self.by_key[key] if o not in self.done and o not in self.dead]
        assert offs == remaining[:len(offs)], f"key {key!r} got {offs}, its next messages are {remaining[:3]}"
        self.active.add(key)
        self.peak = max(self.peak, len(self.active))
        self.epochs.add(ctx.lock_epoch)
        try:
            for m in msgs:
                self.calls.append((key, m.queue_offset))
            await trio.sleep(sum(self.delays.get(m.queue_offset, 0.0) for m in msgs))
            if key in self.poison:
                return S.SUSPEND_CURRENT_QUEUE_A_MOMENT
            if any(m.queue_offset in self.fail_first for m in msgs):
                self.fail_first -= {m.queue_offset for m in msgs}
                raise RuntimeError("transient failure")
            self.done.update(m.queue_offset for m in msgs)
            return S.SUCCESS
        finally:
            self.active.discard(key)


def assert_every_key_delivered(calls: list[tuple[str, int]], msgs: list[MessageExt]) -> None:
    """Each key's distinct deliveries are exactly its messages, first delivered in queue order."""
    per_key: dict[str, list[int]] = {}
    for key, off in calls:
        if off not in per_key.setdefault(key, []):
            per_key[key].append(off)
    for key, offs in per_key.items():
        assert offs == sorted(m.queue_offset for m in msgs if message_key(m) == key), (key, offs)


KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f", None])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(KEYS, min_size=1, max_size=40), seed=st.integers(0, 2**32 - 1),
       batch=st.integers(1, 3), slots=st.integers(1, 6))
def test_per_key_order_under_random_delays(keys: list[str | None], seed: int, batch: int, slots: int) -> None:
    rng = random.Random(seed)
    msgs = [msg(o, k) for o, k in enumerate(keys)]
    delays = {o: rng.choice([0.0, 0.001, 0.005, 0.02, 0.1]) for o in range(len(msgs))}
    fail_first = {o for o in range(len(msgs)) if rng.random() < 0.15}
    chunks = sorted(rng.sample(range(1, len(msgs)), min(3, len(msgs) - 1))) if len(msgs) > 1 else []

    async def main() -> None:
        rec = Recorder(msgs, delays, fail_first)
        offsets = CheckedOffsets(rec.done)
        svc = make_service(rec, offsets, consume_message_batch_max_size=batch, max_in_flight_keys=slots)
        pq = new_pq(svc)
        async with trio.open_nursery() as nursery:
            svc.bind(nursery)
            lo = 0
            for hi in [*chunks, len(msgs)]:  # pulls arrive in pieces, while keys are in the listener
                feed(svc, pq, msgs[lo:hi])
                lo = hi
                await trio.sleep(rng.choice([0.0, 0.003, 0.05]))
            with trio.fail_after(60):
                while len(rec.done) < len(msgs):
                    await trio.sleep(0.01)
        assert_every_key_delivered(rec.calls, msgs)
        assert rec.peak <= slots
        assert offsets.updates and offsets.updates[-1] == len(msgs)  # everything committed in the end
        assert rec.epochs == {7}  # every batch ran under the queue lock's fencing epoch
        assert pq.msg_count == 0 and len(pq.key_backlog or ()) == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_poison_key_goes_to_the_dlq_while_other_keys_continue(autojump_clock: trio.testing.MockClock) -> None:
    msgs = [msg(o, "bad" if o in (2, 6) else f"k{o % 3}") for o in range(12)]
    rec = Recorder(msgs, {}, set(), poison=frozenset({"bad"}))
    offsets = CheckedOffsets(rec.done, rec.dead)
    svc = make_service(rec, offsets, suspend_current_queue_time_millis=1000)
    assert svc.max_reconsume_times == 16  # key scope: -1 is 16, not unbounded
    api = svc.send_back.client.api if svc.send_back is not None else None
    assert isinstance(api, FakeApi)
    send_back = api.consumer_send_msg_back

    async def dead_letter(addr: str, **kw: Any) -> None:
        await send_back(addr, **kw)
        rec.dead.add(kw["commit_log_offset"] - 1000)  # completed by its dead letter: commits may pass it

    api.consumer_send_msg_back = dead_letter  # type: ignore[method-assign]
    pq = new_pq(svc)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        feed(svc, pq, msgs)
        await trio.sleep(0.5)
        # every other key went on while "bad" is suspended; the committed offset stays at the poison message
        others = {m.queue_offset for m in msgs if message_key(m) != "bad"}
        assert others <= rec.done
        assert offsets.updates[-1] == 2
        [blocked] = svc.blocked_key_list()
        assert (blocked.key, blocked.offset, blocked.attempts) == ("bad", 2, 1)
        assert svc.blocked_key_counts() == {MQ: 1}
        assert blocked.to_wire(now_ms())["key"] == "bad"
        await trio.sleep(40)
        nursery.cancel_scope.cancel()
    assert [c for c in rec.calls if c[0] == "bad"] == [("bad", 2)] * 17 + [("bad", 6)] * 17
    assert [(sb["origin_msg_id"], sb["reconsume_times"], sb["delay_level"]) for sb in api.send_backs] == [
        ("ID0002", 16, -1), ("ID0006", 16, -1)]
    assert offsets.updates[-1] == 12 and svc.blocked_key_list() == []


async def test_skip_frees_a_suspended_key(autojump_clock: trio.testing.MockClock) -> None:
    msgs = [msg(0, "bad"), msg(1, "bad"), msg(2, "ok")]
    rec = Recorder(msgs, {}, set(), poison=frozenset({"bad"}))
    offsets = CheckedOffsets(rec.done)
    svc = make_service(rec, offsets, suspend_current_queue_time_millis=5000)
    pq = new_pq(svc)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        feed(svc, pq, msgs)
        await trio.sleep(1)
        with pytest.raises(MQClientError, match="not cached"):
            await svc.skip_message(MQ, pq, 99)
        rec.done.add(0)
        result = await svc.skip_message(MQ, pq, 0, "test")
        assert result["key"] == "bad" and result["nextOffset"] == 1
        rec.poison = frozenset()
        await trio.sleep(0.5)  # "bad" moves on at once, not after the rest of its 5 s pause
        assert 1 in rec.done and offsets.updates[-1] == 3
        nursery.cancel_scope.cancel()
    assert svc.stats.skipped == 1


async def test_lapsed_lease_starts_nothing_and_gives_batches_back(autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    rec = Recorder([msg(0, "a"), msg(1, "b"), msg(2, "b"), msg(3, "c")], {0: 1.0}, set())
    offsets = CheckedOffsets(rec.done)
    svc = make_service(rec, offsets)
    pq = new_pq(svc)
    pq.lock_max_live_time_ms = 500
    assert svc.rebalance is not None
    relocks: list[int] = []
    real_lock = svc.rebalance.lock

    async def lock(mq: MessageQueue) -> bool:
        relocks.append(now_ms())
        await gate.wait()
        return await real_lock(mq)

    svc.rebalance.lock = lock  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        feed(svc, pq, [msg(0, "a"), msg(1, "b")])
        await trio.sleep(0.6)  # the lease (500 ms) runs out while "a" is in the listener
        assert {c[1] for c in rec.calls} == {0, 1}
        feed(svc, pq, [msg(2, "b"), msg(3, "c")])
        await trio.sleep(1.0)
        assert {c[1] for c in rec.calls} == {0, 1}  # nothing new started after the lease
        assert 0 in rec.done and relocks  # the batch under way finished; the queue asks for its lock again
        gate.set()
        await trio.sleep(1)
        assert rec.done == {0, 1, 2, 3}
        nursery.cancel_scope.cancel()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(KEYS, min_size=2, max_size=30), seed=st.integers(0, 2**32 - 1))
def test_takeover_mid_flight_replays_only_from_the_committed_prefix(keys: list[str | None], seed: int) -> None:
    rng = random.Random(seed)
    msgs = [msg(o, k) for o, k in enumerate(keys)]
    delays = {o: rng.choice([0.001, 0.01, 0.05, 0.2]) for o in range(len(msgs))}
    crash_at = rng.uniform(0.0, 0.3)

    async def main() -> None:
        # The first owner consumes until it stops at a random moment, in the middle of its batches: what it was
        # consuming is abandoned, nothing more is committed (its process dies).
        first = Recorder(msgs, delays, set())
        offsets = CheckedOffsets(first.done)
        svc = make_service(first, offsets, max_in_flight_keys=4)
        pq = new_pq(svc)
        async with trio.open_nursery() as nursery:
            svc.bind(nursery)
            feed(svc, pq, msgs)
            await trio.sleep(crash_at)
            nursery.cancel_scope.cancel()
        committed = offsets.updates[-1] if offsets.updates else 0
        incomplete = [o for o in range(len(msgs)) if o not in first.done]
        assert committed <= (incomplete[0] if incomplete else len(msgs))
        # The next owner starts from the committed offset, as the broker serves it.
        second = Recorder(msgs, delays, set())
        second.done |= set(range(committed))
        offsets2 = CheckedOffsets(second.done)
        svc2 = make_service(second, offsets2)
        pq2 = new_pq(svc2)
        async with trio.open_nursery() as nursery:
            svc2.bind(nursery)
            feed(svc2, pq2, msgs[committed:])
            with trio.fail_after(60):
                while len(second.done) < len(msgs):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        replayed = {o for _, o in second.calls} & {o for _, o in first.calls}
        assert all(o >= committed for o in replayed)  # nothing below the committed prefix comes again
        assert_every_key_delivered(second.calls, msgs[committed:])
        # per key, first deliveries over both owners are in queue order
        firsts: dict[str, list[int]] = {}
        seen: set[int] = set()
        for key, off in first.calls + second.calls:
            if off not in seen:
                seen.add(off)
                firsts.setdefault(key, []).append(off)
        for key, offs in firsts.items():
            assert offs == sorted(offs), (key, offs)
        assert seen == set(range(len(msgs)))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_shutdown_ends_suspensions_and_commits_nothing_failed(autojump_clock: trio.testing.MockClock) -> None:
    rec = Recorder([msg(0, "bad"), msg(1, "ok")], {}, set(), poison=frozenset({"bad"}))
    offsets = CheckedOffsets(rec.done)
    svc = make_service(rec, offsets, suspend_current_queue_time_millis=30_000)
    pq = new_pq(svc)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        feed(svc, pq, [msg(0, "bad"), msg(1, "ok")])
        await trio.sleep(1)
        start = trio.current_time()
        assert await svc.drain()
        assert trio.current_time() - start < 1  # the 30 s suspension does not hold the shutdown
    assert offsets.updates == [0] and rec.done == {1}
    api = svc.send_back.client.api if svc.send_back is not None else None
    assert isinstance(api, FakeApi) and api.send_backs == []


async def test_seal_abandons_a_hung_listener_call_and_commits_nothing(autojump_clock: trio.testing.MockClock) -> None:
    async def hang(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        if message_key(msgs[0]) == "hung":
            await trio.sleep_forever()
        return S.SUCCESS

    offsets = CheckedOffsets({1})
    svc = make_service(hang, offsets)
    pq = new_pq(svc)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        feed(svc, pq, [msg(0, "hung"), msg(1, "ok")])
        await trio.sleep(1)
        assert svc.in_flight == 1
        assert not await svc.drain(timeout_s=2)  # the hung call is cancelled at the seal
        await trio.sleep(0.1)
        assert svc.in_flight == 0 and svc.dropped_results == 1
    assert offsets.updates == [0]  # offset 1 completed, the prefix stays at the hung message
