"""ConsumeMessageOrderlyService: one queue's messages, one batch at a time, in offset order.

RocketMQ 4.9.3's service (ROCKETMQ_FACTS.md §5) on trio. The three locks:

1. the broker's queue lock (LOCK_BATCH_MQ): a lease renewed for every held queue by the client instance's
   renewal task every third of the lease (``lock_profile="rocketmq"``: by the consumer core's lock-all loop, 1 s
   after start, then every ``rebalance_lock_interval``); no batch starts once the lease, counted from the
   renewal's send time, has run out, nor while the queue's broker connection is down; this service re-locks
   one queue when it finds its lock missing or expired; each batch's context carries the lock's fencing epoch
   (``context.lock_epoch``);
2. one consume task per message queue at a time (a ``trio.Lock`` per queue, RocketMQ's MessageQueueLock);
3. the process queue's consume lock around each listener call, which a rebalance takes (waiting at most
   ``consume_lock_wait_millis``) before it unlocks a removed queue on the broker.

A consume request (started when the pull loop reports ``dispatch_to_consume``) loops while the queue is
CLUSTERING-locked and not lock-expired (BROADCASTING needs no lock): it stops when the queue is dropped,
re-locks after 10 ms when the lock is missing or expired (100 ms when that is found before the loop), yields
after ``max_time_consume_continuously`` (60 s, resubmitting itself after 10 ms), and otherwise takes
``consume_message_batch_max_size`` messages, calls the listener and processes its status:

* ``auto_commit`` (default): SUCCESS commits; COMMIT and ROLLBACK are logged as illegal and commit;
  SUSPEND_CURRENT_QUEUE_A_MOMENT (also an exception or ``None``) checks the reconsume times: a message under
  ``max_reconsume_times`` is retried in place after ``suspend_current_queue_time_millis`` (the context's, or the
  consumer's; clamped to [10, 30000] ms), nothing after it being consumed meanwhile; one at the maximum is
  dead-lettered (below) and committed. A failed dead-letter keeps the queue suspended.
* ``auto_commit`` false: SUCCESS commits nothing; COMMIT commits everything in flight; ROLLBACK puts it back
  and suspends; SUSPEND as above without the commit.

Offsets go to the offset store without the increase-only rule, and only when the commit offset is >= 0 and the
queue was not dropped. ``max_reconsume_times`` -1 means unbounded (RocketMQ's Integer.MAX_VALUE).

Differences from RocketMQ, each deliberate:

* **Dead letters at once** (DESIGN.md §6.6): at the maximum a message goes to CONSUMER_SEND_MSG_BACK with
  delay level -1, which the broker stores in ``%DLQ%<group>`` immediately; RocketMQ produces to
  ``%RETRY%<group>`` with delay level 3 + reconsume times and lets the broker reroute it. That produce is kept as
  the fallback when the RPC fails (the broker dead-letters it since RECONSUME_TIME >= MAX_RECONSUME_TIMES).
  Both paths store RocketMQ's copy: reconsume times = the client's count (``max_reconsume_times`` when it was
  reached: with 2, three deliveries and a dead letter carrying 2), the message's properties, and
  ORIGIN_MESSAGE_ID = its unique key (the RPC carries the count as ``reconsumeTimes``, which asks the broker for
  that rule; RocketMQ 4.9.3 itself loses ORIGIN_MESSAGE_ID here, fixed in 4.9.4 by #4050).
* In a batch mixing dead-lettered and retried messages, only the retried ones are consumed again (RocketMQ
  re-queues the whole batch, so the dead-lettered ones are dead-lettered again on the next failure).
* **Visible blocking** (DESIGN.md §6.5): a queue retrying one message is recorded in :attr:`blocked`
  (offset, message id, attempts, since when), exported as a gauge, logged as a rate-limited warning, shown by
  GET_CONSUMER_RUNNING_INFO, and :meth:`skip_message` dead-letters the message so the queue moves on.
* Shutdown (client.consume.common): a batch under way finishes and commits; a failure during shutdown is
  neither sent back nor committed (the next owner retries it); orderly consumers wait for their batches at
  least :data:`MIN_SHUTDOWN_WAIT_MS`, since an abandoned orderly batch would run beside its next owner's.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from trimq.client.consume.common import (
    CMResult,
    ConsumeMessageDirectlyResult,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeServiceBase,
    held,
    normalize_status,
    reset_retry_and_namespace,
)
from trimq.client.errors import MQClientError
from trimq.client.process_queue import ProcessQueue
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = [
    "MIN_SHUTDOWN_WAIT_MS",
    "BlockedQueue",
    "ConsumeMessageOrderlyService",
    "clamp_suspend_millis",
]

log = get_logger("trimq.consume.orderly")

RELOCK_IN_LOOP_MS = 10
RELOCK_AT_START_MS = 100
RESUBMIT_AFTER_LOCK_OK_MS = 10
RESUBMIT_AFTER_LOCK_FAILED_MS = 3000
RESUBMIT_AFTER_YIELD_MS = 10
SUSPEND_MIN_MS = 10
SUSPEND_MAX_MS = 30_000
MIN_SHUTDOWN_WAIT_MS = 10_000
SKIP_LOCK_WAIT_S = 5.0
BLOCKED_LOG_INTERVAL_MS = 10_000


def clamp_suspend_millis(suspend_ms: int, default_ms: int) -> int:
    """submitConsumeRequestLater's delay: -1 means ``default_ms``; the result is clamped to [10, 30000]."""
    ms = default_ms if suspend_ms == -1 else suspend_ms
    return max(SUSPEND_MIN_MS, min(SUSPEND_MAX_MS, ms))


