"""ConsumerCore: a push consumer without its consume service — subscriptions, rebalance, pull loops,
offset store, and (orderly, clustering) the renewal of broker locks: leases renewed by the client instance's
renewal task (:meth:`ConsumerCore.renew_leases`, ``lock_profile="lease"``), or RocketMQ's periodic lockAll
(``lock_profile="rocketmq"``).

The push consumer builds on it with a consume service (orderly or concurrent) that receives pulled
messages through ``submit`` (see :class:`client.pull.ConsumeService`)::

    async with ClientInstance(config) as client:
        core = ConsumerCore(config, consume_service, instance=client, consume_orderly=True)
        core.subscribe("Orders", "created || paid")
        async with core:
            ...

Starting registers the consumer with the client instance (routes, heartbeat, immediate rebalance).
An orderly consumer that cannot lock a newly assigned queue (its previous owner has not released it yet)
asks for another rebalance after 0.1 s, backing off to 5 s, so a join is taken over in well under a
second rather than at the next periodic rebalance.
Leaving the block is a graceful leave: pull loops stop, offsets are persisted, an orderly consumer
releases its broker locks at once, and the group membership is unregistered on every broker so the
other members rebalance immediately. The leave runs shielded from cancellation, bounded by
``shutdown_timeout_s``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import trio

from trimq.client.config import PushConsumerConfig
from trimq.client.errors import ClientClosedError, MQClientError
from trimq.client.instance import ClientInstance
from trimq.client.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    RemoteBrokerOffsetStore,
    default_local_offset_dir,
)
from trimq.client.pull import ConsumeService, PullService
from trimq.client.rebalance.impl import RebalanceImpl
from trimq.client.rebalance.strategies import AllocateStrategy, get_strategy
from trimq.client.subscription import SubscriptionData, build_subscription_data
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import check_topic, retry_topic
from trimq.runtime.logs import get_logger

__all__ = ["ConsumerCore"]

log = get_logger("trimq.consumer")

LOCK_ALL_FIRST_DELAY_S = 1.0
LOCK_RETRY_FIRST_S = 0.1
LOCK_RETRY_MAX_S = 5.0
LOCK_RETRY_AFTER_GRACE_S = 0.01  # a broker's restart grace has ended by then


class ConsumerCore:
    """One consumer group member's machinery (see the module documentation)."""

    consume_type = "CONSUME_PASSIVELY"

    def __init__(
        self,
        config: PushConsumerConfig,
        consume_service: ConsumeService,
        *,
        instance: ClientInstance,
        consume_orderly: bool = False,
        strategy: AllocateStrategy | None = None,
        offset_store: OffsetStore | None = None,
        subscribe_retry_topic: bool = True,
        renew_locks: bool = True,
        clock: Callable[[], int] | None = None,
        shutdown_timeout_s: float = 5.0,
    ) -> None:
        # A private copy: the rebalance adjusts per-queue thresholds (pull_threshold_for_topic) in it.
        self.config = dataclasses.replace(config.validate())
        self.instance = instance
        self.consume_service = consume_service
        self._consume_orderly = consume_orderly
        self.subscribe_retry_topic = subscribe_retry_topic
        self.renew_locks = renew_locks
        self.shutdown_timeout_s = shutdown_timeout_s
        self._given_offset_store = offset_store
        self.offset_store: OffsetStore = offset_store or self._default_offset_store()
        self.rebalance = RebalanceImpl(
            consumer_group=self.config.consumer_group,
            config=self.config,
            strategy=strategy or get_strategy(self.config.allocate_message_queue_strategy),
            client=instance,
            offset_store=self.offset_store,
            consume_orderly=consume_orderly,
            clock=clock,
        )
        self.pull_service = PullService(
            consumer_group=self.config.consumer_group,
            config=self.config,
            client=instance,
            rebalance=self.rebalance,
            offset_store=self.offset_store,
            consume_service=consume_service,
            consume_orderly=consume_orderly,
            clock=clock,
            on_queue_removed=instance.rebalance_immediately,
        )
        self.rebalance.pull_service = self.pull_service
        self.rebalance.on_stale_queue = instance.rebalance_immediately  # re-create it from the committed offset
        self.rebalance.on_relocked = self._relocked
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None
        self._running = False
        self._lock_retry_due: float | None = None  # trio time of the lock retry under way
        self._lock_retry_delay = LOCK_RETRY_FIRST_S

    def _default_offset_store(self) -> OffsetStore:
        if self.config.clustering:
            return RemoteBrokerOffsetStore(
                self.config.consumer_group, self.instance, timeout_ms=self.instance.config.mq_client_api_timeout
            )
        store_id = f"{self.instance.client_ip}@{self.instance.config.instance_name or 'DEFAULT'}"
        directory = default_local_offset_dir(store_id, self.config.consumer_group, self.config.local_offset_store_dir)
        return LocalFileOffsetStore(self.config.consumer_group, directory)

    # --- what the client instance needs (ConsumerInner) ------------------------------------------------

    @property
    def group_name(self) -> str:
        return self.config.consumer_group

    @property
    def message_model(self) -> str:
        return self.config.message_model

    @property
    def consume_from_where(self) -> str:
        return self.config.consume_from_where

    @property
    def consume_orderly(self) -> bool:
        return self._consume_orderly

    def subscriptions(self) -> list[SubscriptionData]:
        return list(self.rebalance.subscription_inner.values())

    def update_topic_subscribe_info(self, topic: str, mqs: set[MessageQueue]) -> None:
        if topic in self.rebalance.subscription_inner:
            self.rebalance.topic_subscribe_info_table[topic] = set(mqs)

    def is_subscribe_topic_need_update(self, topic: str) -> bool:
        return topic in self.rebalance.subscription_inner and topic not in self.rebalance.topic_subscribe_info_table

    async def do_rebalance(self) -> None:
        if not self._running:
            return
        await self.rebalance.do_rebalance(self._consume_orderly)
        if self.rebalance.lock_failed:
            self._schedule_lock_retry(self.rebalance.lock_grace_ms)
        else:
            self._lock_retry_delay = LOCK_RETRY_FIRST_S

    def _schedule_lock_retry(self, grace_ms: int | None = None) -> None:
        """An assigned queue is still locked by its previous owner, which releases it when its own
        (notified) rebalance runs: try again soon, backing off to LOCK_RETRY_MAX_S, rather than waiting
        for the periodic rebalance (RocketMQ waits up to 20 s). A broker in its restart grace says when the grace
        ends (``grace_ms``): try again right then, not a backed-off while later (chaos seed 56: the queues of a
        consumer paused across a failover waited 2.4 s past the grace, and it resumed and took them back)."""
        if self._nursery is None:
            return
        backoff = not grace_ms
        delay = self._lock_retry_delay if backoff else (grace_ms or 0) / 1000 + LOCK_RETRY_AFTER_GRACE_S
        due = trio.current_time() + delay
        if self._lock_retry_due is not None and self._lock_retry_due <= due:
            return  # an earlier retry is coming
        self._lock_retry_due = due
        if backoff:
            self._lock_retry_delay = min(delay * 2, LOCK_RETRY_MAX_S, self.instance.config.rebalance_interval / 1000)
        else:
            self._lock_retry_delay = LOCK_RETRY_FIRST_S

        async def retry() -> None:
            await trio.sleep_until(due)
            if self._lock_retry_due != due:
                return  # an earlier retry took its place
            self._lock_retry_due = None
            self.instance.rebalance_immediately()

        self._nursery.start_soon(retry)

    # --- leases (ClientInstance's renewal task) --------------------------------------------------------

    @property
    def lease_renewal(self) -> bool:
        """Whether the client instance renews this consumer's queue locks as leases (orderly, clustering, the
        ``lease`` lock profile)."""
        return (self._running and self._consume_orderly and self.config.clustering and self.renew_locks
                and self.rebalance.lease_profile)

    async def renew_leases(self, addr: str, broker_names: list[str]) -> Any:
        """Renew the leases held on the brokers whose master is ``addr`` (and this consumer's membership there);
        returns the broker's answer (client.api.LockBatchAnswer) or None."""
        return await self.rebalance.renew_leases(addr, broker_names)

    def broker_connection_lost(self, broker_names: list[str]) -> None:
        """The connection to these brokers' master dropped: their queues stop until they are locked again."""
        if self._consume_orderly and self.config.clustering:
            self.rebalance.broker_connection_lost(broker_names)

    def _relocked(self, mq: MessageQueue, pq: Any) -> None:
        # A queue that had stopped (lapsed lease, dropped connection) is locked again: pull and consume now rather
        # than after their retry delays (3 s for a pull of an unlocked queue).
        self.pull_service.wake(pq)
        if pq.has_temp_message():
            self.consume_service.submit(pq, [], True, message_queue=mq)

    async def persist_consumer_offset(self) -> None:
        """Send the in-memory offsets to the brokers. An orderly consumer sends only those of queues whose lock
        it still holds: after its lock lapsed (a pause), another client may own the queue's progress, and the
        offset it remembers would rewind it; the store forgets those (they are re-read if the lock is back)."""
        table = self.rebalance.process_queue_table
        if self._consume_orderly and self.config.clustering:
            now = self.rebalance.clock()
            mqs = {mq for mq, pq in table.items() if pq.locked and not pq.is_lock_expired(now)}
        else:
            mqs = set(table)
        await self.offset_store.persist_all(mqs)

    # --- subscriptions ------------------------------------------------------------------------------

    def subscribe(self, topic: str, sub_expression: str | None = "*") -> None:
        """Subscribe to ``topic`` with a tag expression (``*`` or ``"TagA || TagB"``)."""
        check_topic(topic)
        self.rebalance.subscription_inner[topic] = build_subscription_data(topic, sub_expression)
        if self._running and self._nursery is not None:
            self._nursery.start_soon(self._subscription_changed, topic)

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (its queues are dropped at the next rebalance)."""
        self.rebalance.subscription_inner.pop(topic, None)
        self.rebalance.topic_subscribe_info_table.pop(topic, None)
        self.rebalance.heartbeat_needed = True  # tell the brokers after the next rebalance
        if self._running:
            self.instance.rebalance_immediately()

    async def _subscription_changed(self, topic: str) -> None:
        await self.instance.update_topic_route_info_from_name_server(topic)
        await self.instance.send_heartbeat_to_all_brokers()
        self.instance.rebalance_immediately()

    # --- lifecycle ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._running:
            raise MQClientError("this consumer is already running")
        if not self.instance.running:
            raise ClientClosedError("the client instance is not running; enter it first")
        if not self.rebalance.subscription_inner:
            raise MQClientError(f"consumer group {self.group_name!r} has no subscription; call subscribe() first")
        if self.config.clustering and self.subscribe_retry_topic:
            rt = retry_topic(self.group_name)
            self.rebalance.subscription_inner.setdefault(rt, build_subscription_data(rt, "*"))
        await self.offset_store.load()
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self.rebalance.bind(self._nursery)
        self.pull_service.bind(self._nursery)
        self._running = True
        try:
            lock_all = self._consume_orderly and self.config.clustering and self.renew_locks
            if lock_all and not self.rebalance.lease_profile:  # leases: the instance's renewal task renews them
                self._nursery.start_soon(self._lock_all_loop)
            await self.instance.register_consumer(self)
        except BaseException as exc:
            self._running = False
            self._nursery.cancel_scope.cancel()
            await self._nursery_cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        log.info("consumer.started", group=self.group_name, client_id=self.instance.client_id,
                 model=self.message_model, orderly=self._consume_orderly,
                 topics=sorted(self.rebalance.subscription_inner))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(self.shutdown_timeout_s):
                await self.leave()
        finally:
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            result: bool | None = await self._nursery_cm.__aexit__(exc_type, exc, tb)
            self._nursery = None
        return result

    def stop_pulling(self) -> None:
        """Stop every pull loop (the first step of a shutdown; the consume service may still drain)."""
        self.pull_service.paused = True
        self.pull_service.cancel_all()

    async def leave(self) -> None:
        """Graceful leave: stop pulling, persist offsets, release broker locks, unregister from the group."""
        if not self._running:
            return
        self._running = False
        self.stop_pulling()
        await self.persist_consumer_offset()
        for pq in self.rebalance.process_queue_table.values():
            pq.dropped = True
        if self._consume_orderly and self.config.clustering:
            await self.rebalance.unlock_all(oneway=False)
        await self.instance.unregister_consumer(self.group_name)
        log.info("consumer.stopped", group=self.group_name, client_id=self.instance.client_id)

    async def _lock_all_loop(self) -> None:
        await trio.sleep(LOCK_ALL_FIRST_DELAY_S)
        while True:
            await self.rebalance.lock_all()
            await trio.sleep(self.config.rebalance_lock_interval / 1000)

    @property
    def running(self) -> bool:
        return self._running

    def info(self) -> dict[str, Any]:
        return {"client_id": self.instance.client_id, **self.rebalance.info(), "pull": self.pull_service.info()}
