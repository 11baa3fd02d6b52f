"""ConsumeMessageOrderlyService with a fake network: RocketMQ's status mapping (ConsumeMessageOrderlyServiceTest),
processConsumeResult for auto_commit true and false, checkReconsumeTimes and the dead-letter path, the
consume loop's guards and re-lock delays (MockClock), blocked-queue bookkeeping, skip, and the shutdown drain."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from tests.unit.consume_fakes import FakeApi, FakeClient, FakeOffsets
from trimq.client.config import PushConsumerConfig
from trimq.client.consume.common import (
    CMResult,
    ConsumeHooks,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeReturnType,
    is_async_callable,
)
from trimq.client.consume.orderly import ConsumeMessageOrderlyService, clamp_suspend_millis
from trimq.client.errors import MQBrokerError, MQClientError
from trimq.client.process_queue import ProcessQueue
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingTimeoutError

G, T = "og", "Orders"
MQ = MessageQueue(T, "broker-a", 0)
S = ConsumeOrderlyStatus


def msg(offset: int, body: bytes = b"x", topic: str = T, reconsume: int = 0, **props: str) -> MessageExt:
    return MessageExt(topic=topic, body=body, flag=0, properties=dict(props), queue_id=0, queue_offset=offset,
                      commit_log_offset=1000 + offset, sys_flag=0, born_timestamp=0, born_host=("127.0.0.1", 1),
                      store_timestamp=0, store_host=("127.0.0.1", 10911), reconsume_times=reconsume,
                      prepared_transaction_offset=0, body_crc=0, store_size=0, msg_id=f"ID{offset:04d}")


class FakeRebalance:
    def __init__(self, clock: Callable[[], int], clustering: bool = True) -> None:
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self._clustering = clustering
        self.clock = clock
        self.lock_results: list[bool] = []
        self.lock_calls: list[tuple[MessageQueue, float]] = []
        self._locks: weakref.WeakKeyDictionary[ProcessQueue, trio.Lock] = weakref.WeakKeyDictionary()

    @property
    def clustering(self) -> bool:
        return self._clustering

    def consume_lock(self, pq: ProcessQueue) -> trio.Lock:
        return self._locks.setdefault(pq, trio.Lock())

    async def lock(self, mq: MessageQueue) -> bool:
        self.lock_calls.append((mq, trio.current_time()))
        ok = self.lock_results.pop(0) if self.lock_results else True
        pq = self.process_queue_table.get(mq)
        if ok and pq is not None:
            pq.locked = True
            pq.last_lock_timestamp = self.clock()
        return ok


def now_ms() -> int:
    return int(trio.current_time() * 1000)


def make_service(listener: Any = None, *, clustering: bool = True, **cfg: Any) -> ConsumeMessageOrderlyService:
    cfg.setdefault("suspend_current_queue_time_millis", 1000)
    config = PushConsumerConfig(consumer_group=G, message_model="CLUSTERING" if clustering else "BROADCASTING",
                                **cfg)
    svc = ConsumeMessageOrderlyService(G, config, listener or (lambda msgs, ctx: S.SUCCESS), clock=now_ms,
                                       wall_clock=lambda: 1_700_000_000_000)
    svc.attach(rebalance=FakeRebalance(now_ms, clustering), offset_store=FakeOffsets(),
               client=FakeClient())  # type: ignore[arg-type]
    return svc


def parts(svc: ConsumeMessageOrderlyService) -> tuple[FakeRebalance, FakeOffsets, FakeApi]:
    assert isinstance(svc.rebalance, FakeRebalance) and isinstance(svc.offset_store, FakeOffsets)
    assert svc.send_back is not None
    client = svc.send_back.client
    assert isinstance(client, FakeClient)
    return svc.rebalance, svc.offset_store, client.api


def locked_pq(svc: ConsumeMessageOrderlyService, *offsets: int, mq: MessageQueue = MQ) -> ProcessQueue:
    pq = ProcessQueue(now_ms())
    pq.locked = True
    pq.put_message([msg(o) for o in offsets])
    parts(svc)[0].process_queue_table[mq] = pq
    return pq


# --- pure parts --------------------------------------------------------------------------------------------


def test_suspend_bounds() -> None:
    assert clamp_suspend_millis(-1, 1000) == 1000
    assert clamp_suspend_millis(-1, 0) == 10
    assert clamp_suspend_millis(5, 1000) == 10
    assert clamp_suspend_millis(50_000, 1000) == 30_000
    assert clamp_suspend_millis(200, 1000) == 200


def test_defaults_follow_rocketmq() -> None:
    svc = make_service()
    assert svc.max_reconsume_times == sys.maxsize  # -1 = unbounded for orderly
    assert make_service(max_reconsume_times=3).max_reconsume_times == 3
    ctx = ConsumeOrderlyContext(MQ)
    assert ctx.auto_commit is True and ctx.suspend_current_queue_time_millis == -1
    assert svc.drain_timeout_s() == 10.0  # orderly batches get at least 10 s to finish at shutdown


def test_async_detection() -> None:
    async def a(m: Any, c: Any) -> None: ...

    class Obj:
        async def __call__(self, m: Any, c: Any) -> None: ...

    import functools

    assert is_async_callable(a) and is_async_callable(Obj()) and is_async_callable(functools.partial(a))
    assert not is_async_callable(lambda m, c: None)


# --- ConsumeMessageOrderlyServiceTest: consumeMessageDirectly's status mapping ------------------------------


@pytest.mark.parametrize(("returned", "expected"), [
    (S.SUCCESS, CMResult.CR_SUCCESS),
    (S.SUSPEND_CURRENT_QUEUE_A_MOMENT, CMResult.CR_LATER),
    (S.COMMIT, CMResult.CR_COMMIT),
    (S.ROLLBACK, CMResult.CR_ROLLBACK),
    (None, CMResult.CR_RETURN_NULL),
    (RuntimeError("boom"), CMResult.CR_THROW_EXCEPTION),
])
async def test_consume_message_directly_status_mapping(returned: Any, expected: CMResult) -> None:
    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> Any:
        if isinstance(returned, Exception):
            raise returned
        return returned

    svc = make_service(listener)
    retry_msg = msg(0, topic="%RETRY%og", RETRY_TOPIC=T)
    result = await svc.consume_message_directly(retry_msg, "broker-a")
    assert result.consume_result is expected
    assert result.order is True and result.auto_commit is True
    assert retry_msg.topic == T  # resetRetryAndNamespace
    if expected is CMResult.CR_THROW_EXCEPTION:
        assert result.remark == "RuntimeError: boom"


# --- processConsumeResult --------------------------------------------------------------------------------


async def run_result(svc: ConsumeMessageOrderlyService, pq: ProcessQueue, n: int, status: S,
                     ctx: ConsumeOrderlyContext) -> tuple[bool, list[MessageExt]]:
    msgs = pq.take_messages(n, now_ms())
    cont = await svc.process_consume_result(msgs, status, ctx, pq, MQ)
    return cont, msgs


@pytest.mark.parametrize("status", [S.SUCCESS, S.COMMIT, S.ROLLBACK])
async def test_auto_commit_success_like_statuses_commit(status: S) -> None:
    svc = make_service()
    pq = locked_pq(svc, 0, 1, 2)
    with capture_logs() as logs:
        cont, _ = await run_result(svc, pq, 2, status, ConsumeOrderlyContext(MQ))
    assert cont is True
    assert parts(svc)[1].updates == [(MQ, 2, False)]  # not increase-only
    assert pq.msg_count == 1
    illegal = [e for e in logs if e["event"] == "consume.orderly_illegal_status"]
    assert bool(illegal) == (status is not S.SUCCESS)


async def test_auto_commit_suspend_retries_in_place_later() -> None:
    svc = make_service(suspend_current_queue_time_millis=250)
    submitted: list[tuple[Any, ...]] = []
    svc.submit_consume_request_later = (  # type: ignore[method-assign,assignment]
        lambda pq, mq, suspend_ms: submitted.append((mq, suspend_ms)))
    pq = locked_pq(svc, 5, 6)
    ctx = ConsumeOrderlyContext(MQ)
    cont, msgs = await run_result(svc, pq, 1, S.SUSPEND_CURRENT_QUEUE_A_MOMENT, ctx)
    assert cont is False and parts(svc)[1].updates == []
    assert msgs[0].reconsume_times == 1  # counted locally
    assert [m.queue_offset for m in pq.messages()] == [5, 6]  # back in place
    assert submitted == [(MQ, -1)]  # -1: the consumer's suspend_current_queue_time_millis
    [blocked] = svc.blocked_queues()
    assert (blocked.offset, blocked.msg_id, blocked.attempts) == (5, "ID0005", 1)


@pytest.mark.parametrize(("status", "committed", "cont", "in_flight_after"), [
    (S.SUCCESS, None, True, 2),  # nothing committed: stays in flight
    (S.COMMIT, 2, True, 0),
    (S.ROLLBACK, None, False, 0),
    (S.SUSPEND_CURRENT_QUEUE_A_MOMENT, None, False, 0),
])
async def test_manual_commit(status: S, committed: int | None, cont: bool, in_flight_after: int) -> None:
    svc = make_service()
    svc.submit_consume_request_later = lambda *a: None  # type: ignore[method-assign]
    pq = locked_pq(svc, 0, 1, 2)
    ctx = ConsumeOrderlyContext(MQ, auto_commit=False)
    got_cont, _ = await run_result(svc, pq, 2, status, ctx)
    assert got_cont is cont
    assert parts(svc)[1].updates == ([] if committed is None else [(MQ, committed, False)])
    assert len(pq.consuming_messages()) == in_flight_after


async def test_manual_commit_commits_everything_in_flight() -> None:
    svc = make_service()
    pq = locked_pq(svc, 0, 1, 2)
    ctx = ConsumeOrderlyContext(MQ, auto_commit=False)
    await run_result(svc, pq, 1, S.SUCCESS, ctx)
    await run_result(svc, pq, 1, S.COMMIT, ctx)
    assert parts(svc)[1].updates == [(MQ, 2, False)]


async def test_offset_of_a_batch_finished_after_its_queue_was_dropped_is_still_committed() -> None:
    # trimq (unlike RocketMQ): the batch still holds the consume lock, which the rebalance takes before it
    # persists the offset, so committing here means the next owner does not consume the batch again.
    svc = make_service()
    pq = locked_pq(svc, 0)
    pq.dropped = True
    await run_result(svc, pq, 1, S.SUCCESS, ConsumeOrderlyContext(MQ))
    assert parts(svc)[1].updates == [(MQ, 1, False)]


# --- checkReconsumeTimes and dead letters -----------------------------------------------------------------


async def test_at_max_dead_letters_at_once_and_commits() -> None:
    svc = make_service(max_reconsume_times=2)
    pq = locked_pq(svc, 0)
    pq.messages()[0].reconsume_times = 2
    cont, msgs = await run_result(svc, pq, 1, S.SUSPEND_CURRENT_QUEUE_A_MOMENT, ConsumeOrderlyContext(MQ))
    _, offsets, api = parts(svc)
    assert cont is True and offsets.updates == [(MQ, 1, False)]
    [sb] = api.send_backs
    assert sb["delay_level"] == -1 and sb["max_reconsume_times"] == 2 and sb["commit_log_offset"] == 1000
    assert sb["origin_topic"] == T and sb["origin_msg_id"] == "ID0000" and sb["group"] == G
    # RocketMQ's count: the copy carries max_reconsume_times (the broker would otherwise store its record's 0 + 1)
    assert sb["reconsume_times"] == 2
    assert msgs[0].properties[MessageConst.RECONSUME_TIME] == "2"
    assert svc.stats.dead_lettered == 1 and api.sends == []


async def test_dead_letter_falls_back_to_producing_to_retry_topic() -> None:
    svc = make_service(max_reconsume_times=1)
    _, offsets, api = parts(svc)
    api.send_back_error = RemotingTimeoutError("slow broker")
    pq = locked_pq(svc, 3)
    pq.messages()[0].reconsume_times = 1
    pq.messages()[0].properties.update({MessageConst.KEYS: "k", "UNIQ_KEY": "U3", "app": "v",
                                        MessageConst.MIN_OFFSET: "0", MessageConst.MAX_OFFSET: "9"})
    cont, _ = await run_result(svc, pq, 1, S.SUSPEND_CURRENT_QUEUE_A_MOMENT, ConsumeOrderlyContext(MQ))
    assert cont is True and offsets.updates == [(MQ, 4, False)]
    [send] = api.sends
    assert send["topic"] == "%RETRY%og" and send["producer_group"] == "CLIENT_INNER_PRODUCER"
    # RECONSUME_TIME >= MAX_RECONSUME_TIMES: the broker reroutes it to the DLQ
    assert send["reconsume_times"] == 1 and send["max_reconsume_times"] == 1
    props = dict(p.split("\x01") for p in send["properties"].split("\x02") if p)
    # the message's properties, ORIGIN_MESSAGE_ID = its unique key (RocketMQ's client msgId); not the pull's
    # MIN_OFFSET / MAX_OFFSET (the broker's copy of the stored message has none); RECONSUME_TIME in the header
    assert props == {"RETRY_TOPIC": T, "ORIGIN_MESSAGE_ID": "U3", "KEYS": "k", "UNIQ_KEY": "U3", "app": "v",
                     "DELAY": "4"}  # 3 + reconsume times, as RocketMQ (the broker drops it for a dead letter)


async def test_failed_dead_letter_keeps_suspending() -> None:
    svc = make_service(max_reconsume_times=1)
    svc.submit_consume_request_later = lambda *a: None  # type: ignore[method-assign]
    _, offsets, api = parts(svc)
    api.send_back_error = MQBrokerError(1, "store full")
    api.send_error = MQClientError("no route")
    pq = locked_pq(svc, 0)
    pq.messages()[0].reconsume_times = 1
    cont, msgs = await run_result(svc, pq, 1, S.SUSPEND_CURRENT_QUEUE_A_MOMENT, ConsumeOrderlyContext(MQ))
    assert cont is False and offsets.updates == []
    assert msgs[0].reconsume_times == 2 and pq.first_offset() == 0
    assert svc.stats.sent_back["failed"] == 1


async def test_mixed_batch_retries_only_the_live_messages() -> None:
    svc = make_service(max_reconsume_times=1, consume_message_batch_max_size=2)
    svc.submit_consume_request_later = lambda *a: None  # type: ignore[method-assign]
    pq = locked_pq(svc, 0, 1)
    pq.messages()[0].reconsume_times = 1  # at the maximum: dead-lettered
    cont, _ = await run_result(svc, pq, 2, S.SUSPEND_CURRENT_QUEUE_A_MOMENT, ConsumeOrderlyContext(MQ))
    assert cont is False
    assert [m.queue_offset for m in pq.messages()] == [1]  # offset 0 is not consumed again
    assert pq.msg_count == 1
    await run_result(svc, pq, 2, S.SUCCESS, ConsumeOrderlyContext(MQ))
    assert parts(svc)[1].updates == [(MQ, 2, False)]


# --- the consume loop ---------------------------------------------------------------------------------------


async def test_loop_consumes_in_order_and_takes_batches(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[list[int]] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        calls.append([m.queue_offset for m in msgs])
        return S.SUCCESS

    svc = make_service(listener, consume_message_batch_max_size=2)
    pq = locked_pq(svc, 0, 1, 2, 3, 4)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.consume_request(pq, MQ)
    assert calls == [[0, 1], [2, 3], [4]]
    assert [u[1] for u in parts(svc)[1].updates] == [2, 4, 5]
    assert pq.consuming is False  # ran dry: the next pull dispatches a new request


async def test_one_consume_task_per_queue(autojump_clock: trio.testing.MockClock) -> None:
    active = 0
    peak = 0

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await trio.sleep(0.01)
        active -= 1
        return S.SUCCESS

    svc = make_service(listener)
    pq = locked_pq(svc, *range(10))
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        for _ in range(3):
            nursery.start_soon(svc.consume_request, pq, MQ)
    assert peak == 1 and pq.msg_count == 0


async def test_unlocked_queue_is_relocked_after_100ms_then_resubmitted(
        autojump_clock: trio.testing.MockClock) -> None:
    seen: list[float] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        seen.append(trio.current_time())
        return S.SUCCESS

    svc = make_service(listener)
    rebalance = parts(svc)[0]
    pq = locked_pq(svc, 0)
    pq.locked = False
    rebalance.lock_results = [False, True]
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.consume_request(pq, MQ)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    # 100 ms later a lock attempt fails -> resubmit after 3 s -> not locked again -> 100 ms -> lock ok -> 10 ms
    lock_times = [round(t - t0, 3) for _, t in rebalance.lock_calls]
    assert lock_times == [0.1, 3.2]
    assert [round(t - t0, 3) for t in seen] == [3.21]


async def test_lock_expired_inside_loop_relocks_after_10ms(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        calls.append(msgs[0].queue_offset)
        await trio.sleep(31)  # the client lock (30 s) expires while consuming
        return S.SUCCESS

    svc = make_service(listener)
    rebalance = parts(svc)[0]
    pq = locked_pq(svc, 0, 1)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        t0 = trio.current_time()
        await svc.consume_request(pq, MQ)
        assert calls == [0]
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert [round(t - t0 - 31, 3) for _, t in rebalance.lock_calls][:1] == [0.01]
    assert calls == [0, 1]


async def test_yields_after_max_time_consume_continuously(autojump_clock: trio.testing.MockClock) -> None:
    starts: list[float] = []
    svc = make_service(max_time_consume_continuously=1000)

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        pq.last_lock_timestamp = now_ms()  # the lock-all loop would renew it
        await trio.sleep(0.3)
        return S.SUCCESS

    svc.invoker.listener = listener
    svc.invoker.is_async = True
    pq = locked_pq(svc, *range(8))
    original = svc.consume_request

    async def counting(pq_: ProcessQueue, mq: MessageQueue) -> None:
        starts.append(trio.current_time())
        await original(pq_, mq)

    svc.consume_request = counting  # type: ignore[method-assign,assignment]
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await counting(pq, MQ)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    # 4 batches (1.2 s > 1 s) per request, then a new request 10 ms later (the third finds nothing left)
    assert [round(t - starts[0], 3) for t in starts] == [0, 1.21, 2.42]
    assert pq.msg_count == 0


async def test_broadcasting_needs_no_lock(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[int] = []
    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        calls.append(msgs[0].queue_offset)
        return S.SUCCESS

    svc = make_service(listener, clustering=False)
    pq = locked_pq(svc, 0)
    pq.locked = False
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.consume_request(pq, MQ)
    assert calls == [0]


async def test_dropped_queue_is_not_consumed(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[int] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        calls.append(1)
        return S.SUCCESS

    svc = make_service(listener)
    pq = locked_pq(svc, 0)
    pq.dropped = True
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.consume_request(pq, MQ)
    assert calls == []


async def test_exception_and_none_suspend_with_hooks(autojump_clock: trio.testing.MockClock) -> None:
    results: list[Any] = [RuntimeError("x"), None, S.SUCCESS]

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> Any:
        r = results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    hooks = ConsumeHooks()
    after: list[dict[str, Any]] = []
    hooks.add(after=lambda ctx: after.append(dict(ctx)))
    svc = make_service(listener, suspend_current_queue_time_millis=20)
    svc.hooks = hooks
    pq = locked_pq(svc, 7)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.consume_request(pq, MQ)
        await trio.sleep(1)
    assert [a["return_type"] for a in after] == [ConsumeReturnType.EXCEPTION.name, ConsumeReturnType.RETURNNULL.name,
                                                 ConsumeReturnType.SUCCESS.name]
    assert [a["status"] for a in after] == ["SUSPEND_CURRENT_QUEUE_A_MOMENT"] * 2 + ["SUCCESS"]
    assert after[-1]["success"] is True and parts(svc)[1].updates == [(MQ, 8, False)]
    assert svc.stats.topics[T].consume_failed == 2 and svc.stats.topics[T].consume_ok == 1


async def test_blocked_warning_is_rate_limited(autojump_clock: trio.testing.MockClock) -> None:
    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        return S.SUSPEND_CURRENT_QUEUE_A_MOMENT

    svc = make_service(listener, suspend_current_queue_time_millis=1000)
    pq = locked_pq(svc, 0, 1)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            svc.bind(nursery)
            await svc.consume_request(pq, MQ)
            await trio.sleep(25.5)  # ~26 attempts, one per second
            nursery.cancel_scope.cancel()
    warnings = [e for e in logs if e["event"] == "consume.queue_blocked"]
    assert len(warnings) == 3  # every 10 s
    assert warnings[-1]["offset"] == 0 and warnings[-1]["attempts"] >= 20 and warnings[-1]["suppressed"] >= 9
    [blocked] = svc.blocked_queues()
    assert blocked.blocked_ms(now_ms()) >= 25_000 and blocked.attempts >= 25


async def test_skip_message_dead_letters_and_moves_on(autojump_clock: trio.testing.MockClock) -> None:
    consumed: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        if msgs[0].queue_offset == 0:
            return S.SUSPEND_CURRENT_QUEUE_A_MOMENT
        consumed.append(msgs[0].queue_offset)
        return S.SUCCESS

    svc = make_service(listener, suspend_current_queue_time_millis=5000)
    pq = locked_pq(svc, 0, 1)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        await svc.consume_request(pq, MQ)
        assert svc.blocked_queues()
        with pytest.raises(MQClientError, match="not cached"):
            await svc.skip_message(MQ, pq, 9)
        result = await svc.skip_message(MQ, pq, 0)
        await trio.sleep(0.1)  # the queue moves on at once, not after the 5 s suspend
        assert consumed == [1]
        nursery.cancel_scope.cancel()
    _, offsets, api = parts(svc)
    assert result["nextOffset"] == 1 and result["msgId"] == "ID0000"
    assert api.send_backs[0]["delay_level"] == -1 and api.send_backs[0]["max_reconsume_times"] == 0
    assert api.send_backs[0]["reconsume_times"] == 1  # the client's count (one failure), as at the maximum
    assert offsets.updates == [(MQ, 1, False), (MQ, 2, False)]
    assert not svc.blocked_queues() and svc.stats.skipped == 1


# --- shutdown --------------------------------------------------------------------------------------------


async def test_drain_lets_the_batch_under_way_commit(autojump_clock: trio.testing.MockClock) -> None:
    release = trio.Event()
    calls: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        calls.append(msgs[0].queue_offset)
        await release.wait()
        return S.SUCCESS

    svc = make_service(listener)
    pq = locked_pq(svc, 0, 1)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        nursery.start_soon(svc.consume_request, pq, MQ)
        await trio.sleep(1)

        async def finish() -> None:
            await trio.sleep(2)
            release.set()

        nursery.start_soon(finish)
        assert await svc.drain() is True
    assert calls == [0]  # no new batch after the shutdown began
    assert parts(svc)[1].updates == [(MQ, 1, False)]  # the batch under way committed
    assert svc.dropped_results == 0


async def test_drain_failure_during_shutdown_is_not_dead_lettered(autojump_clock: trio.testing.MockClock) -> None:
    release = trio.Event()

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        await release.wait()
        return S.SUSPEND_CURRENT_QUEUE_A_MOMENT

    svc = make_service(listener, max_reconsume_times=0)
    pq = locked_pq(svc, 0)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        nursery.start_soon(svc.consume_request, pq, MQ)
        await trio.sleep(1)
        svc.stop()
        release.set()
        await svc.drain()
    _, offsets, api = parts(svc)
    assert api.send_backs == [] and offsets.updates == []  # neither sent back nor committed
    assert pq.first_offset() == 0


async def test_drain_abandons_a_hung_listener_after_the_bound(autojump_clock: trio.testing.MockClock) -> None:
    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> S:
        await trio.sleep_forever()
        return S.SUCCESS  # pragma: no cover

    svc = make_service(listener, await_termination_millis_when_shutdown=20_000)
    pq = locked_pq(svc, 0)
    async with trio.open_nursery() as nursery:
        svc.bind(nursery)
        nursery.start_soon(svc.consume_request, pq, MQ)
        await trio.sleep(1)
        t0 = trio.current_time()
        assert await svc.drain() is False
        assert round(trio.current_time() - t0) == 20
    assert parts(svc)[1].updates == [] and pq.first_offset() == 0 and svc.sealed
