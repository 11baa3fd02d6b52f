"""ConsumeMessageConcurrentlyService with a fake network: batching, ack_index, send-back and its two fallbacks,
increase-only offsets, broadcasting, retry-topic reset, expired-message cleaning, the concurrency limit,
consumeMessageDirectly's mapping, and the shutdown rules (MockClock; async listeners where time matters)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pytest
import trio
import trio.testing

from tests.unit.consume_fakes import FakeApi, FakeClient, FakeOffsets
from trimq.client.config import PushConsumerConfig
from trimq.client.consume.common import (
    CMResult,
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeHooks,
)
from trimq.client.consume.concurrently import ConsumeMessageConcurrentlyService
from trimq.client.errors import MQBrokerError, MQClientError
from trimq.client.process_queue import ProcessQueue
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingConnectError

G, T = "cg", "Orders"
MQ = MessageQueue(T, "broker-a", 1)
C = ConsumeConcurrentlyStatus
WALL = 1_700_000_000_000


def msg(offset: int, topic: str = T, reconsume: int = 0, **props: str) -> MessageExt:
    return MessageExt(topic=topic, body=b"b", flag=0, properties=dict(props), queue_id=1, queue_offset=offset,
                      commit_log_offset=5000 + offset, sys_flag=0, born_timestamp=0, born_host=("127.0.0.1", 1),
                      store_timestamp=0, store_host=("127.0.0.1", 10911), reconsume_times=reconsume,
                      prepared_transaction_offset=0, body_crc=0, store_size=0, msg_id=f"ID{offset:04d}")


class FakeRebalance:
    def __init__(self) -> None:
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self._locks: weakref.WeakKeyDictionary[ProcessQueue, trio.Lock] = weakref.WeakKeyDictionary()

    clustering = True

    def consume_lock(self, pq: ProcessQueue) -> trio.Lock:
        return self._locks.setdefault(pq, trio.Lock())

    async def lock(self, mq: MessageQueue) -> bool:
        return True


def now_ms() -> int:
    return int(trio.current_time() * 1000)


def make_service(listener: Any = None, **cfg: Any) -> tuple[ConsumeMessageConcurrentlyService, FakeOffsets, FakeApi]:
    config = PushConsumerConfig(consumer_group=G, **cfg)
    svc = ConsumeMessageConcurrentlyService(G, config, listener or (lambda m, c: C.CONSUME_SUCCESS), clock=now_ms,
                                            wall_clock=lambda: WALL)
    offsets, client = FakeOffsets(), FakeClient()
    svc.attach(rebalance=FakeRebalance(), offset_store=offsets, client=client)  # type: ignore[arg-type]
    return svc, offsets, client.api


def cached(*offsets: int, topic: str = T) -> tuple[ProcessQueue, list[MessageExt]]:
    pq = ProcessQueue(0)
    msgs = [msg(o, topic=topic) for o in offsets]
    pq.put_message(msgs)
    return pq, msgs


def props_of(send: dict[str, Any]) -> dict[str, str]:
    return dict(p.split("\x01") for p in send["properties"].split("\x02") if p)


# --- result processing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ack_index", "sent_back"), [(2**31 - 1, []), (1, [12, 13]), (-1, [10, 11, 12, 13]),
                                                      (-7, [10, 11, 12, 13]), (3, [])])
async def test_ack_index(ack_index: int, sent_back: list[int]) -> None:
    svc, offsets, api = make_service()
    pq, msgs = cached(10, 11, 12, 13)
    ctx = ConsumeConcurrentlyContext(MQ, ack_index=ack_index)
    await svc.process_consume_result(C.CONSUME_SUCCESS, ctx, msgs, pq, MQ)
    assert [sb["commit_log_offset"] - 5000 for sb in api.send_backs] == sent_back
    assert offsets.updates == [(MQ, 14, True)]  # everything is accounted for: commit past the batch
    ok = 4 - len(sent_back)
    assert (svc.stats.topics[T].consume_ok, svc.stats.topics[T].consume_failed) == (ok, 4 - ok)


async def test_reconsume_later_sends_back_with_context_delay_level() -> None:
    svc, offsets, api = make_service(max_reconsume_times=5)
    pq, msgs = cached(0, 1)
    ctx = ConsumeConcurrentlyContext(MQ, delay_level_when_next_consume=2)
    await svc.process_consume_result(C.RECONSUME_LATER, ctx, msgs, pq, MQ)
    assert [(sb["delay_level"], sb["max_reconsume_times"], sb["origin_msg_id"], sb["origin_topic"], sb["group"])
            for sb in api.send_backs] == [(2, 5, "ID0000", T, G), (2, 5, "ID0001", T, G)]
    assert api.send_backs[0]["timeout_ms"] == 5000
    assert offsets.updates == [(MQ, 2, True)] and pq.msg_count == 0


async def test_default_max_reconsume_is_16() -> None:
    svc, _, api = make_service()
    assert svc.max_reconsume_times == 16
    pq, msgs = cached(0)
    await svc.process_consume_result(C.RECONSUME_LATER, ConsumeConcurrentlyContext(MQ), msgs, pq, MQ)
    assert api.send_backs[0]["max_reconsume_times"] == 16 and api.send_backs[0]["delay_level"] == 0


async def test_failed_send_back_falls_back_to_producing_to_the_retry_topic() -> None:
    svc, offsets, api = make_service()
    api.send_back_error = RemotingConnectError("down")
    pq, msgs = cached(0)
    msgs[0].reconsume_times = 2
    msgs[0].properties[MessageConst.ORIGIN_MESSAGE_ID] = "FIRST"
    msgs[0].properties[MessageConst.TRANSACTION_PREPARED] = "true"
    await svc.process_consume_result(C.RECONSUME_LATER, ConsumeConcurrentlyContext(MQ), msgs, pq, MQ)
    [send] = api.sends
    assert send["topic"] == "%RETRY%cg" and send["reconsume_times"] == 3 and send["max_reconsume_times"] == 16
    props = props_of(send)
    assert props["RETRY_TOPIC"] == T and props["ORIGIN_MESSAGE_ID"] == "FIRST" and props["DELAY"] == "5"
    assert "TRAN_MSG" not in props
    assert offsets.updates == [(MQ, 1, True)]
    assert svc.stats.sent_back == {"broker": 0, "retry_topic": 1, "failed": 0}


async def test_both_fail_consume_locally_again_after_5s(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[tuple[int, int, float]] = []
    results = [C.RECONSUME_LATER, C.CONSUME_SUCCESS]

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> C:
        calls.extend((m.queue_offset, m.reconsume_times, trio.current_time()) for m in msgs)
        return results.pop(0)

    svc, offsets, api = make_service(listener)
    api.send_back_error = MQBrokerError(1, "x")
    api.send_error = MQClientError("no route")
    pq, msgs = cached(0, 1)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        t0 = trio.current_time()
        svc.submit(pq, msgs[:1], True, MQ)
        await trio.sleep(0.1)
        assert offsets.updates == [(MQ, 0, True)] and pq.first_offset() == 0  # not removed: consumed again
        api.send_back_error = None
        await trio.sleep(10)
    assert [(o, rt, round(t - t0, 3)) for o, rt, t in calls] == [(0, 0, 0.0), (0, 1, 5.0)]
    assert offsets.updates == [(MQ, 0, True), (MQ, 1, True)]


async def test_offsets_are_increase_only_and_held_back_by_earlier_messages() -> None:
    svc, offsets, _ = make_service()
    pq, msgs = cached(0, 1, 2)
    await svc.process_consume_result(C.CONSUME_SUCCESS, ConsumeConcurrentlyContext(MQ), [msgs[2]], pq, MQ)
    await svc.process_consume_result(C.CONSUME_SUCCESS, ConsumeConcurrentlyContext(MQ), [msgs[0]], pq, MQ)
    await svc.process_consume_result(C.CONSUME_SUCCESS, ConsumeConcurrentlyContext(MQ), [msgs[1]], pq, MQ)
    assert offsets.updates == [(MQ, 0, True), (MQ, 1, True), (MQ, 3, True)]


async def test_broadcasting_drops_failures() -> None:
    svc, offsets, api = make_service(message_model="BROADCASTING")
    pq, msgs = cached(0, 1)
    await svc.process_consume_result(C.RECONSUME_LATER, ConsumeConcurrentlyContext(MQ), msgs, pq, MQ)
    assert api.send_backs == [] and api.sends == []
    assert offsets.updates == [(MQ, 2, True)]


async def test_dropped_queue_result_not_committed() -> None:
    svc, offsets, _ = make_service()
    pq, msgs = cached(0)
    pq.dropped = True
    await svc.process_consume_result(C.CONSUME_SUCCESS, ConsumeConcurrentlyContext(MQ), msgs, pq, MQ)
    assert offsets.updates == []


# --- consume requests ----------------------------------------------------------------------------------


async def test_batches_retry_topic_reset_and_start_time(autojump_clock: trio.testing.MockClock) -> None:
    batches: list[list[tuple[int, str, str | None]]] = []
    ctx_topics: list[str] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> C:
        batches.append([(m.queue_offset, m.topic, m.properties.get(MessageConst.CONSUME_START_TIME)) for m in msgs])
        ctx_topics.append(ctx.message_queue.topic)
        return C.CONSUME_SUCCESS

    svc, offsets, _ = make_service(listener, consume_message_batch_max_size=2)
    retry_mq = MessageQueue("%RETRY%cg", "broker-a", 0)
    pq = ProcessQueue(0)
    msgs = [msg(o, topic="%RETRY%cg", RETRY_TOPIC=T) for o in range(5)]
    pq.put_message(msgs)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        svc.submit(pq, msgs, True, retry_mq)
    assert sorted(len(b) for b in batches) == [1, 2, 2]
    assert all(topic == T and start == str(WALL) for b in batches for _, topic, start in b)
    assert set(ctx_topics) == {"%RETRY%cg"}  # the queue is still the retry topic's
    assert offsets.updates[-1] == (retry_mq, 5, True)


async def test_exception_or_none_means_reconsume_later_and_hooks_see_it(
        autojump_clock: trio.testing.MockClock) -> None:
    results: list[Any] = [ValueError("bad"), None]

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> Any:
        r = results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    svc, _, api = make_service(listener)
    after: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    svc.hooks = ConsumeHooks()
    svc.hooks.add(before=before.append, after=lambda ctx: after.append(dict(ctx)))
    pq, msgs = cached(0, 1)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        svc.submit(pq, msgs, True, MQ)
    assert [a["return_type"] for a in after] == ["EXCEPTION", "RETURNNULL"]
    assert all(a["status"] == "RECONSUME_LATER" and a["success"] is False for a in after)
    assert len(before) == 2 and len(api.send_backs) == 2


async def test_limiter_bounds_concurrent_listener_calls(autojump_clock: trio.testing.MockClock) -> None:
    active = peak = 0

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> C:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await trio.sleep(1)
        active -= 1
        return C.CONSUME_SUCCESS

    svc, offsets, _ = make_service(listener, consume_thread_min=1, consume_thread_max=3)
    pq, msgs = cached(*range(10))
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        svc.submit(pq, msgs, True, MQ)
    assert peak == 3 and offsets.updates[-1] == (MQ, 10, True)


async def test_sync_listener_runs_in_a_worker_thread() -> None:
    names: list[str] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> C:
        names.append(threading.current_thread().name)
        return C.CONSUME_SUCCESS

    svc, offsets, _ = make_service(listener)
    pq, msgs = cached(0)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        svc.submit(pq, msgs, True, MQ)
    assert names and names[0] != threading.main_thread().name
    assert offsets.updates == [(MQ, 1, True)]


@pytest.mark.parametrize(("returned", "expected"), [
    (C.CONSUME_SUCCESS, CMResult.CR_SUCCESS),
    (C.RECONSUME_LATER, CMResult.CR_LATER),
    ("CONSUME_SUCCESS", CMResult.CR_SUCCESS),
    (None, CMResult.CR_RETURN_NULL),
    (KeyError("k"), CMResult.CR_THROW_EXCEPTION),
])
async def test_consume_message_directly(returned: Any, expected: CMResult) -> None:
    def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> Any:
        if isinstance(returned, Exception):
            raise returned
        return returned

    svc, offsets, api = make_service(listener)
    result = await svc.consume_message_directly(msg(0), "broker-a")
    assert result.consume_result is expected and result.order is False
    assert offsets.updates == [] and api.send_backs == []


# --- expired messages -------------------------------------------------------------------------------------


async def test_clean_expired_sends_back_with_level_3_and_not_twice(autojump_clock: trio.testing.MockClock) -> None:
    svc, offsets, api = make_service(consume_timeout=15)
    rebalance = svc.rebalance
    assert isinstance(rebalance, FakeRebalance)
    pq, msgs = cached(0, 1, 2)
    rebalance.process_queue_table[MQ] = pq
    old = str(WALL - 16 * 60_000)
    msgs[0].properties[MessageConst.CONSUME_START_TIME] = old
    msgs[1].properties[MessageConst.CONSUME_START_TIME] = old
    msgs[2].properties[MessageConst.CONSUME_START_TIME] = str(WALL)
    assert await svc.clean_expired_msg() == 2
    assert [(sb["delay_level"], sb["commit_log_offset"]) for sb in api.send_backs] == [(3, 5000), (3, 5001)]
    assert pq.first_offset() == 2
    # the slow listener calls fail later: not sent back a second time
    await svc.process_consume_result(C.RECONSUME_LATER, ConsumeConcurrentlyContext(MQ), msgs[:2], pq, MQ)
    assert len(api.send_backs) == 2 and offsets.updates == [(MQ, 2, True)]


async def test_clean_expired_loop_runs_every_consume_timeout(autojump_clock: trio.testing.MockClock) -> None:
    svc, _, _ = make_service(consume_timeout=1)
    runs: list[float] = []

    async def fake_clean() -> int:
        runs.append(trio.current_time())
        return 0

    svc.clean_expired_msg = fake_clean  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        t0 = trio.current_time()
        svc.start()
        await trio.sleep(185)
        nursery.cancel_scope.cancel()
    assert [round(t - t0) for t in runs] == [60, 120, 180]


# --- skip and shutdown -------------------------------------------------------------------------------------


async def test_skip_message(autojump_clock: trio.testing.MockClock) -> None:
    svc, offsets, api = make_service()
    pq, msgs = cached(4, 5)
    with pytest.raises(MQClientError, match="not cached"):
        await svc.skip_message(MQ, pq, 9)
    result = await svc.skip_message(MQ, pq, 4)
    assert result["nextOffset"] == 5 and offsets.updates == [(MQ, 5, True)]
    assert api.send_backs[0]["delay_level"] == -1
    # its listener call fails afterwards: no second copy
    await svc.process_consume_result(C.RECONSUME_LATER, ConsumeConcurrentlyContext(MQ), msgs[:1], pq, MQ)
    assert len(api.send_backs) == 1


async def test_shutdown_failure_left_uncommitted_not_sent_back(autojump_clock: trio.testing.MockClock) -> None:
    release = trio.Event()
    started: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> C:
        started.append(msgs[0].queue_offset)
        await release.wait()
        return C.CONSUME_SUCCESS if msgs[0].queue_offset == 0 else C.RECONSUME_LATER

    svc, offsets, api = make_service(listener, consume_thread_min=1, consume_thread_max=2,
                                     await_termination_millis_when_shutdown=5000)
    pq, msgs = cached(0, 1, 2)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        for m in msgs:  # one at a time: trio may start tasks spawned together in any order
            svc.submit(pq, [m], True, MQ)
            await trio.testing.wait_all_tasks_blocked()
        assert started == [0, 1]  # the third batch waits for the limiter

        async def finish() -> None:
            await trio.sleep(1)
            release.set()

        nursery.start_soon(finish)
        assert await svc.drain() is True
    assert started == [0, 1]  # the waiting batch never started
    assert api.send_backs == [] and api.sends == []
    # offset 0 consumed; 1 (failed) and 2 (not run) stay: nothing past 1 is ever committed
    assert offsets.updates and max(o for _, o, _ in offsets.updates) == 1
    assert all(inc for _, _, inc in offsets.updates)
    assert [m.queue_offset for m in pq.messages()] == [1, 2]


async def test_sealed_results_are_dropped_whole() -> None:
    running, release = threading.Event(), threading.Event()

    def hung(msgs: list[MessageExt], ctx: ConsumeConcurrentlyContext) -> C:
        running.set()
        release.wait(5)  # a plain listener still running when the wait ends: abandoned
        return C.RECONSUME_LATER

    svc, offsets, api = make_service(hung)
    pq, msgs = cached(0)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        svc.submit(pq, msgs, True, MQ)
        await trio.to_thread.run_sync(running.wait)
        assert await svc.drain(timeout_s=0) is False
        release.set()
    assert svc.sealed and offsets.updates == [] and api.send_backs == []
