"""The pull service: one trio task per assigned queue, pulling with RocketMQ's flow control.

Each loop runs :meth:`PullService.pull_once` (DefaultMQPushConsumerImpl.pullMessage plus its
PullCallback) and sleeps for the delay it returns:

* flow control, ``pull_time_delay_mills_when_flow_control`` (50 ms): more cached messages than
  ``pull_threshold_for_queue``, more cached MiB than ``pull_threshold_size_for_queue``, or (concurrently, and
  orderly with ``order_scope="key"``, whose commits are the contiguous completed prefix too) an offset span above
  ``consume_concurrently_max_span``;
* orderly consumers pull only while the process queue is locked (else retry after 3 s), and the first
  pull after locking re-reads the stored offset, which wins over the in-memory one;
* long polling: the pull carries the suspend flag, the broker holds it up to
  ``broker_suspend_max_time_millis`` (15 s), the client waits up to ``consumer_timeout_millis_when_suspend``
  (30 s);
* FOUND: messages (already tag-filtered exactly) go into the process queue and to
  ``consume_service.submit(process_queue, msgs, dispatch_to_consume, message_queue=mq)``, next pull after
  ``pull_interval``; NO_NEW_MSG / NO_MATCHED_MSG: pull again at once, and if nothing is cached move the
  stored offset forward; OFFSET_ILLEGAL: drop the queue, store the broker's next offset after 10 s and let
  the rebalance re-create it (at once, after the batch under way, when the broker moved the position back because
  its log began a newer master epoch: a failover lost records the consumer had read); any error: retry after
  ``pull_time_delay_mills_when_exception`` (3 s).

Reading while a master is away (issue 15): a pull goes to the broker id the last answer for the queue suggested
(``suggestWhichBrokerId``, RocketMQ's pullFromWhichNodeTable), else the master, else a slave of the broker name
(``ClientInstance.find_broker_addr_in_subscribe``). A pull that cannot reach its broker (connection refused or
broken) marks the address unreachable, asks for a route refresh and is retried **at once** on another address of
the broker name (the slave) instead of after 3 s; a slave's answers suggest the master again while it follows
one, so reads return to the master when it is back. Unlike RocketMQ 4.9.3 (``slaveReadEnable = false``), the
slave serves the pulls. An orderly queue whose master is down cannot be locked (locks live on the master): it
pauses, logged (``pull.orderly_paused_master_down``) and counted (``paused_master_down``).

A loop ends when its process queue is dropped (the rebalance also cancels an outstanding long poll).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from trimq.client.api import PullStatus, build_pull_sys_flag
from trimq.client.config import PushConsumerConfig
from trimq.client.errors import MQBrokerError, MQClientError, OffsetUnavailableError
from trimq.client.offset_store import READ_FROM_MEMORY, OffsetStore
from trimq.client.process_queue import ProcessQueue
from trimq.client.rebalance.impl import PullRequest, RebalanceClient, RebalanceImpl
from trimq.protocol.message import MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingConnectError, RemotingError
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = ["OFFSET_ILLEGAL_DELAY_MS", "ConsumeService", "PullService", "flow_control_reason"]

log = get_logger("trimq.pull")

OFFSET_ILLEGAL_DELAY_MS = 10_000
_MIB = 1024 * 1024


class ConsumeService(Protocol):
    """The hook the pull loop hands messages to (the orderly / concurrent consume services).

    ``submit`` must not block: it schedules consumption and returns. ``dispatch_to_consume`` is
    ProcessQueue.put_message's answer (True when no consume task is running for the queue: orderly
    services start one only then; concurrent services consume every batch).
    """

    def submit(
        self,
        process_queue: ProcessQueue,
        msgs: Sequence[MessageExt],
        dispatch_to_consume: bool,
        message_queue: MessageQueue,
    ) -> None: ...


def flow_control_reason(pq: ProcessQueue, config: PushConsumerConfig, orderly: bool) -> str | None:
    """Why a queue must not be pulled now (RocketMQ's checks, in its order), or None."""
    if pq.msg_count > config.pull_threshold_for_queue:
        return "count"
    if pq.msg_size // _MIB > config.pull_threshold_size_for_queue:
        return "size"
    if (not orderly or getattr(config, "order_scope", "queue") == "key") \
            and pq.max_span > config.consume_concurrently_max_span:
        return "span"
    return None


class PullService:
    """Pull loops of one consumer; :meth:`start` runs one per pull request in the bound nursery."""

    def __init__(
        self,
        *,
        consumer_group: str,
        config: PushConsumerConfig,
        client: RebalanceClient,
        rebalance: RebalanceImpl,
        offset_store: OffsetStore,
        consume_service: ConsumeService,
        consume_orderly: bool = False,
        clock: Callable[[], int] | None = None,
        on_queue_removed: Callable[[], None] | None = None,
    ) -> None:
        self.consumer_group = consumer_group
        self.config = config
        self.client = client
        self.rebalance = rebalance
        self.offset_store = offset_store
        # What a remote offset store keeps beside each offset (RemoteBrokerOffsetStore; a local store keeps none),
        # looked up once: the reset generation and lock grant sent with each pull's commit offset, the master epoch of
        # the log the stored position was read from (said by a first pull) and its stamp from each pull answer.
        self._reset_generation: Callable[[MessageQueue], int | None] | None = getattr(
            offset_store, "reset_generation", None)
        self._lock_epoch: Callable[[MessageQueue], int | None] | None = getattr(offset_store, "lock_epoch", None)
        self._master_epoch: Callable[[MessageQueue], int | None] | None = getattr(offset_store, "master_epoch", None)
        self._set_master_epoch: Callable[[MessageQueue, int], None] | None = getattr(
            offset_store, "set_master_epoch", None)
        self.consume_service = consume_service
        self.consume_orderly = consume_orderly
        self.clock: Callable[[], int] = clock or (lambda: int(trio.current_time() * 1000))
        self.on_queue_removed = on_queue_removed
        self.paused = False
        self.nursery: trio.Nursery | None = None
        self._scopes: dict[int, trio.CancelScope] = {}
        self._naps: dict[int, trio.CancelScope] = {}
        self._waiting_out_pause: set[int] = set()  # loops whose nap is the pause's delay: resume() ends them
        self._rate = RateLimiter(10_000)
        self.stats: dict[str, int] = {"pulls": 0, "found": 0, "messages": 0, "no_new": 0, "errors": 0,
                                      "flow_control": 0, "filtered_out": 0, "offset_illegal": 0,
                                      "from_slave": 0, "paused_master_down": 0, "suspended": 0}
        #: The broker id each queue's last answer suggested (RocketMQ's PullAPIWrapper.pullFromWhichNodeTable).
        self.pull_from_which_node: dict[MessageQueue, int] = {}
        #: Orderly queues paused because their broker's master is down: queue -> since (ms, this service's clock).
        self.paused_master_down: dict[MessageQueue, int] = {}
        self._answered = 0
        self.on_pull_rt: Callable[[MessageQueue, float], None] | None = None
        """Told the duration (s) of every answered PULL_MESSAGE (the push consumer's metrics)."""

    def bind(self, nursery: trio.Nursery) -> None:
        """The nursery pull loops run in (the consumer's)."""
        self.nursery = nursery

    # --- PullServiceHook ------------------------------------------------------------------------------

    def start(self, request: PullRequest) -> None:
        """Start pulling ``request``'s queue (RocketMQ's executePullRequestImmediately, once per queue)."""
        if self.nursery is None:
            raise MQClientError("the pull service is not bound to a nursery (consumer not started)")
        scope = trio.CancelScope()
        self._scopes[id(request.process_queue)] = scope
        self.nursery.start_soon(self._loop, request, scope)

    def cancel(self, process_queue: ProcessQueue) -> None:
        """Stop the loop of a dropped process queue now, abandoning an outstanding long poll."""
        scope = self._scopes.pop(id(process_queue), None)
        if scope is not None:
            scope.cancel()

    def wake(self, process_queue: ProcessQueue) -> None:
        """Pull ``process_queue`` now if its loop is waiting out a delay (e.g. the 3 s retry of a queue that was
        not locked, when its lock is back)."""
        nap = self._naps.get(id(process_queue))
        if nap is not None:
            nap.cancel()

    def resume(self) -> None:
        """Pull again after a pause (``paused``): the loops waiting out the pause's delay pull now, not up to
        ``pull_time_delay_mills_when_suspend`` later. Naps for other reasons (flow control, errors) run on."""
        self.paused = False
        for key in self._waiting_out_pause:
            nap = self._naps.get(key)
            if nap is not None:
                nap.cancel()
        self._waiting_out_pause.clear()

    def cancel_all(self) -> None:
        for scope in self._scopes.values():
            scope.cancel()
        self._scopes.clear()

    @property
    def active_loops(self) -> int:
        return len(self._scopes)

    # --- the loop --------------------------------------------------------------------------------------

    async def _loop(self, request: PullRequest, scope: trio.CancelScope) -> None:
        pq = request.process_queue
        try:
            with scope:
                delay: float | None = 0.0
                while not pq.dropped:
                    answered = self._answered
                    delay = await self.pull_once(request)
                    if delay is None:
                        break
                    if delay > 0:
                        with trio.move_on_after(delay) as nap:  # wake() ends it early
                            self._naps[id(pq)] = nap
                            await trio.sleep_forever()
                        self._naps.pop(id(pq), None)
                        self._waiting_out_pause.discard(id(pq))
                    elif self._answered == answered:
                        # no answer came (so perhaps no wait at all): let the others run before trying again
                        await trio.lowlevel.checkpoint()
        finally:
            if self._scopes.get(id(pq)) is scope:
                del self._scopes[id(pq)]
                self._naps.pop(id(pq), None)
                self._waiting_out_pause.discard(id(pq))

    async def _after_batch_under_way(self, pq: ProcessQueue) -> None:
        """Orderly: wait (at most ``consume_lock_wait_millis``) until the batch under way, which commits even on a
        dropped queue, is done, so the offset stored next is not overwritten by it. A concurrent service commits
        nothing of a dropped queue."""
        if not self.consume_orderly:
            return
        lock = self.rebalance.consume_lock(pq)
        with trio.move_on_after(self.config.consume_lock_wait_millis / 1000):
            async with lock:
                pass

    def _later(self, ms: int) -> float:
        return ms / 1000

    async def pull_once(self, request: PullRequest) -> float | None:
        """One pull of one queue; returns the delay (s) before the next, or None to stop (queue dropped)."""
        pq, mq, cfg = request.process_queue, request.message_queue, self.config
        if pq.dropped:
            return None
        now = self.clock()
        pq.last_pull_timestamp = now
        if self.paused:
            self.stats["suspended"] += 1  # pulls put off by suspend()
            self._waiting_out_pause.add(id(pq))
            return self._later(cfg.pull_time_delay_mills_when_suspend)

        reason = flow_control_reason(pq, cfg, self.consume_orderly)
        if reason is not None:
            self.stats["flow_control"] += 1
            log_rate_limited(self._rate, ("flow", reason, mq), now, log.warning, "pull.flow_control",
                             group=self.consumer_group, mq=str(mq), reason=reason, msg_count=pq.msg_count,
                             msg_size_mib=pq.msg_size // _MIB, max_span=pq.max_span)
            return self._later(cfg.pull_time_delay_mills_when_flow_control)

        if self.consume_orderly:
            if not pq.locked:
                master_down = getattr(self.client, "master_down", None)
                if master_down is not None and master_down(mq.broker_name):
                    # Visible (issue 15): the locks live on the master, so this queue waits for it (or a promotion).
                    since = self.paused_master_down.setdefault(mq, now)
                    self.stats["paused_master_down"] += 1
                    log_rate_limited(self._rate, ("master_down", mq), now, log.warning,
                                     "pull.orderly_paused_master_down", group=self.consumer_group, mq=str(mq),
                                     broker=mq.broker_name, paused_ms=now - since,
                                     why="the master of the broker is down: orderly queues need its locks")
                    return self._later(min(cfg.pull_time_delay_mills_when_exception, 1000))
                self.paused_master_down.pop(mq, None)
                log_rate_limited(self._rate, ("not_locked", mq), now, log.info, "pull.not_locked",
                                 group=self.consumer_group, mq=str(mq))
                return self._later(cfg.pull_time_delay_mills_when_exception)
            self.paused_master_down.pop(mq, None)
            if not request.locked_first:
                try:
                    offset = await self.rebalance.compute_pull_from_where(mq)
                except OffsetUnavailableError as exc:
                    log.warning("pull.offset_unavailable", group=self.consumer_group, mq=str(mq), error=str(exc))
                    return self._later(cfg.pull_time_delay_mills_when_exception)
                if offset < request.next_offset:
                    log.info("pull.first_locked_offset_behind", group=self.consumer_group, mq=str(mq),
                             stored=offset, in_memory=request.next_offset)
                request.locked_first = True
                request.next_offset = offset
                if pq.dropped:
                    return None

        sub = self.rebalance.subscription_inner.get(mq.topic)
        if sub is None:
            log_rate_limited(self._rate, ("no_sub", mq), now, log.warning, "pull.no_subscription",
                             group=self.consumer_group, mq=str(mq))
            return self._later(cfg.pull_time_delay_mills_when_exception)

        commit_offset = 0
        generation = None
        lock_epoch = None
        if self.rebalance.clustering:
            stored = await self.offset_store.read_offset(mq, READ_FROM_MEMORY)
            if stored > 0:
                commit_offset = stored
                lock_epoch = self._lock_epoch(mq) if self._lock_epoch is not None else None
                # the reset generation that offset belongs to: a pull made before a reset cannot undo it
                generation = self._reset_generation(mq) if self._reset_generation is not None else None
        sys_flag = build_pull_sys_flag(commit_offset > 0, True, True)

        self.stats["pulls"] += 1
        started = trio.current_time()
        addr: str | None = None
        broker_id = 0
        try:
            addr, broker_id = await self._pull_addr(mq)
            if broker_id != 0:
                self.stats["from_slave"] += 1  # pulls sent to a slave (its master is away, or suggested it)
            result = await self.client.api.pull_message(
                addr,
                consumer_group=self.consumer_group,
                mq=mq,
                queue_offset=request.next_offset,
                max_msg_nums=cfg.pull_batch_size,
                sys_flag=sys_flag,
                commit_offset=commit_offset,
                suspend_timeout_millis=cfg.broker_suspend_max_time_millis,
                subscription=sub.sub_string,
                sub_version=sub.sub_version,
                tags=sub.tags_set,
                timeout_ms=cfg.consumer_timeout_millis_when_suspend,
                reset_generation=generation,
                master_epoch=(request.master_epoch if request.master_epoch is not None
                              else self._master_epoch(mq) if self._master_epoch is not None else None),
                lock_epoch=lock_epoch,
            )
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            self.stats["errors"] += 1
            log_rate_limited(self._rate, ("pull_error", mq), self.clock(), log.warning, "pull.failed",
                             group=self.consumer_group, mq=str(mq), offset=request.next_offset, error=str(exc),
                             addr=addr, broker_id=broker_id)
            if addr is not None and isinstance(exc, RemotingConnectError):
                note_failure = getattr(self.client, "note_failure", None)
                if note_failure is not None:
                    note_failure(addr, exc)  # avoided from now on, routes refreshed
                self.pull_from_which_node.pop(mq, None)
                other = await self._other_addr(mq, addr)
                if other:
                    return 0.0  # the slave (or the master again) is there: no 3 s pause (issue 15)
            return self._later(cfg.pull_time_delay_mills_when_exception)
        self._answered += 1  # a response arrived: this task waited for it, no extra checkpoint is needed
        if self.on_pull_rt is not None:
            self.on_pull_rt(mq, trio.current_time() - started)
        if result.suggest_which_broker_id != self.pull_from_which_node.get(mq, 0):
            if result.suggest_which_broker_id == 0:
                self.pull_from_which_node.pop(mq, None)
            else:
                self.pull_from_which_node[mq] = result.suggest_which_broker_id

        if pq.dropped:
            return None
        self.stats["filtered_out"] += result.filtered_out
        status = result.status
        if result.master_epoch is not None and status is not PullStatus.OFFSET_ILLEGAL:
            request.master_epoch = result.master_epoch  # the log the next offset belongs to
            # and the consumed offsets below it (a position past a newer epoch's start is moved, never kept)
            if self._set_master_epoch is not None:
                self._set_master_epoch(mq, result.master_epoch)
        if status is PullStatus.FOUND:
            prev = request.next_offset
            request.next_offset = result.next_begin_offset
            msgs = result.msg_found_list
            if not msgs:
                return 0.0
            self.stats["found"] += 1
            self.stats["messages"] += len(msgs)
            if msgs[0].queue_offset < prev:
                log.warning("pull.offset_went_back", group=self.consumer_group, mq=str(mq),
                            first=msgs[0].queue_offset, requested=prev)
            dispatch = pq.put_message(msgs)
            self.consume_service.submit(pq, msgs, dispatch, message_queue=mq)
            return self._later(cfg.pull_interval)
        if status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            self.stats["no_new"] += 1
            request.next_offset = result.next_begin_offset
            self.correct_tags_offset(request)
            return 0.0
        # OFFSET_ILLEGAL
        self.stats["offset_illegal"] += 1
        # Moved back because the broker's log began a newer master epoch than our position's (a failover lost the
        # records past it): nothing to let settle for 10 s, only the batch under way.
        moved_back = (request.master_epoch is not None and result.master_epoch is not None
                      and result.master_epoch > request.master_epoch)
        log.warning("pull.offset_illegal", group=self.consumer_group, mq=str(mq), requested=request.next_offset,
                    next_begin=result.next_begin_offset, min=result.min_offset, max=result.max_offset,
                    moved_back_by_master_epoch=moved_back)
        request.next_offset = result.next_begin_offset
        pq.dropped = True
        self._scopes.pop(id(pq), None)  # the removal below must not cancel this very task
        if moved_back:
            await self._after_batch_under_way(pq)
        else:
            await trio.sleep(OFFSET_ILLEGAL_DELAY_MS / 1000)
        if self.rebalance.process_queue_table.get(mq) is not pq:
            # The queue was dropped and taken again meanwhile (a rebalance, a pause past the lease): its new process
            # queue's position is the one that counts. Storing this older one would rewind the queue under the new
            # lock grant (RocketMQ stores it regardless; long ASYNC chaos seed 19: 1416 -> 161, ten seconds after
            # SIGCONT).
            log.info("pull.offset_illegal_superseded", group=self.consumer_group, mq=str(mq),
                     offset=request.next_offset)
            return None
        self.offset_store.update_offset(mq, request.next_offset, False)
        await self.offset_store.persist(mq)
        if self.rebalance.remove_process_queue(mq, pq) is not None:
            await self.rebalance.remove_unnecessary_message_queue(mq, pq)
            log.warning("pull.offset_illegal_fixed", group=self.consumer_group, mq=str(mq),
                        offset=request.next_offset)
            if self.on_queue_removed is not None:
                self.on_queue_removed()
        return None

    async def _pull_addr(self, mq: MessageQueue) -> tuple[str, int]:
        """The address (and broker id) to pull ``mq`` from: see the module docstring."""
        find = getattr(self.client, "find_broker_addr_for_read", None)
        if find is None:  # a client without HA routing (tests' fakes): the master
            addr = await self.client.find_broker_addr(mq.broker_name, mq.topic)
            found = (addr, 0) if addr is not None else None
        else:
            found = await find(mq.broker_name, self.pull_from_which_node.get(mq, 0), mq.topic)
        if found is None:
            raise MQClientError(f"broker {mq.broker_name!r} of {mq} is not in any known route")
        return found

    async def _other_addr(self, mq: MessageQueue, failed: str) -> bool:
        """Whether another, reachable address of ``mq``'s broker is listed (the retry goes there at once)."""
        find = getattr(self.client, "find_broker_addr_in_subscribe", None)
        if find is None:
            return False
        found = find(mq.broker_name, 0)
        return found is not None and found[0] != failed

    def correct_tags_offset(self, request: PullRequest) -> None:
        """Nothing cached: the broker's next offset is safe to store (skips filtered-out messages)."""
        if request.process_queue.msg_count == 0:
            self.offset_store.update_offset(request.message_queue, request.next_offset, True)

    def info(self) -> dict[str, Any]:
        return {"paused": self.paused, "loops": self.active_loops, **self.stats,
                "pausedMasterDown": [mq.to_wire() for mq in sorted(self.paused_master_down)]}