@dataclass
class BlockedQueue:
    """An orderly queue retrying the message at ``offset`` (DESIGN.md §6.5)."""

    message_queue: MessageQueue
    offset: int
    msg_id: str
    since_ms: int
    attempts: int
    last_failure_ms: int

    def blocked_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.since_ms)

    def to_wire(self, now_ms: int) -> dict[str, Any]:
        return {"mq": self.message_queue.to_wire(), "offset": self.offset, "msgId": self.msg_id,
                "attempts": self.attempts, "blockedMs": self.blocked_ms(now_ms),
                "lastFailureTimestamp": self.last_failure_ms}


class ConsumeMessageOrderlyService(ConsumeServiceBase):
    """The orderly consume service (see the module documentation)."""

    orderly = True

    def _init_state(self) -> None:
        self._mq_locks: dict[MessageQueue, trio.Lock] = {}
        self.blocked: dict[MessageQueue, BlockedQueue] = {}
        self._blocked_pq: weakref.WeakValueDictionary[MessageQueue, ProcessQueue] = weakref.WeakValueDictionary()
        self._rate = RateLimiter(BLOCKED_LOG_INTERVAL_MS)

    @property
    def max_reconsume_times(self) -> int:
        """RocketMQ's getMaxReconsumeTimes for orderly: -1 is unbounded."""
        v = self.config.max_reconsume_times
        return sys.maxsize if v == -1 else v

    def drain_timeout_s(self) -> float:
        return max(self.config.await_termination_millis_when_shutdown, MIN_SHUTDOWN_WAIT_MS) / 1000

    def mq_lock(self, mq: MessageQueue) -> trio.Lock:
        """The per-queue lock that keeps one consume task per message queue (RocketMQ's MessageQueueLock)."""
        lock = self._mq_locks.get(mq)
        if lock is None:
            lock = self._mq_locks[mq] = trio.Lock()
        return lock

    # --- ConsumeService hook -------------------------------------------------------------------------

    def submit(self, process_queue: ProcessQueue, msgs: Any, dispatch_to_consume: bool,
               message_queue: MessageQueue) -> None:
        """Start a consume request when the pull loop says nobody is consuming this queue (non-blocking)."""
        if dispatch_to_consume:
            self._spawn(self.consume_request, process_queue, message_queue)

    def submit_consume_request_later(self, pq: ProcessQueue, mq: MessageQueue, suspend_ms: int) -> None:
        """A new consume request after ``suspend_ms`` (-1: the consumer's setting), clamped to [10, 30000]."""
        delay = clamp_suspend_millis(suspend_ms, self.config.suspend_current_queue_time_millis)
        self._later(delay, self.submit, pq, None, True, mq)

    def try_lock_later_and_reconsume(self, mq: MessageQueue, pq: ProcessQueue, delay_ms: int) -> None:
        """After ``delay_ms``, lock ``mq`` on the broker; resubmit after 10 ms on success, 3 s on failure."""

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            ok = await self.lock_one_mq(mq)
            self.submit_consume_request_later(pq, mq, RESUBMIT_AFTER_LOCK_OK_MS if ok
                                              else RESUBMIT_AFTER_LOCK_FAILED_MS)

        self._spawn(later)

    async def lock_one_mq(self, mq: MessageQueue) -> bool:
        if self.stopping or self.rebalance is None:
            return False
        return await self.rebalance.lock(mq)

    def batch_context(self, mq: MessageQueue) -> ConsumeOrderlyContext:
        """A batch's listener context, with the fencing token of the lock it starts under (issue 14): read with the
        usability check before the listener call."""
        epoch_of = getattr(self.rebalance, "lock_epoch", None) if self.clustering else None
        epoch = epoch_of(mq) if epoch_of is not None else None
        return ConsumeOrderlyContext(mq, lock_epoch=epoch)

    # --- the consume loop ----------------------------------------------------------------------------

    def _usable(self, pq: ProcessQueue) -> bool:
        return not self.clustering or (pq.locked and not pq.is_lock_expired(self.clock()))

    def before_listener(self, pq: ProcessQueue,
                        hook_ctx: dict[str, Any] | None) -> Callable[[], Awaitable[None]]:
        """The last check before a listener call (raises _LockLapsed), then the ``before`` hooks: waiting for the
        limiter, a slot or a hook may have outlasted the lock (a paused process), and another client may own the
        queue by now."""

        async def before() -> None:
            if not self._usable(pq):
                raise _LockLapsed
            if hook_ctx is not None:
                await self.hooks.run("before", hook_ctx)

        return before

    async def consume_request(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """RocketMQ's ConsumeRequest.run for one queue."""
        if pq.dropped:
            log.info("consume.queue_dropped", group=self.consumer_group, mq=str(mq))
            return
        async with held(self.mq_lock(mq)):
            if not self._usable(pq):
                if pq.dropped:
                    return
                self.try_lock_later_and_reconsume(mq, pq, RELOCK_AT_START_MS)
                return
            begin = self.clock()
            continue_consume = True
            while continue_consume:
                if pq.dropped:
                    log.info("consume.queue_dropped", group=self.consumer_group, mq=str(mq))
                    break
                if self.stopping:
                    break
                if self.clustering and not pq.locked:
                    log.warning("consume.queue_not_locked", group=self.consumer_group, mq=str(mq))
                    self.try_lock_later_and_reconsume(mq, pq, RELOCK_IN_LOOP_MS)
                    break
                now = self.clock()  # one reading per batch: the checks below and the take share it
                if self.clustering and pq.is_lock_expired(now):
                    log.warning("consume.queue_lock_expired", group=self.consumer_group, mq=str(mq))
                    self.try_lock_later_and_reconsume(mq, pq, RELOCK_IN_LOOP_MS)
                    break
                if now - begin > self.config.max_time_consume_continuously:
                    self.submit_consume_request_later(pq, mq, RESUBMIT_AFTER_YIELD_MS)
                    break
                msgs = pq.take_messages(self.config.consume_message_batch_max_size, now)
                if not msgs:
                    break  # take_messages cleared ``consuming``: the next pull dispatches a new request
                reset_retry_and_namespace(msgs, self.consumer_group)
                continue_consume = await self._consume_batch(pq, mq, msgs)

    async def _consume_batch(self, pq: ProcessQueue, mq: MessageQueue, msgs: list[MessageExt]) -> bool:
        """One listener call and its result; returns whether the loop continues.

        The process queue's consume lock is held from the listener call until the batch's offset is
        committed, so a rebalance that removes the queue never persists an offset older than what was
        consumed before it unlocks the queue on the broker (RocketMQ releases it before processing the result).
        """
        context = self.batch_context(mq)
        hook_ctx = self.hook_context(mq, msgs) if self.hooks else None
        before = self.before_listener(pq, hook_ctx)
        async with held(self.rebalance.consume_lock(pq)) if self.rebalance is not None else _null_lock():
            if pq.dropped:
                log.info("consume.queue_dropped", group=self.consumer_group, mq=str(mq))
                return False
            try:
                outcome = await self.call_listener(list(msgs), context, before)
            except _LockLapsed:
                pq.make_message_to_consume_again(msgs)
                log.warning("consume.queue_lock_expired", group=self.consumer_group, mq=str(mq))
                self.try_lock_later_and_reconsume(mq, pq, RELOCK_IN_LOOP_MS)
                return False
            if outcome is None:
                # not run (shutdown began) or abandoned at the seal: the batch stays uncommitted
                pq.make_message_to_consume_again(msgs)
                if self.sealed:
                    self.dropped_results += 1
                return False

            status = normalize_status(outcome.value, ConsumeOrderlyStatus)
            if outcome.error is not None:
                self.log_listener_exception(mq, msgs, outcome.error)
            if status in (None, ConsumeOrderlyStatus.ROLLBACK, ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT):
                log.debug("consume.orderly_not_ok", group=self.consumer_group, mq=str(mq),
                         status=status.name if status else None, offsets=[m.queue_offset for m in msgs])
            return_type = self.return_type(status, outcome, ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT)
            if status is None:
                status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            assert isinstance(status, ConsumeOrderlyStatus)
            if hook_ctx is not None:
                hook_ctx["props"]["ConsumeContextType"] = return_type.name
                hook_ctx.update(status=status.name, return_type=return_type.name, consume_rt_ms=outcome.spent_ms,
                                success=status in (ConsumeOrderlyStatus.SUCCESS, ConsumeOrderlyStatus.COMMIT))
                await self.hooks.run("after", hook_ctx)
            self.stats.inc_consume_rt(mq.topic, outcome.spent_ms)
            if self.sealed:
                self.dropped_results += 1
                pq.make_message_to_consume_again(msgs)
                log.warning("consume.result_dropped_after_shutdown", group=self.consumer_group, mq=str(mq),
                            offsets=[m.queue_offset for m in msgs], status=status.name)
                return False
            with self.processing():
                return await self.process_consume_result(msgs, status, context, pq, mq)

    # --- results -------------------------------------------------------------------------------------

    async def process_consume_result(self, msgs: list[MessageExt], status: ConsumeOrderlyStatus,
                                     context: ConsumeOrderlyContext, pq: ProcessQueue, mq: MessageQueue) -> bool:
        """Commit, retry or dead-letter a batch by its status; returns whether the loop continues."""
        S = ConsumeOrderlyStatus
        continue_consume = True
        commit_offset = -1
        topic = mq.topic
        dead_lettered: list[MessageExt] = []
        if context.auto_commit:
            if status in (S.COMMIT, S.ROLLBACK):
                log.warning("consume.orderly_illegal_status", group=self.consumer_group, mq=str(mq),
                            status=status.name, note="auto_commit is true: treated as SUCCESS")
            if status is S.SUSPEND_CURRENT_QUEUE_A_MOMENT:
                self.stats.inc_consume(topic, 0, len(msgs))
                if await self.check_reconsume_times(msgs, mq, dead_lettered):
                    self._suspend(msgs, context, pq, mq, dead_lettered)
                    continue_consume = False
                else:
                    commit_offset = pq.commit()
            else:
                commit_offset = pq.commit()
                self.stats.inc_consume(topic, len(msgs), 0)
        else:
            if status is S.SUCCESS:
                self.stats.inc_consume(topic, len(msgs), 0)
            elif status is S.COMMIT:
                commit_offset = pq.commit()
            elif status is S.ROLLBACK:
                pq.rollback()
                if not self.stopping:
                    self.submit_consume_request_later(pq, mq, context.suspend_current_queue_time_millis)
                continue_consume = False
            else:
                self.stats.inc_consume(topic, 0, len(msgs))
                if await self.check_reconsume_times(msgs, mq, dead_lettered):
                    self._suspend(msgs, context, pq, mq, dead_lettered)
                    continue_consume = False
        if commit_offset >= 0 and self.offset_store is not None:
            # Committed even if a rebalance dropped the queue meanwhile (RocketMQ skips it, and the next owner
            # consumes the batch again): we still hold the consume lock, which the rebalance takes before it
            # persists the offset and unlocks the queue on the broker, so this offset is the one persisted.
            self.offset_store.update_offset(mq, commit_offset, False)
        if commit_offset >= 0:
            self._unblock(mq, commit_offset)
        return continue_consume

    def _suspend(self, msgs: list[MessageExt], context: ConsumeOrderlyContext, pq: ProcessQueue,
                 mq: MessageQueue, dead_lettered: list[MessageExt]) -> None:
        pq.make_message_to_consume_again(msgs)
        if self.stopping:
            return  # shutting down: the next owner retries these
        # dead-lettered members of a mixed batch are not consumed again (module documentation)
        if dead_lettered:
            pq.remove_message(dead_lettered, self.clock())
        done = {m.queue_offset for m in dead_lettered}
        self._record_blocked(pq, mq, [m for m in msgs if m.queue_offset not in done], context)
        self.submit_consume_request_later(pq, mq, context.suspend_current_queue_time_millis)

    async def check_reconsume_times(self, msgs: list[MessageExt], mq: MessageQueue,
                                    dead_lettered: list[MessageExt] | None = None) -> bool:
        """True when the batch must be retried (some message is under the maximum, or its dead-letter failed).
        Messages at the maximum are dead-lettered (and appended to ``dead_lettered``); the others count one
        more attempt. During shutdown nothing is dead-lettered (the next owner decides)."""
        suspend = False
        for msg in msgs:
            if msg.reconsume_times >= self.max_reconsume_times and not self.stopping:
                msg.properties[MessageConst.RECONSUME_TIME] = str(msg.reconsume_times)
                if await self.send_to_dlq(msg, mq):
                    if dead_lettered is not None:
                        dead_lettered.append(msg)
                else:
                    suspend = True
                    msg.reconsume_times += 1
            else:
                suspend = True
                msg.reconsume_times += 1
        return suspend

    async def send_to_dlq(self, msg: MessageExt, mq: MessageQueue) -> bool:
        """Dead-letter ``msg`` at once: CONSUMER_SEND_MSG_BACK with delay level -1, else produce it to
        ``%RETRY%<group>`` with RECONSUME_TIME >= MAX_RECONSUME_TIMES (the broker reroutes it to the DLQ).
        Either way the copy carries ``msg.reconsume_times`` (RocketMQ's checkReconsumeTimes / sendMessageBack)."""
        if self.send_back is None:
            return False
        ok = await self.send_back.send(
            msg, delay_level=-1, broker_name=mq.broker_name, max_reconsume_times=self.max_reconsume_times,
            reconsume_times=msg.reconsume_times,
            fallback_reconsume_times=msg.reconsume_times, fallback_delay_level=3 + msg.reconsume_times,
            stats=self.stats,
        )
        if ok:
            self.stats.dead_lettered += 1
            log.warning("consume.dead_lettered", group=self.consumer_group, mq=str(mq), offset=msg.queue_offset,
                        msg_id=msg.msg_id, reconsume_times=msg.reconsume_times)
        return ok

    # --- blocked queues (DESIGN.md §6.5) ------------------------------------------------------------------

    def _record_blocked(self, pq: ProcessQueue, mq: MessageQueue, retried: list[MessageExt],
                        context: ConsumeOrderlyContext) -> None:
        if not retried:
            return
        head = min(retried, key=lambda m: m.queue_offset)
        now = self.clock()
        cur = self.blocked.get(mq)
        if cur is None or cur.offset != head.queue_offset:
            cur = self.blocked[mq] = BlockedQueue(mq, head.queue_offset, head.msg_id, now, head.reconsume_times, now)
        cur.attempts = head.reconsume_times
        cur.last_failure_ms = now
        self._blocked_pq[mq] = pq
        log_rate_limited(
            self._rate, mq, now, log.warning, "consume.queue_blocked",
            group=self.consumer_group, topic=mq.topic, broker=mq.broker_name, queue_id=mq.queue_id,
            offset=head.queue_offset, msg_id=head.msg_id, keys=head.keys, attempts=head.reconsume_times,
            blocked_ms=cur.blocked_ms(now),
            max_reconsume_times=self.config.max_reconsume_times,
            suspend_ms=clamp_suspend_millis(context.suspend_current_queue_time_millis,
                                            self.config.suspend_current_queue_time_millis),
        )

    def _unblock(self, mq: MessageQueue, commit_offset: int) -> None:
        cur = self.blocked.get(mq)
        if cur is not None and commit_offset > cur.offset:
            del self.blocked[mq]
            log.info("consume.queue_unblocked", group=self.consumer_group, mq=str(mq), offset=cur.offset,
                     attempts=cur.attempts, blocked_ms=cur.blocked_ms(self.clock()))

    def blocked_queues(self) -> list[BlockedQueue]:
        """Queues held by this consumer that are retrying one message, longest blocked first."""
        table = self.rebalance.process_queue_table if self.rebalance is not None else {}
        for mq in list(self.blocked):
            pq = table.get(mq)
            if pq is None or pq.dropped or pq is not self._blocked_pq.get(mq):
                del self.blocked[mq]
        return sorted(self.blocked.values(), key=lambda b: b.since_ms)

    # --- operator actions --------------------------------------------------------------------------------

    async def skip_message(self, mq: MessageQueue, pq: ProcessQueue, offset: int,
                           skipped_by: str | None = None) -> dict[str, Any]:
        """Dead-letter the cached message at ``offset`` of ``mq`` and move on (DESIGN.md §6.5).

        Waits (at most 5 s) until no batch of the queue is being consumed. Raises MQClientError when the
        message is not cached here, is in flight, or cannot be sent back.
        """
        lock = self.mq_lock(mq)
        with trio.move_on_after(SKIP_LOCK_WAIT_S) as scope:
            await lock.acquire()
        if scope.cancelled_caught:
            raise MQClientError(f"queue {mq} is busy consuming; try again")
        try:
            consume_lock = self.rebalance.consume_lock(pq) if self.rebalance is not None else None
            if consume_lock is not None:
                await consume_lock.acquire()
            try:
                return await self._skip_locked(mq, pq, offset, skipped_by)
            finally:
                if consume_lock is not None:
                    consume_lock.release()
        finally:
            lock.release()

    async def _skip_locked(self, mq: MessageQueue, pq: ProcessQueue, offset: int,
                           skipped_by: str | None = None) -> dict[str, Any]:
        if pq.dropped:
            raise MQClientError(f"queue {mq} is no longer held by this consumer")
        if any(m.queue_offset == offset for m in pq.consuming_messages()):
            raise MQClientError(f"message {mq}@{offset} is in flight (taken, not committed); try again")
        msg = next((m for m in pq.messages() if m.queue_offset == offset), None)
        if msg is None:
            first, last = pq.first_offset(), pq.last_offset()
            cached = f"cached offsets {first}..{last}" if first is not None else "nothing cached"
            raise MQClientError(f"message {mq}@{offset} is not cached by this consumer ({cached})")
        was_head = pq.first_offset() == offset
        assert self.send_back is not None
        reset_retry_and_namespace([msg], self.consumer_group)
        ok = await self.send_back.send(
            msg, delay_level=-1, broker_name=mq.broker_name, max_reconsume_times=0,
            reconsume_times=msg.reconsume_times,  # as a dead letter at the maximum: the same copy on both paths
            fallback_reconsume_times=msg.reconsume_times, fallback_delay_level=0, stats=self.stats,
            skipped_by=skipped_by,
        )
        if not ok:
            raise MQClientError(f"could not dead-letter {mq}@{offset} (send-back and retry-topic produce failed)")
        self.stats.skipped += 1
        next_offset = pq.remove_message([msg], self.clock())
        if was_head and next_offset >= 0 and not pq.dropped and self.offset_store is not None:
            self.offset_store.update_offset(mq, next_offset, False)
        self._unblock(mq, offset + 1)
        log.warning("consume.message_skipped", group=self.consumer_group, mq=str(mq), offset=offset,
                    msg_id=msg.msg_id, attempts=msg.reconsume_times)
        if pq.has_temp_message():
            self.submit_consume_request_later(pq, mq, RESUBMIT_AFTER_LOCK_OK_MS)
        return {"msgId": msg.msg_id, "queueOffset": offset, "reconsumeTimes": msg.reconsume_times,
                "keys": msg.keys, "nextOffset": next_offset if was_head else None}

    async def consume_message_directly(self, msg: MessageExt, broker_name: str) -> ConsumeMessageDirectlyResult:
        """Run the listener on one message outside the queues (RocketMQ's consumeMessageDirectly)."""
        mq = MessageQueue(msg.topic, broker_name, msg.queue_id)
        context = ConsumeOrderlyContext(mq)
        result, remark, spent = await self._consume_directly(msg, context, ConsumeOrderlyStatus, _DIRECT_RESULTS)
        return ConsumeMessageDirectlyResult(order=True, auto_commit=context.auto_commit, consume_result=result,
                                            remark=remark, spent_time_millis=spent)


#: RocketMQ's mapping of a listener status to CMResult for consumeMessageDirectly (None: the listener returned
#: nothing).
_DIRECT_RESULTS: dict[ConsumeOrderlyStatus | None, CMResult] = {
    None: CMResult.CR_RETURN_NULL,
    ConsumeOrderlyStatus.COMMIT: CMResult.CR_COMMIT,
    ConsumeOrderlyStatus.ROLLBACK: CMResult.CR_ROLLBACK,
    ConsumeOrderlyStatus.SUCCESS: CMResult.CR_SUCCESS,
    ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT: CMResult.CR_LATER,
}


class _LockLapsed(Exception):
    """The queue's lock lapsed between the loop's check and the listener call."""


class _null_lock:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None
