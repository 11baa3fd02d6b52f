"""ConsumeMessageKeyedService: orderly consumption with ``order_scope="key"`` (issue 17, DESIGN.md §6.11).

RocketMQ's orderly service serialises a whole queue: one slow message holds up every key of the queue. Here the
messages of one locked queue go to the listener concurrently *across keys*, strictly one batch at a time and in
queue order *per key*. The key is the message's sharding key (``__SHARDINGKEY``, set by ``Producer.send(msg,
sharding_key=...)``), else its KEYS, else ``""`` (:func:`client.key_backlog.message_key`).

What is kept from the orderly service (this class extends :class:`client.consume.orderly.ConsumeMessageOrderlyService`
and reuses its lock, lease and fencing machinery):

* the broker's queue lock as a lease: no batch starts (the check runs right before each listener call) once the
  lease has run out or the broker connection dropped; the queue is re-locked and resumed as in queue scope; each
  batch's context carries the lock's fencing epoch (``context.lock_epoch``);
* one consume task per queue (the queue's ``mq_lock``): here a *dispatcher* that hands each ready key's next batch
  to a task of its own, in the dispatcher's nursery (so no batch outlives it, and a re-lock's new dispatcher starts
  only after the old one's batches ended);
* the process queue's consume lock, held *shared* by every batch from its listener call until its offset is
  committed; a rebalance (or an operator's skip) takes it exclusively, so it still never unlocks a queue while one
  of its batches is being consumed (:class:`client.consume_lock.ConsumeLock`);
* results: SUCCESS commits; SUSPEND_CURRENT_QUEUE_A_MOMENT (also an exception or ``None``) retries the same batch
  after ``suspend_current_queue_time_millis`` (the context's, or the consumer's; clamped to [10, 30000] ms) —
  suspending only its key, the others keep flowing (within ``max_in_flight_keys`` and the cache limits); at
  ``max_reconsume_times`` the message is dead-lettered at once and its key moves on. The shutdown rules are the
  same (client.consume.common).

What differs:

* **Offsets** commit the contiguous completed prefix of the queue (the smallest uncompleted offset, as concurrent
  mode's ProcessQueue minimum): a takeover replays from the first incomplete message — replays are bounded, and
  per-key order among first deliveries still holds.
* **max_reconsume_times** -1 means 16, as in concurrent mode, not unbounded: a stuck key pins the committed
  offset, and past ``consume_concurrently_max_span`` the pull stops for every key of the queue (flow control), so
  retrying one message forever would eventually stall the queue as queue scope does.
* **Concurrency**: at most ``max_in_flight_keys`` keys of this consumer (all its queues) have a batch under way;
  an ``async def`` listener runs that many at once, a plain ``def`` one is also held to ``consume_thread_max``
  threads. Batches hold consecutive messages of one key (``consume_message_batch_max_size``).
* ``auto_commit`` is not used: COMMIT and ROLLBACK are logged as illegal and commit, as with ``auto_commit`` true.
* **Visible blocking** is per key: a key retrying a message is in :attr:`blocked_keys` (exported as the
  ``trimq_consumer_blocked_keys`` gauge, logged rate-limited, shown by GET_CONSUMER_RUNNING_INFO as
  ``blockedKeys`` and by ``trimq-admin consumer status``), and :meth:`skip_message` dead-letters any cached message
  (waiting, or the one its key is suspended on) and lets its key move on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from trimq.client.consume.common import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    normalize_status,
    reset_retry_and_namespace,
)
from trimq.client.consume.orderly import (
    RELOCK_AT_START_MS,
    RELOCK_IN_LOOP_MS,
    RESUBMIT_AFTER_LOCK_OK_MS,
    SKIP_LOCK_WAIT_S,
    BlockedQueue,
    ConsumeMessageOrderlyService,
    _LockLapsed,
    clamp_suspend_millis,
)
from trimq.client.consume_lock import ConsumeLock
from trimq.client.errors import MQClientError
from trimq.client.key_backlog import KeyBacklog, KeyTurn
from trimq.client.process_queue import ProcessQueue
from trimq.protocol.message import MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = ["KEY_SCOPE_MAX_RECONSUME_TIMES", "BlockedKey", "ConsumeMessageKeyedService"]

log = get_logger("trimq.consume.keyed")

KEY_SCOPE_MAX_RECONSUME_TIMES = 16
"""What ``max_reconsume_times = -1`` means in key scope (module documentation)."""
BLOCKED_KEY_LOG_INTERVAL_MS = 10_000

_DONE, _RETRY, _RELEASE = "done", "retry", "release"


@dataclass
class BlockedKey(BlockedQueue):
    """A key of a key-scope queue retrying the message at ``offset`` (DESIGN.md §6.5, per key): a blocked queue's
    record plus the key."""

    key: str

    def to_wire(self, now_ms: int) -> dict[str, Any]:
        return {**super().to_wire(now_ms), "key": self.key}


class _QueueRun:
    """The dispatcher state of one process queue."""

    __slots__ = ("changed", "halt", "requested", "tasks")

    def __init__(self) -> None:
        self.requested = False  # a dispatcher was started and has not left its loop
        self.tasks = 0  # key tasks under way (in the listener, committing, or suspended)
        self.changed = trio.Event()  # new messages, a key task ended
        self.halt = trio.Event()  # the dispatcher stopped (lock lapsed, dropped, shutdown): end suspensions now

    def poke(self) -> None:
        self.changed.set()


class ConsumeMessageKeyedService(ConsumeMessageOrderlyService):
    """The orderly consume service with ``order_scope="key"`` (see the module documentation)."""

    order_scope = "key"

    def _init_state(self) -> None:
        super()._init_state()
        # Keys under way (a batch taken until it is committed, suspensions excluded), over all queues: what bounds
        # the listener calls (a plain-def listener is also held to the invoker's consume_thread_max threads).
        self.key_slots = trio.CapacityLimiter(self.config.max_in_flight_keys)
        self._runs: dict[int, tuple[ProcessQueue, _QueueRun]] = {}
        self.blocked_keys: dict[tuple[MessageQueue, str], BlockedKey] = {}
        self._key_rate = RateLimiter(BLOCKED_KEY_LOG_INTERVAL_MS)

    @property
    def max_reconsume_times(self) -> int:
        """-1 is :data:`KEY_SCOPE_MAX_RECONSUME_TIMES` (16) in key scope."""
        v = self.config.max_reconsume_times
        return KEY_SCOPE_MAX_RECONSUME_TIMES if v == -1 else v

    def _run(self, pq: ProcessQueue) -> _QueueRun:
        entry = self._runs.get(id(pq))
        if entry is None or entry[0] is not pq:
            entry = self._runs[id(pq)] = (pq, _QueueRun())
        return entry[1]

    def stop(self) -> None:
        """No new batch starts, and suspended keys stop waiting (their batches stay uncommitted)."""
        super().stop()
        for _, run in list(self._runs.values()):
            run.halt.set()
            run.poke()

    # --- ConsumeService hook -------------------------------------------------------------------------

    def submit(self, process_queue: ProcessQueue, msgs: Any, dispatch_to_consume: bool,
               message_queue: MessageQueue) -> None:
        """New messages (already in the process queue and so in its key backlog): wake the queue's dispatcher, or
        start one (non-blocking). ``dispatch_to_consume`` is not needed: every pull may bring a ready key."""
        pq = process_queue
        if pq.key_backlog is None:
            pq.enable_key_scope()
        run = self._run(pq)
        if run.requested:
            run.poke()
        elif self._spawn(self.consume_request, pq, message_queue):
            run.requested = True

    # --- the dispatcher ------------------------------------------------------------------------------

    async def consume_request(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        """The queue's dispatcher: hands each ready key's next batch to a task of its own while the queue is usable
        (CLUSTERING: locked, lease unexpired), up to ``max_in_flight_keys`` over the consumer."""
        run = self._run(pq)
        run.requested = True
        try:
            async with self.mq_lock(mq), trio.open_nursery() as nursery:
                run.halt = trio.Event()
                await self._dispatch(pq, mq, run, nursery)
                # Left the loop: a submit from now on starts a new dispatcher (it waits for this one's key tasks).
                run.requested = False
                run.halt.set()  # suspended keys give their batches back now rather than at the end of their pause
        except BaseException:
            run.requested = False
            raise
        finally:
            if not run.requested and self._runs.get(id(pq), (None, None))[1] is run:
                del self._runs[id(pq)]  # nothing refers to it any more (a new submit makes a new one)

    async def _dispatch(self, pq: ProcessQueue, mq: MessageQueue, run: _QueueRun, nursery: trio.Nursery) -> None:
        backlog = pq.key_backlog or pq.enable_key_scope()
        if pq.dropped:
            log.info("consume.queue_dropped", group=self.consumer_group, mq=str(mq))
            return
        if not self._usable(pq):
            self._relock_later(pq, mq, run, RELOCK_AT_START_MS)
            return
        batch = self.config.consume_message_batch_max_size
        while True:
            if pq.dropped:
                log.info("consume.queue_dropped", group=self.consumer_group, mq=str(mq))
                return
            if self.stopping:
                return
            if self.clustering and not pq.locked:
                log.warning("consume.queue_not_locked", group=self.consumer_group, mq=str(mq))
                self._relock_later(pq, mq, run, RELOCK_IN_LOOP_MS)
                return
            if self.clustering and pq.is_lock_expired(self.clock()):
                log.warning("consume.queue_lock_expired", group=self.consumer_group, mq=str(mq))
                self._relock_later(pq, mq, run, RELOCK_IN_LOOP_MS)
                return
            if not backlog.has_ready():
                if run.tasks == 0 and not backlog.has_ready():
                    return  # nothing to do: the next pull (submit) starts a new dispatcher
                run.changed = trio.Event()
                await run.changed.wait()
                continue
            token = object()
            try:
                self.key_slots.acquire_on_behalf_of_nowait(token)  # no scheduling round when a slot is free
            except trio.WouldBlock:
                await self.key_slots.acquire_on_behalf_of(token)
            turn = backlog.take(batch) if not (pq.dropped or self.stopping) else None
            if turn is None:
                self.key_slots.release_on_behalf_of(token)
                continue
            run.tasks += 1
            nursery.start_soon(self._key_task, pq, mq, run, backlog, turn, token)

    def _relock_later(self, pq: ProcessQueue, mq: MessageQueue, run: _QueueRun, delay_ms: int) -> None:
        # the resubmission after the lock must start a new dispatcher: this one is leaving its loop
        run.requested = False
        if not pq.dropped:
            self.try_lock_later_and_reconsume(mq, pq, delay_ms)

    async def _key_task(self, pq: ProcessQueue, mq: MessageQueue, run: _QueueRun, backlog: KeyBacklog,
                        turn: KeyTurn, token: object) -> None:
        """One key's turn: its batch in the listener until it is consumed or dead-lettered (retried after each
        suspension, without a slot meanwhile), or given back when the queue can no longer be consumed. Then, while
        its slot is wanted by no other queue (nobody waits for one) and the dispatcher still runs, the task goes on
        with the next ready key of its queue itself: no new task, no dispatcher round per message."""
        batch = self.config.consume_message_batch_max_size
        # One cancel scope for the task, not one per listener call (trio's cost tens of µs each): it is in
        # ``_listening`` only while the listener runs, so the shutdown's seal cancels a listener call under way and
        # never result processing; a cancelled call ends the task, its batch uncommitted.
        scope = trio.CancelScope()
        try:
            with scope:
                await self._key_turns(pq, mq, run, backlog, turn, token, scope, batch)
            if scope.cancelled_caught and self.sealed:
                self.dropped_results += 1
        finally:
            run.tasks -= 1
            run.poke()

    async def _key_turns(self, pq: ProcessQueue, mq: MessageQueue, run: _QueueRun, backlog: KeyBacklog,
                         turn: KeyTurn, token: object, scope: trio.CancelScope, batch: int) -> None:
        held_slot = True
        try:
            while True:
                outcome, delay_ms = await self._consume_turn(pq, mq, turn, scope)
                if outcome == _DONE:
                    backlog.finish(turn)
                    if (run.requested and not run.halt.is_set() and not self.stopping and not pq.dropped
                            and not self.key_slots.statistics().tasks_waiting):
                        nxt = backlog.take(batch)
                        if nxt is not None:
                            turn = nxt
                            continue
                    return
                if outcome == _RELEASE:
                    backlog.release(turn)
                    return
                self.key_slots.release_on_behalf_of(token)
                held_slot = False
                with trio.move_on_after(delay_ms / 1000):
                    await run.halt.wait()
                if backlog.turn(turn.key) is not turn:
                    return  # an operator skipped what was left of the turn: the key moved on
                if run.halt.is_set() or pq.dropped or self.stopping:
                    backlog.release(turn)
                    return
                await self.key_slots.acquire_on_behalf_of(token)
                held_slot = True
        finally:
            if held_slot:
                self.key_slots.release_on_behalf_of(token)

    async def _listen(self, scope: trio.CancelScope, msgs: list[MessageExt], context: ConsumeOrderlyContext,
                      before: Any) -> Any:
        """ConsumeServiceBase.call_listener with the key task's cancel scope; no limiter (the key slots bound the
        calls). None when the service is stopping."""
        if self.stopping:
            return None
        await before()
        self._listening.add(scope)
        self._notify()
        try:
            return await self.invoker.invoke(msgs, context)
        finally:
            self._listening.discard(scope)
            self._notify()

    async def _consume_turn(self, pq: ProcessQueue, mq: MessageQueue, turn: KeyTurn,
                            scope: trio.CancelScope) -> tuple[str, int]:
        """One listener call on a key's batch and its result: (DONE | RETRY | RELEASE, suspend ms)."""
        lock = self.rebalance.consume_lock(pq) if self.rebalance is not None else None
        if lock is not None and not isinstance(lock, ConsumeLock):
            raise TypeError("key scope needs the rebalance's ConsumeLock (shared holds)")
        if lock is not None:
            await lock.acquire_shared()
        try:
            if pq.dropped:
                return _RELEASE, 0
            msgs = list(turn.msgs)  # read under the lock: an operator's skip may have taken some out
            if not msgs:
                return _DONE, 0
            context = self.batch_context(mq)
            hook_ctx = self.hook_context(mq, msgs) if self.hooks else None
            before = self.before_listener(pq, hook_ctx)
            reset_retry_and_namespace(msgs, self.consumer_group)
            try:
                outcome = await self._listen(scope, msgs, context, before)
            except _LockLapsed:
                log.warning("consume.queue_lock_expired", group=self.consumer_group, mq=str(mq))
                return _RELEASE, 0  # the dispatcher sees the lapsed lock and re-locks the queue
            if outcome is None:
                # not run (shutdown began) or abandoned at the seal: the batch stays uncommitted
                if self.sealed:
                    self.dropped_results += 1
                return _RELEASE, 0
            S = ConsumeOrderlyStatus
            status = normalize_status(outcome.value, S)
            if outcome.error is not None:
                self.log_listener_exception(mq, msgs, outcome.error)
            return_type = self.return_type(status, outcome, S.SUSPEND_CURRENT_QUEUE_A_MOMENT)
            if status is None:
                status = S.SUSPEND_CURRENT_QUEUE_A_MOMENT
            assert isinstance(status, ConsumeOrderlyStatus)
            if hook_ctx is not None:
                hook_ctx["props"]["ConsumeContextType"] = return_type.name
                hook_ctx.update(status=status.name, return_type=return_type.name, consume_rt_ms=outcome.spent_ms,
                                success=status is not S.SUSPEND_CURRENT_QUEUE_A_MOMENT)
                await self.hooks.run("after", hook_ctx)
            self.stats.inc_consume_rt(mq.topic, outcome.spent_ms)
            if self.sealed:
                self.dropped_results += 1
                log.warning("consume.result_dropped_after_shutdown", group=self.consumer_group, mq=str(mq),
                            offsets=[m.queue_offset for m in msgs], status=status.name)
                return _RELEASE, 0
            with self.processing():
                return await self._process_result(pq, mq, turn, msgs, status, context)
        finally:
            if lock is not None:
                lock.release_shared()

    async def _process_result(self, pq: ProcessQueue, mq: MessageQueue, turn: KeyTurn, msgs: list[MessageExt],
                              status: ConsumeOrderlyStatus, context: ConsumeOrderlyContext) -> tuple[str, int]:
        S = ConsumeOrderlyStatus
        if status in (S.COMMIT, S.ROLLBACK):
            log.warning("consume.orderly_illegal_status", group=self.consumer_group, mq=str(mq), status=status.name,
                        note="key scope commits as with auto_commit true")
        if status is not S.SUSPEND_CURRENT_QUEUE_A_MOMENT:
            self.stats.inc_consume(mq.topic, len(msgs), 0)
            self._commit(pq, mq, msgs)
            self._unblock_key(mq, turn.key)
            return _DONE, 0
        self.stats.inc_consume(mq.topic, 0, len(msgs))
        if self.stopping:
            return _RELEASE, 0  # shutting down: the next owner retries these (nothing sent back, nothing committed)
        dead: list[MessageExt] = []
        retry = await self.check_reconsume_times(msgs, mq, dead)
        if dead:
            self._commit(pq, mq, dead)
        if not retry:
            self._unblock_key(mq, turn.key)
            return _DONE, 0
        if dead and pq.key_backlog is not None:
            pq.key_backlog.drop(turn, dead)  # only the retried messages stay in the turn
        self._record_blocked_key(mq, turn.key, turn.msgs, context)
        return _RETRY, clamp_suspend_millis(context.suspend_current_queue_time_millis,
                                            self.config.suspend_current_queue_time_millis)

    def _commit(self, pq: ProcessQueue, mq: MessageQueue, msgs: list[MessageExt]) -> None:
        """These messages are completed: commit the contiguous completed prefix. Committed even if a rebalance
        dropped the queue meanwhile, as in queue scope: the batch holds the consume lock (shared), which the
        rebalance takes before it persists the offset and unlocks the queue; a reset empties the process queue
        first, and then nothing is committed (-1)."""
        offset = pq.complete(msgs, self.clock())
        if offset >= 0 and self.offset_store is not None:
            self.offset_store.update_offset(mq, offset, False)

    # --- blocked keys ----------------------------------------------------------------------------------------

    def _record_blocked_key(self, mq: MessageQueue, key: str, retried: list[MessageExt],
                            context: ConsumeOrderlyContext) -> None:
        if not retried:
            return
        head = retried[0]
        now = self.clock()
        cur = self.blocked_keys.get((mq, key))
        if cur is None or cur.offset != head.queue_offset:
            cur = self.blocked_keys[(mq, key)] = BlockedKey(mq, head.queue_offset, head.msg_id, now,
                                                            head.reconsume_times, now, key=key)
        cur.attempts = head.reconsume_times
        cur.last_failure_ms = now
        log_rate_limited(
            self._key_rate, (mq, key), now, log.warning, "consume.key_blocked",
            group=self.consumer_group, topic=mq.topic, broker=mq.broker_name, queue_id=mq.queue_id, msg_key=key,
            offset=head.queue_offset, msg_id=head.msg_id, attempts=head.reconsume_times,
            blocked_ms=cur.blocked_ms(now), max_reconsume_times=self.max_reconsume_times,
            suspend_ms=clamp_suspend_millis(context.suspend_current_queue_time_millis,
                                            self.config.suspend_current_queue_time_millis),
        )

    def _unblock_key(self, mq: MessageQueue, key: str) -> None:
        cur = self.blocked_keys.pop((mq, key), None)
        if cur is not None:
            log.info("consume.key_unblocked", group=self.consumer_group, mq=str(mq), key=key, offset=cur.offset,
                     attempts=cur.attempts, blocked_ms=cur.blocked_ms(self.clock()))

    def blocked_key_list(self) -> list[BlockedKey]:
        """Keys of the queues held by this consumer that are retrying one message, longest blocked first."""
        table = self.rebalance.process_queue_table if self.rebalance is not None else {}
        for (mq, key), b in list(self.blocked_keys.items()):
            pq = table.get(mq)
            backlog = pq.key_backlog if pq is not None and not pq.dropped else None
            turn = backlog.turn(key) if backlog is not None else None
            if turn is None or not any(m.queue_offset == b.offset for m in turn.msgs):
                del self.blocked_keys[(mq, key)]
        return sorted(self.blocked_keys.values(), key=lambda b: b.since_ms)

    def blocked_key_counts(self) -> dict[MessageQueue, int]:
        """Blocked keys per queue (the ``trimq_consumer_blocked_keys`` gauge)."""
        out: dict[MessageQueue, int] = {}
        for b in self.blocked_key_list():
            out[b.message_queue] = out.get(b.message_queue, 0) + 1
        return out

    # --- operator actions --------------------------------------------------------------------------------

    async def skip_message(self, mq: MessageQueue, pq: ProcessQueue, offset: int,
                           skipped_by: str | None = None) -> dict[str, Any]:
        """Dead-letter the cached message at ``offset`` (waiting, or the one its key is suspended on) and let its key
        move on. Takes the queue's consume lock exclusively (at most 5 s): no batch of the queue is in the listener
        meanwhile. Raises MQClientError when the message is not cached here or cannot be sent back."""
        lock = self.rebalance.consume_lock(pq) if self.rebalance is not None else None
        if lock is None:
            return await self._skip_keyed(mq, pq, offset, skipped_by)
        with trio.move_on_after(SKIP_LOCK_WAIT_S) as scope:
            await lock.acquire()
        if scope.cancelled_caught:
            raise MQClientError(f"queue {mq} is busy consuming; try again")
        try:
            return await self._skip_keyed(mq, pq, offset, skipped_by)
        finally:
            lock.release()

    async def _skip_keyed(self, mq: MessageQueue, pq: ProcessQueue, offset: int,
                          skipped_by: str | None) -> dict[str, Any]:
        backlog = pq.key_backlog
        if pq.dropped:
            raise MQClientError(f"queue {mq} is no longer held by this consumer")
        found = backlog.locate(offset) if backlog is not None else None
        if backlog is None or found is None:
            first, last = pq.first_offset(), pq.last_offset()
            cached = f"cached offsets {first}..{last}" if first is not None else "nothing cached"
            raise MQClientError(f"message {mq}@{offset} is not cached by this consumer ({cached})")
        key, _, msg = found
        assert self.send_back is not None
        reset_retry_and_namespace([msg], self.consumer_group)
        ok = await self.send_back.send(
            msg, delay_level=-1, broker_name=mq.broker_name, max_reconsume_times=0,
            reconsume_times=msg.reconsume_times, fallback_reconsume_times=msg.reconsume_times,
            fallback_delay_level=0, stats=self.stats, skipped_by=skipped_by,
        )
        if not ok:
            raise MQClientError(f"could not dead-letter {mq}@{offset} (send-back and retry-topic produce failed)")
        self.stats.skipped += 1
        backlog.discard(offset)
        next_offset = pq.complete([msg], self.clock())
        if next_offset >= 0 and self.offset_store is not None:
            self.offset_store.update_offset(mq, next_offset, False)
        b = self.blocked_keys.get((mq, key))
        if b is not None and b.offset == offset:
            self._unblock_key(mq, key)
        log.warning("consume.message_skipped", group=self.consumer_group, mq=str(mq), offset=offset, key=key,
                    msg_id=msg.msg_id, attempts=msg.reconsume_times)
        if backlog.has_ready():
            self.submit_consume_request_later(pq, mq, RESUBMIT_AFTER_LOCK_OK_MS)
        return {"msgId": msg.msg_id, "queueOffset": offset, "reconsumeTimes": msg.reconsume_times,
                "keys": msg.keys, "key": key, "nextOffset": next_offset if next_offset >= 0 else None}
