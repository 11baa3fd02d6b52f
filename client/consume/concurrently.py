"""ConsumeMessageConcurrentlyService: batches consumed in parallel, failures retried through ``%RETRY%group``.

RocketMQ 4.9.3's service (ROCKETMQ_FACTS.md §5) on trio:

* every pulled list is split into batches of ``consume_message_batch_max_size``; each batch is one task, and
  at most ``consume_thread_max`` listener calls run at once (a CapacityLimiter);
* retry-topic messages get their real topic back (RETRY_TOPIC) and every message its CONSUME_START_TIME
  before the listener sees them;
* CONSUME_SUCCESS consumes messages ``0..ack_index`` (default: all) and retries the rest; RECONSUME_LATER
  (also an exception or ``None``) retries all. CLUSTERING sends each retried message back
  (CONSUMER_SEND_MSG_BACK with ``delay_level_when_next_consume``; 0 lets the broker pick 3 + reconsume times;
  the broker dead-letters it once it reached ``max_reconsume_times``, -1 = 16). When that RPC fails the
  client produces the copy to ``%RETRY%<group>`` itself, and when that fails too the message counts one more
  attempt and is consumed locally again after 5 s. BROADCASTING drops failures (logged);
* the offset committed is what ``ProcessQueue.remove_message`` returns (the smallest offset still cached),
  with the increase-only rule;
* every ``consume_timeout`` minutes, messages whose consumption started more than ``consume_timeout``
  minutes ago are sent back with delay level 3 and removed (ProcessQueue.clean_expired_msg).

Differences from RocketMQ, each deliberate: a message sent back by the expiry cleaner (or skipped by an
operator) is not sent back a second time when its slow listener call later fails; ``ack_index`` below -1 is
read as -1 (RocketMQ indexes out of range); when ``delay_level_when_next_consume`` < 0 the fallback produce
also dead-letters (RocketMQ's fallback would retry); shutdown follows client.consume.common (a failure during
shutdown is neither sent back nor committed).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import trio

from trimq.client.consume.common import (
    CMResult,
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeMessageDirectlyResult,
    ConsumeServiceBase,
    normalize_status,
    reset_retry_and_namespace,
)
from trimq.client.errors import MQClientError
from trimq.client.process_queue import ProcessQueue
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.logs import get_logger, log_rate_limited

__all__ = ["DEFAULT_MAX_RECONSUME_TIMES", "SEND_BACK_FAILED_RETRY_MS", "ConsumeMessageConcurrentlyService"]

log = get_logger("trimq.consume.concurrently")

DEFAULT_MAX_RECONSUME_TIMES = 16
SEND_BACK_FAILED_RETRY_MS = 5000
EXPIRED_SEND_BACK_DELAY_LEVEL = ProcessQueue.SEND_BACK_DELAY_LEVEL


#: RocketMQ's mapping of a listener status to CMResult for consumeMessageDirectly.
_DIRECT_RESULTS: dict[ConsumeConcurrentlyStatus | None, CMResult] = {
    None: CMResult.CR_RETURN_NULL,
    ConsumeConcurrentlyStatus.CONSUME_SUCCESS: CMResult.CR_SUCCESS,
    ConsumeConcurrentlyStatus.RECONSUME_LATER: CMResult.CR_LATER,
}


class ConsumeMessageConcurrentlyService(ConsumeServiceBase):
    """The concurrent consume service (see the module documentation)."""

    orderly = False

    def _init_state(self) -> None:
        # offsets already sent back (expiry cleaner, skip): never sent back twice
        self._sent_back: weakref.WeakKeyDictionary[ProcessQueue, set[int]] = weakref.WeakKeyDictionary()

    @property
    def max_reconsume_times(self) -> int:
        """RocketMQ's getMaxReconsumeTimes for concurrent consumers: -1 means 16."""
        v = self.config.max_reconsume_times
        return DEFAULT_MAX_RECONSUME_TIMES if v == -1 else v

    def start(self) -> None:
        """Start the expired-message cleaner (every ``consume_timeout`` minutes)."""
        self._spawn(self._clean_expired_loop)

    # --- ConsumeService hook -------------------------------------------------------------------------

    def submit(self, process_queue: ProcessQueue, msgs: Sequence[MessageExt] | None, dispatch_to_consume: bool,
               message_queue: MessageQueue) -> None:
        """One consume task per batch of ``consume_message_batch_max_size`` (non-blocking)."""
        if not msgs:
            return
        batch = self.config.consume_message_batch_max_size
        msgs = list(msgs)
        for i in range(0, len(msgs), batch):
            self._spawn(self.consume_request, msgs[i:i + batch], process_queue, message_queue)

    def submit_consume_request_later(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        """Consume ``msgs`` locally again after 5 s (their send-back failed)."""
        self._later(SEND_BACK_FAILED_RETRY_MS, self.submit, pq, msgs, True, mq)

    # --- one batch -----------------------------------------------------------------------------------

    async def consume_request(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        """RocketMQ's ConsumeRequest.run for one batch."""
        if pq.dropped:
            log.info("consume.queue_dropped", group=self.consumer_group, mq=str(mq))
            return
        context = ConsumeConcurrentlyContext(mq)
        reset_retry_and_namespace(msgs, self.consumer_group)
        hook_ctx = self.hook_context(mq, msgs) if self.hooks else None

        async def before() -> None:
            if hook_ctx is not None:
                await self.hooks.run("before", hook_ctx)
            start = str(self.wall_clock())
            for msg in msgs:
                msg.properties[MessageConst.CONSUME_START_TIME] = start

        outcome = await self.call_listener(list(msgs), context, before)
        if outcome is None:
            if self.sealed:
                self.dropped_results += 1
            return  # not run (shutdown began) or abandoned: the batch stays uncommitted
        status = normalize_status(outcome.value, ConsumeConcurrentlyStatus)
        if outcome.error is not None:
            self.log_listener_exception(mq, msgs, outcome.error)
        return_type = self.return_type(status, outcome, ConsumeConcurrentlyStatus.RECONSUME_LATER)
        if status is None:
            if outcome.error is None:
                log_rate_limited(self._exc_rate, ("null", mq), self.clock(), log.warning, "consume.return_null",
                                 group=self.consumer_group, mq=str(mq), offsets=[m.queue_offset for m in msgs])
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        assert isinstance(status, ConsumeConcurrentlyStatus)
        if hook_ctx is not None:
            hook_ctx["props"]["ConsumeContextType"] = return_type.name
            hook_ctx.update(status=status.name, return_type=return_type.name, consume_rt_ms=outcome.spent_ms,
                            success=status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
            await self.hooks.run("after", hook_ctx)
        self.stats.inc_consume_rt(mq.topic, outcome.spent_ms)
        if self.sealed:
            self.dropped_results += 1
            log.warning("consume.result_dropped_after_shutdown", group=self.consumer_group, mq=str(mq),
                        offsets=[m.queue_offset for m in msgs], status=status.name)
            return
        if pq.dropped:
            log.warning("consume.result_dropped_queue_dropped", group=self.consumer_group, mq=str(mq),
                        offsets=[m.queue_offset for m in msgs])
            return
        with self.processing():
            await self.process_consume_result(status, context, msgs, pq, mq)

    async def process_consume_result(self, status: ConsumeConcurrentlyStatus, context: ConsumeConcurrentlyContext,
                                     msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        """Ack, send back or re-queue a batch by its status, then commit what ``remove_message`` allows."""
        if not msgs:
            return
        stopping = self.stopping
        if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
            ack_index = max(-1, min(context.ack_index, len(msgs) - 1))
            ok = ack_index + 1
            self.stats.inc_consume(mq.topic, ok, len(msgs) - ok)
        else:
            ack_index = -1
            self.stats.inc_consume(mq.topic, 0, len(msgs))
        failed = msgs[ack_index + 1:]
        to_remove = list(msgs)
        if not self.clustering:
            for msg in failed:
                log.warning("consume.broadcast_failure_dropped", group=self.consumer_group, mq=str(mq),
                            offset=msg.queue_offset, msg_id=msg.msg_id)
        elif failed and stopping:
            # shutting down: no send-back (RocketMQ #7182); the failed ones stay uncommitted for the next owner
            to_remove = msgs[:ack_index + 1]
            log.info("consume.shutdown_failures_left", group=self.consumer_group, mq=str(mq),
                     offsets=[m.queue_offset for m in failed])
        elif failed:
            already = self._sent_back.get(pq, set())
            back_failed: list[MessageExt] = []
            for msg in failed:
                if msg.queue_offset in already:
                    continue
                if not await self.send_message_back(msg, context, mq):
                    msg.reconsume_times += 1
                    back_failed.append(msg)
            if back_failed:
                ids = {id(m) for m in back_failed}
                to_remove = [m for m in msgs if id(m) not in ids]
                self.submit_consume_request_later(back_failed, pq, mq)
        offset = pq.remove_message(to_remove, self.clock())
        done = self._sent_back.get(pq)
        if done:
            done.difference_update(m.queue_offset for m in to_remove)
        if offset >= 0 and not pq.dropped and self.offset_store is not None:
            self.offset_store.update_offset(mq, offset, True)

    async def send_message_back(self, msg: MessageExt, context: ConsumeConcurrentlyContext,
                                mq: MessageQueue) -> bool:
        """Send one failed message back with the context's delay level (fallbacks: module documentation)."""
        if self.send_back is None:
            return False
        delay = context.delay_level_when_next_consume
        max_times = self.max_reconsume_times
        ok = await self.send_back.send(
            msg, delay_level=delay, broker_name=mq.broker_name,
            max_reconsume_times=max_times if delay >= 0 else 0,
            fallback_reconsume_times=msg.reconsume_times + 1, fallback_delay_level=3 + msg.reconsume_times,
            stats=self.stats,
        )
        if ok and (delay < 0 or msg.reconsume_times >= max_times):
            self.stats.dead_lettered += 1
            log.warning("consume.dead_lettered", group=self.consumer_group, mq=str(mq), offset=msg.queue_offset,
                        msg_id=msg.msg_id, reconsume_times=msg.reconsume_times)
        return ok

    # --- expired messages --------------------------------------------------------------------------------

    async def _clean_expired_loop(self) -> None:
        while True:
            await trio.sleep(self.config.consume_timeout * 60)
            await self.clean_expired_msg()

    async def clean_expired_msg(self) -> int:
        """Send back (delay level 3) and remove the cached messages consumed for longer than
        ``consume_timeout`` minutes; returns how many."""
        if self.rebalance is None or self.send_back is None:
            return 0
        cleaned = 0
        for mq, pq in list(self.rebalance.process_queue_table.items()):
            if self.stopping:
                break
            expired = pq.clean_expired_msg(self.wall_clock(), self.config.consume_timeout)
            for msg in expired:
                if self.stopping or pq.dropped:
                    break
                with self.processing():
                    ok = await self.send_back.send(
                        msg, delay_level=EXPIRED_SEND_BACK_DELAY_LEVEL, broker_name=mq.broker_name,
                        max_reconsume_times=self.max_reconsume_times,
                        fallback_reconsume_times=msg.reconsume_times + 1,
                        fallback_delay_level=3 + msg.reconsume_times, stats=self.stats,
                    )
                    if not ok:
                        break
                    self._sent_back.setdefault(pq, set()).add(msg.queue_offset)
                    pq.remove_if_first(msg, self.clock())
                cleaned += 1
                log.warning("consume.expired_sent_back", group=self.consumer_group, mq=str(mq),
                            offset=msg.queue_offset, msg_id=msg.msg_id,
                            consume_start=msg.properties.get(MessageConst.CONSUME_START_TIME))
        return cleaned

    # --- operator actions --------------------------------------------------------------------------------

    async def skip_message(self, mq: MessageQueue, pq: ProcessQueue, offset: int,
                           skipped_by: str | None = None) -> dict[str, Any]:
        """Dead-letter the cached message at ``offset`` of ``mq`` and commit past it when it is the first.

        A listener call under way for it may still finish; its result no longer sends it back.
        """
        if pq.dropped:
            raise MQClientError(f"queue {mq} is no longer held by this consumer")
        msg = next((m for m in pq.messages() if m.queue_offset == offset), None)
        if msg is None:
            first, last = pq.first_offset(), pq.last_offset()
            cached = f"cached offsets {first}..{last}" if first is not None else "nothing cached"
            raise MQClientError(f"message {mq}@{offset} is not cached by this consumer ({cached})")
        assert self.send_back is not None
        reset_retry_and_namespace([msg], self.consumer_group)
        with self.processing():
            ok = await self.send_back.send(
                msg, delay_level=-1, broker_name=mq.broker_name, max_reconsume_times=0,
                fallback_reconsume_times=msg.reconsume_times, fallback_delay_level=0, stats=self.stats,
                skipped_by=skipped_by,
            )
            if not ok:
                raise MQClientError(f"could not dead-letter {mq}@{offset} (send-back and retry-topic produce failed)")
            self.stats.skipped += 1
            self._sent_back.setdefault(pq, set()).add(offset)
            next_offset = pq.remove_message([msg], self.clock())
            if next_offset >= 0 and not pq.dropped and self.offset_store is not None:
                self.offset_store.update_offset(mq, next_offset, True)
        log.warning("consume.message_skipped", group=self.consumer_group, mq=str(mq), offset=offset,
                    msg_id=msg.msg_id, attempts=msg.reconsume_times)
        return {"msgId": msg.msg_id, "queueOffset": offset, "reconsumeTimes": msg.reconsume_times,
                "keys": msg.keys, "nextOffset": next_offset}

    async def consume_message_directly(self, msg: MessageExt, broker_name: str) -> ConsumeMessageDirectlyResult:
        """Run the listener on one message outside the queues (RocketMQ's consumeMessageDirectly)."""
        mq = MessageQueue(msg.topic, broker_name, msg.queue_id)
        msg.properties[MessageConst.CONSUME_START_TIME] = str(self.wall_clock())
        result, remark, spent = await self._consume_directly(msg, ConsumeConcurrentlyContext(mq),
                                                             ConsumeConcurrentlyStatus, _DIRECT_RESULTS)
        return ConsumeMessageDirectlyResult(order=False, auto_commit=True, consume_result=result, remark=remark,
                                            spent_time_millis=spent)
