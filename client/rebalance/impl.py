"""RebalanceImpl for push consumers: which queues this client consumes, and the process queue of each.

RocketMQ 4.9.3's RebalanceImpl + RebalancePushImpl, on trio:

* :meth:`RebalanceImpl.do_rebalance` runs :meth:`rebalance_by_topic` for every subscribed topic, then
  drops queues of topics no longer subscribed. CLUSTERING asks a broker for the group's client ids, sorts
  queues and ids as RocketMQ does and lets the allocation strategy pick this client's share (a strategy
  error aborts that topic's rebalance with a log line); BROADCASTING takes every queue.
* :meth:`update_process_queue_table_in_rebalance` drops queues no longer assigned (and queues not pulled
  for ``pull_max_idle_time``) and creates a process queue plus a pull request for each new one, starting
  at :meth:`compute_pull_from_where`.
* Orderly consumers lock new queues on the broker *before* pulling them and mark the new process queue
  locked at once (RocketMQ #2621: 4.9.3 waits for the next lockAll, up to 20 s); removing a queue takes
  its consume lock (at most ``consume_lock_wait_millis``, 1 s) so no message of it is being consumed,
  then unlocks it on the broker at once, or after ``unlock_delay_time_mills`` (20 s) when it still caches
  messages.
* :meth:`message_queue_changed` bumps the subscription version, splits the per-topic pull thresholds
  over the queues held, and asks for a heartbeat.

**Leases** (issue 14, ``lock_profile="lease"``, the default; docs/PROTOCOL.md "Queue-lock leases"): a broker
lock is a lease the broker grants for ``leaseMs``; the client counts it from when it *sent* the request that
got it, never believes it longer than ``rebalance_lock_max_live_time``, and the consume services start no batch
of a queue whose lease ran out. :meth:`RebalanceImpl.renew_leases` (called for every broker every third of a
lease by the client instance's renewal task, independently of consumption) renews all the queues held on one
broker in one request. Each grant carries a fencing epoch (:attr:`RebalanceImpl.lock_epochs`), given to the
offset store (every commit carries it) and to the listener's context. When the connection to a broker drops,
its queues stop at once (:meth:`RebalanceImpl.broker_connection_lost`) until they are locked again; the
re-lock claims the queues whose lease the client's own clock says is unexpired, which a restarted broker
honours during its restart grace.

Differences from 4.9.3, each deliberate: new queues of an orderly consumer are locked with one
LOCK_BATCH_MQ per broker instead of one per queue, and a failed lock is reported (``lock_failed``, with a
restarted broker's remaining grace in ``lock_grace_ms``) so the consumer can retry within a second, or as the
grace ends, instead of at the next periodic rebalance; a queue whose start
offset cannot be computed is unlocked at once instead of staying locked until expiry; a delayed unlock
is skipped when the queue has meanwhile been assigned to this client again (4.9.3 would release the
client's own new lock).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from trimq.client.api import LockBatchAnswer, MQClientAPI
from trimq.client.consume_lock import ConsumeLock
from trimq.client.errors import MQBrokerError, MQClientError, OffsetUnavailableError
from trimq.client.offset_store import READ_FROM_STORE, OffsetStore
from trimq.client.process_queue import ProcessQueue
from trimq.client.rebalance.strategies import AllocateStrategy
from trimq.client.subscription import SubscriptionData
from trimq.protocol.message_queue import MessageQueue, java_string_key
from trimq.protocol.validation import is_retry_topic
from trimq.runtime.client import RemotingError
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = ["PullRequest", "PullServiceHook", "RebalanceClient", "RebalanceImpl"]

log = get_logger("trimq.rebalance")

CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"
LOCK_BATCH_TIMEOUT_MS = 1000


@dataclass(eq=False)
class PullRequest:
    """One queue's pull state (RocketMQ's PullRequest): where to pull next, and its process queue."""

    consumer_group: str
    message_queue: MessageQueue
    process_queue: ProcessQueue
    next_offset: int
    locked_first: bool = False
    """Orderly: whether the first pull after the lock re-read the stored offset."""
    master_epoch: int | None = None
    """The master epoch of the log ``next_offset`` was reached in (the last answer's; None: from the offset store).
    Sent with each pull: after a failover that lost records the consumer had read, the broker moves it back."""


class RebalanceSettings(Protocol):
    """The push consumer settings a rebalance reads (a PushConsumerConfig is one). A Protocol rather than the
    config class itself, so that client.rebalance does not import client.config, which validates strategy
    names against client.rebalance.strategies (no import cycle)."""

    message_model: str
    consume_from_where: str
    consume_lock_wait_millis: int
    unlock_delay_time_mills: int
    rebalance_lock_max_live_time: int
    pull_max_idle_time: int
    pull_threshold_for_queue: int
    pull_threshold_size_for_queue: int
    pull_threshold_for_topic: int
    pull_threshold_size_for_topic: int

    @property
    def consume_timestamp_ms(self) -> int: ...


class RebalanceClient(Protocol):
    """What the rebalance needs from the client instance."""

    @property
    def client_id(self) -> str: ...

    @property
    def api(self) -> MQClientAPI: ...

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None: ...

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None: ...

    async def max_offset(self, mq: MessageQueue) -> int: ...

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int: ...

    async def send_heartbeat_to_all_brokers(self) -> None: ...


class PullServiceHook(Protocol):
    """Where new pull requests go and where dropped queues are reported (the pull service)."""

    def start(self, request: PullRequest) -> None: ...

    def cancel(self, process_queue: ProcessQueue) -> None: ...


def _wall_ms() -> int:
    return int(time.time() * 1000)


class RebalanceImpl:
    """One push consumer's rebalance state and logic (see the module documentation)."""

    def __init__(
        self,
        *,
        consumer_group: str,
        config: RebalanceSettings,
        strategy: AllocateStrategy,
        client: RebalanceClient,
        offset_store: OffsetStore,
        consume_orderly: bool = False,
        pull_service: PullServiceHook | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.consumer_group = consumer_group
        self.config = config
        self.message_model = config.message_model
        self.strategy = strategy
        self.client = client
        self.offset_store = offset_store
        self.consume_orderly = consume_orderly
        self.pull_service = pull_service
        self.clock: Callable[[], int] = clock or (lambda: int(trio.current_time() * 1000))
        self.subscription_inner: dict[str, SubscriptionData] = {}
        self.topic_subscribe_info_table: dict[str, set[MessageQueue]] = {}
        self.process_queue_table: dict[MessageQueue, ProcessQueue] = {}
        self.heartbeat_needed = False
        self.lock_failed = False
        """Orderly: the last do_rebalance could not lock some assigned queue (another member still holds it)."""
        self.lock_grace_ms: int | None = None
        """Orderly: a broker asked in the last do_rebalance was in its restart grace for this long more (its answer's
        ``graceMs``): it grants the queues it keeps for their claimants to nobody else before then."""
        self.stale_queues_dropped = 0
        """Orderly: process queues dropped because their lock had lapsed before it was renewed."""
        self.on_stale_queue: Callable[[], None] | None = None
        """Called when such a queue was dropped (the consumer asks for a rebalance to re-create it)."""
        self.lease_profile = getattr(config, "lock_profile", "lease") == "lease"
        """Locks are leases renewed by the client instance's renewal task (module documentation)."""
        self.lock_epochs: dict[MessageQueue, int] = {}
        """The fencing epoch of the broker lock of each held queue (from trimq brokers)."""
        self.lease_ms_by_broker: dict[str, int] = {}
        """The lease each broker grants (its answers' ``leaseMs``), by broker name."""
        self.on_relocked: Callable[[MessageQueue, ProcessQueue], None] | None = None
        """Called when a queue whose lock had lapsed or whose connection dropped is locked again (and kept): the
        consumer restarts its pull loop and consume task at once instead of after their retry delays."""
        self._connection_lost: set[MessageQueue] = set()
        self.nursery: trio.Nursery | None = None
        self._consume_locks: weakref.WeakKeyDictionary[ProcessQueue, ConsumeLock] = weakref.WeakKeyDictionary()
        self._rate = RateLimiter(10_000)

    # --- helpers -----------------------------------------------------------------------------------

    def bind(self, nursery: trio.Nursery) -> None:
        """The nursery delayed unlocks run in (the consumer's)."""
        self.nursery = nursery

    def consume_lock(self, pq: ProcessQueue) -> ConsumeLock:
        """The consume lock of a process queue: held while its messages are consumed (orderly; shared by the batches
        of key scope) and by a rebalance that removes it. RocketMQ keeps it inside ProcessQueue; ours is pure, so it
        lives here."""
        lock = self._consume_locks.get(pq)
        if lock is None:
            lock = self._consume_locks[pq] = ConsumeLock()
        return lock

    def new_process_queue(self) -> ProcessQueue:
        return ProcessQueue(
            self.clock(),
            lock_max_live_time_ms=self.config.rebalance_lock_max_live_time,
            pull_max_idle_time_ms=self.config.pull_max_idle_time,
        )

    @property
    def clustering(self) -> bool:
        return self.message_model == CLUSTERING

    def working_message_queues(self, topic: str) -> set[MessageQueue]:
        """Queues of ``topic`` this client holds and has not dropped."""
        return {mq for mq, pq in self.process_queue_table.items() if mq.topic == topic and not pq.dropped}

    def _drop(self, pq: ProcessQueue) -> None:
        pq.dropped = True
        if self.pull_service is not None:
            self.pull_service.cancel(pq)

    def lease_ms(self, broker_name: str) -> int:
        """How long this client relies on a lock of ``broker_name`` after sending the request that renewed it:
        the broker's lease, never more than ``rebalance_lock_max_live_time``."""
        cap = self.config.rebalance_lock_max_live_time
        granted = self.lease_ms_by_broker.get(broker_name)
        return cap if granted is None else min(cap, granted)

    def lock_epoch(self, mq: MessageQueue) -> int | None:
        """The fencing epoch of the lock this client holds on ``mq`` (None: none known)."""
        return self.lock_epochs.get(mq)

    def _set_epoch(self, mq: MessageQueue, epoch: int | None) -> None:
        if epoch is None:
            self.lock_epochs.pop(mq, None)
        else:
            self.lock_epochs[mq] = epoch
        setter = getattr(self.offset_store, "set_lock_epoch", None)
        if setter is not None:
            setter(mq, epoch)

    # --- the rebalance ------------------------------------------------------------------------------

    async def do_rebalance(self, is_order: bool | None = None) -> None:
        """Rebalance every subscribed topic, drop queues of unsubscribed topics, heartbeat if changed."""
        order = self.consume_orderly if is_order is None else is_order
        self.lock_failed = False
        self.lock_grace_ms = None
        for topic in list(self.subscription_inner):
            try:
                await self.rebalance_by_topic(topic, order)
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                if not is_retry_topic(topic):
                    log.warning("rebalance.topic_failed", group=self.consumer_group, topic=topic, error=str(exc))
        self.truncate_message_queue_not_my_topic()
        if self.heartbeat_needed:
            self.heartbeat_needed = False
            await self.client.send_heartbeat_to_all_brokers()

    def _route_error(self, topic: str) -> str | None:
        """Why no name server answered for ``topic``'s route, if that is why it has no queues (not "unknown")."""
        errors: dict[str, str] = getattr(self.client, "route_fetch_errors", {})
        return errors.get(topic)

    async def rebalance_by_topic(self, topic: str, is_order: bool) -> bool:
        """Rebalance one topic; returns whether the held queues now equal the allocation ("balanced")."""
        mq_set = self.topic_subscribe_info_table.get(topic)
        if not self.clustering:
            if mq_set is None:
                self.message_queue_changed(topic, set(), set())
                log_rate_limited(self._rate, ("no_topic", topic), self.clock(), log.warning,
                                 "rebalance.topic_not_exist", group=self.consumer_group, topic=topic,
                                 route_error=self._route_error(topic))
                return False
            if await self.update_process_queue_table_in_rebalance(topic, set(mq_set), is_order):
                self.message_queue_changed(topic, mq_set, mq_set)
                log.info("rebalance.changed", group=self.consumer_group, topic=topic, model=BROADCASTING,
                         queues=len(mq_set))
            return set(mq_set) == self.working_message_queues(topic)

        if mq_set is None:
            # RocketMQ asks for the client ids first; without queues they cannot be used, so skip the call.
            if not is_retry_topic(topic):
                self.message_queue_changed(topic, set(), set())
                log_rate_limited(self._rate, ("no_topic", topic), self.clock(), log.warning,
                                 "rebalance.topic_not_exist", group=self.consumer_group, topic=topic,
                                 route_error=self._route_error(topic))
            return False
        cid_all = await self.client.find_consumer_id_list(topic, self.consumer_group)
        if cid_all is None:
            log_rate_limited(self._rate, ("no_cids", topic), self.clock(), log.warning,
                             "rebalance.no_consumer_ids", group=self.consumer_group, topic=topic)
            return False
        mq_all = sorted(mq_set)
        cids = sorted(cid_all, key=java_string_key)
        client_id = self.client.client_id
        try:
            allocated = self.strategy.allocate(self.consumer_group, client_id, mq_all, cids)
        except Exception as exc:
            log.error("rebalance.allocate_failed", group=self.consumer_group, topic=topic,
                      strategy=getattr(self.strategy, "name", repr(self.strategy)),
                      error=f"{type(exc).__name__}: {exc}")
            return False
        result = set(allocated or ())
        if await self.update_process_queue_table_in_rebalance(topic, result, is_order):
            log.info(
                "rebalance.changed", group=self.consumer_group, topic=topic, client_id=client_id,
                strategy=self.strategy.name, mq_all=len(mq_set), cid_all=len(cids), result=len(result),
                queues=sorted(f"{m.broker_name}:{m.queue_id}" for m in result),
            )
            self.message_queue_changed(topic, mq_set, result)
        return result == self.working_message_queues(topic)

    async def update_process_queue_table_in_rebalance(
        self, topic: str, mq_set: set[MessageQueue], is_order: bool
    ) -> bool:
        """Make ``process_queue_table``'s queues of ``topic`` equal ``mq_set``; True if anything changed."""
        changed = False
        now = self.clock()
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic != topic:
                continue
            if mq not in mq_set:
                self._drop(pq)
                if await self.remove_unnecessary_message_queue(mq, pq):
                    self._forget(mq, pq)
                    changed = True
                    log.info("rebalance.queue_removed", group=self.consumer_group, mq=str(mq))
            elif pq.is_pull_expired(now):
                self._drop(pq)
                if await self.remove_unnecessary_message_queue(mq, pq):
                    self._forget(mq, pq)
                    changed = True
                    log.error("rebalance.queue_pull_expired", group=self.consumer_group, mq=str(mq),
                              idle_ms=now - pq.last_pull_timestamp)

        new_mqs = sorted(mq for mq in mq_set if mq not in self.process_queue_table)
        locked: set[MessageQueue] = set()
        lock_sent_at = self.clock()
        if is_order and new_mqs:
            locked = await self._lock_batch(new_mqs)
        requests: list[PullRequest] = []
        for mq in new_mqs:
            if is_order and mq not in locked:
                self.lock_failed = True
                log.info("rebalance.lock_failed", group=self.consumer_group, mq=str(mq))
                continue
            self.remove_dirty_offset(mq)
            if is_order:
                self._set_epoch(mq, self.lock_epochs.get(mq))  # commits of the new queue carry its grant's epoch
            pq = self.new_process_queue()
            try:
                next_offset = await self.compute_pull_from_where(mq)
            except OffsetUnavailableError as exc:
                log.warning("rebalance.offset_unavailable", group=self.consumer_group, mq=str(mq), error=str(exc))
                if is_order:
                    await self.unlock(mq, oneway=True)
                continue
            if mq in self.process_queue_table:
                log.info("rebalance.queue_exists", group=self.consumer_group, mq=str(mq))
                continue
            if is_order:
                # RocketMQ #2621: the broker lock is ours now; say so at once instead of after lockAll.
                pq.locked = True
                pq.last_lock_timestamp = lock_sent_at  # when the broker could last have renewed it
                pq.lock_max_live_time_ms = self.lease_ms(mq.broker_name)
            self.process_queue_table[mq] = pq
            requests.append(PullRequest(self.consumer_group, mq, pq, next_offset))
            changed = True
            log.info("rebalance.queue_added", group=self.consumer_group, mq=str(mq), next_offset=next_offset,
                     locked=pq.locked)
        self.dispatch_pull_request(requests)
        return changed

    def _forget(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        if self.process_queue_table.get(mq) is pq:
            del self.process_queue_table[mq]
            self.lock_epochs.pop(mq, None)
            self._connection_lost.discard(mq)

    def dispatch_pull_request(self, requests: Iterable[PullRequest]) -> None:
        """Start pulling the new queues."""
        if self.pull_service is None:
            return
        for pr in requests:
            self.pull_service.start(pr)

    def remove_dirty_offset(self, mq: MessageQueue) -> None:
        self.offset_store.remove_offset(mq)

    async def remove_unnecessary_message_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Persist and forget the queue's offset; orderly CLUSTERING also releases the broker lock, but only
        after taking the consume lock (so nothing of it is being consumed). False leaves the queue for the
        next rebalance to retry."""
        if not (self.consume_orderly and self.clustering):
            await self.offset_store.persist(mq)
            self.offset_store.remove_offset(mq)
            return True
        lock = self.consume_lock(pq)
        acquired = False
        with trio.move_on_after(self.config.consume_lock_wait_millis / 1000):
            await lock.acquire()
            acquired = True
        # Only an offset consumed under a lock still held is worth keeping: once the lock lapsed (a pause),
        # another client may have moved the queue on, and this one's offset would rewind it.
        trusted = pq.locked and not pq.is_lock_expired(self.clock())
        if not acquired:
            pq.inc_try_unlock_times()
            log.warning("rebalance.queue_busy", group=self.consumer_group, mq=str(mq),
                        try_unlock_times=pq.try_unlock_times)
            if trusted:
                await self.offset_store.persist(mq)
            self.offset_store.remove_offset(mq)
            return False
        try:
            if trusted:
                await self.offset_store.persist(mq)
            else:
                log.info("rebalance.offset_not_persisted", group=self.consumer_group, mq=str(mq),
                         reason="lock lapsed")
            self.offset_store.remove_offset(mq)
            await self.unlock_delay(mq, pq)
        finally:
            lock.release()
        return True

    async def unlock_delay(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """Unlock on the broker now, or after ``unlock_delay_time_mills`` if the queue still caches messages."""
        if pq.has_temp_message() and self.config.unlock_delay_time_mills > 0 and self.nursery is not None:
            log.info("rebalance.unlock_delayed", group=self.consumer_group, mq=str(mq),
                     delay_ms=self.config.unlock_delay_time_mills)
            self.nursery.start_soon(self._delayed_unlock, mq)
        else:
            await self.unlock(mq, oneway=True)

    async def _delayed_unlock(self, mq: MessageQueue) -> None:
        await trio.sleep(self.config.unlock_delay_time_mills / 1000)
        if mq in self.process_queue_table:
            log.info("rebalance.delayed_unlock_skipped", group=self.consumer_group, mq=str(mq))
            return
        await self.unlock(mq, oneway=True)

    def truncate_message_queue_not_my_topic(self) -> None:
        """Drop the queues of topics that are no longer subscribed."""
        for mq, pq in list(self.process_queue_table.items()):
            if mq.topic not in self.subscription_inner:
                self._drop(pq)
                self._forget(mq, pq)
                log.info("rebalance.queue_truncated", group=self.consumer_group, mq=str(mq))

    def remove_process_queue(self, mq: MessageQueue, pq: ProcessQueue | None = None) -> ProcessQueue | None:
        """Forget ``mq``'s process queue (e.g. after OFFSET_ILLEGAL), marking it dropped; the next rebalance
        re-creates it. With ``pq``, only if that is still the table's process queue."""
        current = self.process_queue_table.get(mq)
        if current is None or (pq is not None and current is not pq):
            return None
        self._drop(current)
        del self.process_queue_table[mq]
        self.lock_epochs.pop(mq, None)
        self._connection_lost.discard(mq)
        return current

    def message_queue_changed(
        self, topic: str, mq_all: Iterable[MessageQueue], mq_divided: Iterable[MessageQueue]
    ) -> None:
        """RebalancePushImpl.messageQueueChanged: new subscription version, per-queue thresholds from the
        per-topic ones (``max(1, topic_value // queues held)``, untouched when -1), heartbeat requested."""
        sub = self.subscription_inner.get(topic)
        if sub is not None:
            sub.sub_version = max(_wall_ms(), sub.sub_version + 1)
        count = len(self.process_queue_table)
        if count:
            cfg = self.config
            if cfg.pull_threshold_for_topic != -1:
                new = max(1, cfg.pull_threshold_for_topic // count)
                log.info("rebalance.pull_threshold_changed", group=self.consumer_group,
                         old=cfg.pull_threshold_for_queue, new=new)
                cfg.pull_threshold_for_queue = new
            if cfg.pull_threshold_size_for_topic != -1:
                new = max(1, cfg.pull_threshold_size_for_topic // count)
                log.info("rebalance.pull_threshold_size_changed", group=self.consumer_group,
                         old=cfg.pull_threshold_size_for_queue, new=new)
                cfg.pull_threshold_size_for_queue = new
        self.heartbeat_needed = True

    # --- start offsets --------------------------------------------------------------------------------

    async def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """Where to start pulling a newly assigned queue (RebalancePushImpl.computePullFromWhereWithException).

        The stored offset when there is one. Otherwise by ``consume_from_where``: LAST (and the deprecated
        values) -> the queue's max offset, 0 for retry topics; FIRST -> 0; TIMESTAMP -> the first offset
        at ``consume_timestamp``, the max offset for retry topics. Raises OffsetUnavailableError when the
        stored offset cannot be read or the broker cannot answer (the queue is retried next rebalance).
        """
        last = await self.offset_store.read_offset(mq, READ_FROM_STORE)
        if last >= 0:
            return last
        if last != -1:
            raise OffsetUnavailableError(f"the stored offset of {mq} could not be read")
        cfw = self.config.consume_from_where
        try:
            if cfw == "CONSUME_FROM_FIRST_OFFSET":
                return 0
            if cfw == "CONSUME_FROM_TIMESTAMP":
                if is_retry_topic(mq.topic):
                    return await self.client.max_offset(mq)
                return await self.client.search_offset(mq, self.config.consume_timestamp_ms)
            # CONSUME_FROM_LAST_OFFSET and the deprecated values that behave like it.
            if is_retry_topic(mq.topic):
                return 0
            return await self.client.max_offset(mq)
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            raise OffsetUnavailableError(f"cannot compute the start offset of {mq} ({cfw}): {exc}") from exc

    # --- broker locks -----------------------------------------------------------------------------------

    def _by_broker(self, mqs: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
        out: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            out.setdefault(mq.broker_name, []).append(mq)
        return out

    def _claims(self, mqs: Iterable[MessageQueue], now: int) -> dict[MessageQueue, int]:
        """The queues among ``mqs`` this client stopped because their connection dropped and whose lease its own
        clock says has not run out, with the epoch it holds them under: a broker that restarted meanwhile grants
        them back to it (and to nobody else) during its restart grace."""
        out = {}
        for mq in mqs:
            pq = self.process_queue_table.get(mq)
            epoch = self.lock_epochs.get(mq)
            if mq in self._connection_lost and pq is not None and epoch is not None and not pq.is_lock_expired(now):
                out[mq] = epoch
        return out

    async def _lock_request(self, addr: str, mqs: list[MessageQueue], sent_at: int) -> LockBatchAnswer:
        """One LOCK_BATCH_MQ to ``addr`` (lease fields when the API has them); raises on transport errors."""
        api = self.client.api
        if hasattr(api, "lock_batch_mq_lease"):
            return await api.lock_batch_mq_lease(addr, self.consumer_group, self.client.client_id, mqs,
                                                 claims=self._claims(mqs, sent_at) or None,
                                                 timeout_ms=LOCK_BATCH_TIMEOUT_MS)
        detailed = getattr(api, "lock_batch_mq_detailed", None)
        if detailed is not None:
            held, kept = await detailed(addr, self.consumer_group, self.client.client_id, mqs,
                                        timeout_ms=LOCK_BATCH_TIMEOUT_MS)
            return LockBatchAnswer(held, kept)
        held = await api.lock_batch_mq(addr, self.consumer_group, self.client.client_id, mqs,
                                       timeout_ms=LOCK_BATCH_TIMEOUT_MS)
        return LockBatchAnswer(held)

    async def _lock_on_broker(self, broker_name: str, mqs: list[MessageQueue],
                              sent_at: int | None = None) -> LockBatchAnswer | None:
        """LOCK_BATCH_MQ on one broker; None when the broker could not be asked. Remembers the lease the broker
        grants and the epoch of every queue it granted."""
        addr = await self.client.find_broker_addr(broker_name, mqs[0].topic)
        if addr is None:
            log.warning("rebalance.lock_no_broker", group=self.consumer_group, broker=broker_name)
            return None
        try:
            answer = await self._lock_request(addr, mqs, self.clock() if sent_at is None else sent_at)
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            log.warning("rebalance.lock_error", group=self.consumer_group, broker=broker_name, error=str(exc))
            return None
        self._note_answer(broker_name, answer)
        return answer

    def _note_answer(self, broker_name: str, answer: LockBatchAnswer) -> None:
        if answer.lease_ms is not None:
            self.lease_ms_by_broker[broker_name] = answer.lease_ms
        if answer.grace_ms:
            self.lock_grace_ms = max(self.lock_grace_ms or 0, answer.grace_ms)

    async def _lock_batch(self, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """Lock ``mqs`` (one request per broker); returns those now held. Marks held ones' process queues;
        a held queue whose process queue had lost its lock is dropped instead (:meth:`_lock_confirmed`)."""
        held: set[MessageQueue] = set()
        answers: dict[MessageQueue, LockBatchAnswer] = {}
        sent_at = self.clock()
        for broker_name, group in self._by_broker(mqs).items():
            got = await self._lock_on_broker(broker_name, group, sent_at)
            if got is not None:
                mine = got.held & set(group)
                held |= mine
                for mq in mine:
                    answers[mq] = got
                    if mq not in self.process_queue_table:
                        self.lock_epochs.pop(mq, None)  # a new queue: its epoch is this grant's
                        if mq in got.epochs:
                            self.lock_epochs[mq] = got.epochs[mq]
        for mq in list(held):
            pq = self.process_queue_table.get(mq)
            if pq is not None and not await self._lock_confirmed(mq, pq, sent_at, answers[mq]):
                held.discard(mq)
        return held

    async def _lock_confirmed(self, mq: MessageQueue, pq: ProcessQueue, sent_at: int,
                              answer: LockBatchAnswer) -> bool:
        """The broker says this client holds ``mq``'s lock, as of a request sent at ``sent_at``.

        If nobody else held the lock since this client's previous lock — the broker says so in ``kept``; a
        broker that does not (``kept`` None) leaves the client's own view: ``pq`` locked and not expired when
        the request left — the lock is renewed from ``sent_at``, the send time rather than the answer's, so a
        client paused in between never believes its lock younger than the broker's, for the broker's lease
        (:meth:`lease_ms`), and under the grant's epoch. Otherwise another client may have consumed the queue
        meanwhile (this one was paused past its lock, or the broker restarted), so ``pq``'s cached messages and
        the in-memory offset may be stale: consuming on from them would re-consume what the other client did
        and commit an offset behind its commits, i.e. rewind the queue (found by the chaos suite). Such a
        process queue is dropped, its in-memory offset forgotten, and a rebalance asked for, which re-creates it
        from the committed offset. Returns whether ``pq`` may go on.
        """
        kept = answer.kept
        if (mq in kept) if kept is not None else (pq.locked and not pq.is_lock_expired(sent_at)):
            was_usable = pq.locked and not pq.is_lock_expired(self.clock())
            pq.locked = True
            pq.last_lock_timestamp = sent_at
            pq.lock_max_live_time_ms = self.lease_ms(mq.broker_name)
            self._connection_lost.discard(mq)
            epoch = answer.epochs.get(mq)
            if epoch is not None and epoch != self.lock_epochs.get(mq):
                self._set_epoch(mq, epoch)  # a continuous hold under a new grant (e.g. claimed after a restart)
            if not was_usable and self.on_relocked is not None:
                self.on_relocked(mq, pq)
            return True
        pq.locked = False
        lock = self.consume_lock(pq)
        with trio.move_on_after(self.config.consume_lock_wait_millis / 1000):
            async with lock:  # nothing of the queue is being consumed: no late commit of the stale batch
                if self.remove_process_queue(mq, pq) is not None:
                    self.offset_store.remove_offset(mq)
                    self.stale_queues_dropped += 1
                    log.warning("rebalance.stale_queue_dropped", group=self.consumer_group, mq=str(mq),
                                reason="lock lapsed before it was renewed")
                    if self.on_stale_queue is not None:
                        self.on_stale_queue()
        return False

    async def lock(self, mq: MessageQueue) -> bool:
        """Lock one queue on its broker (RebalanceImpl.lock); marks its process queue locked on success."""
        return mq in await self._lock_batch([mq])

    async def _apply_renewal(self, mqs: list[MessageQueue], sent_at: int, answer: LockBatchAnswer) -> None:
        for mq in mqs:
            pq = self.process_queue_table.get(mq)
            if pq is None:
                continue
            if mq in answer.held:
                was_locked = pq.locked
                if await self._lock_confirmed(mq, pq, sent_at, answer) and not was_locked:
                    log.info("rebalance.lock_ok", group=self.consumer_group, mq=str(mq))
            else:
                if pq.locked:
                    log.warning("rebalance.lock_lost", group=self.consumer_group, mq=str(mq))
                pq.locked = False

    async def lock_all(self) -> None:
        """Renew the broker locks of every held queue; mark each process queue locked or not accordingly
        (the ``rocketmq`` lock profile's lockAll; leases are renewed by :meth:`renew_leases`)."""
        for broker_name, mqs in self._by_broker(list(self.process_queue_table)).items():
            sent_at = self.clock()
            got = await self._lock_on_broker(broker_name, mqs, sent_at)
            if got is not None:
                await self._apply_renewal(mqs, sent_at, got)

    async def renew_leases(self, addr: str, broker_names: Iterable[str]) -> LockBatchAnswer | None:
        """Renew, in one LOCK_BATCH_MQ to ``addr``, the leases of every queue held on the brokers ``broker_names``
        (those whose master ``addr`` is; none for a slave's address): the request also keeps this client a member
        of the group on that broker, so it is sent even when nothing is held there. Returns the answer (None
        when the broker could not be asked; the queues' leases then run out on their own)."""
        names = set(broker_names)
        mqs = sorted(mq for mq, pq in self.process_queue_table.items() if mq.broker_name in names and not pq.dropped)
        sent_at = self.clock()
        try:
            answer = await self._lock_request(addr, mqs, sent_at)
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            log_rate_limited(self._rate, ("renew", addr), self.clock(), log.warning, "rebalance.lease_renew_failed",
                             group=self.consumer_group, addr=addr, queues=len(mqs), error=str(exc))
            return None
        for name in names:
            self._note_answer(name, answer)
        await self._apply_renewal(mqs, sent_at, answer)
        return answer

    def broker_connection_lost(self, broker_names: Iterable[str]) -> list[MessageQueue]:
        """The connection to the master of ``broker_names`` dropped: stop every queue held there at once (no new
        batch starts; the consume services re-check before each one) until it is locked again. Lease profile
        only (RocketMQ keeps consuming). Returns the queues stopped."""
        if not self.lease_profile:
            return []
        names = set(broker_names)
        stopped = []
        for mq, pq in self.process_queue_table.items():
            if mq.broker_name in names and not pq.dropped and pq.locked:
                pq.locked = False
                self._connection_lost.add(mq)
                stopped.append(mq)
        if stopped:
            log.warning("rebalance.connection_lost", group=self.consumer_group, brokers=sorted(names),
                        queues=sorted(str(mq) for mq in stopped))
        return stopped

    async def unlock(self, mq: MessageQueue, oneway: bool = False) -> None:
        """UNLOCK_BATCH_MQ for one queue (errors are logged)."""
        await self._unlock_on_broker(mq.broker_name, [mq], oneway)

    async def unlock_all(self, oneway: bool = False) -> None:
        """Release every held queue's broker lock; process queues become unlocked."""
        for broker_name, mqs in self._by_broker(list(self.process_queue_table)).items():
            await self._unlock_on_broker(broker_name, mqs, oneway)
            for mq in mqs:
                pq = self.process_queue_table.get(mq)
                if pq is not None:
                    pq.locked = False

    async def _unlock_on_broker(self, broker_name: str, mqs: list[MessageQueue], oneway: bool) -> None:
        addr = await self.client.find_broker_addr(broker_name, mqs[0].topic)
        if addr is None:
            return
        try:
            await self.client.api.unlock_batch_mq(
                addr, self.consumer_group, self.client.client_id, mqs, oneway=oneway, timeout_ms=LOCK_BATCH_TIMEOUT_MS
            )
            log.info("rebalance.unlocked", group=self.consumer_group, queues=[str(m) for m in mqs])
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            log.warning("rebalance.unlock_error", group=self.consumer_group, broker=broker_name, error=str(exc))

    def info(self) -> dict[str, Any]:
        """A snapshot for diagnostics."""
        now = self.clock()
        return {
            "group": self.consumer_group,
            "model": self.message_model,
            "strategy": self.strategy.name,
            "subscriptions": {t: s.sub_string for t, s in self.subscription_inner.items()},
            "queues": {str(mq): pq.info(now) for mq, pq in self.process_queue_table.items()},
        }
