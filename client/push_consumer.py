"""PushConsumer: the public push consumer (RocketMQ's DefaultMQPushConsumer), on trio and on asyncio.

::

    consumer = PushConsumer(PushConsumerConfig(consumer_group="orders", namesrv_addr="127.0.0.1:9876"))
    consumer.subscribe("Orders", "created || paid")
    consumer.register_message_listener_orderly(listener)     # or register_message_listener_concurrently
    async with consumer:
        ...                                                   # consuming until the block ends

A listener is ``listener(msgs, context) -> status``: ``async def`` runs as a task of the consumer's loop (trio;
asyncio when the consumer was entered from asyncio), a plain function in a worker thread; at most
``consume_thread_max`` run at once. An exception or ``None`` counts as SUSPEND
(orderly) / RECONSUME_LATER (concurrently). See client.consume.orderly and client.consume.concurrently for
the exact semantics, client.metrics for the metrics.

Leaving the block (or :meth:`PushConsumer.shutdown`, idempotent) is a **graceful shutdown**: pulling stops;
listener calls under way may finish (up to ``await_termination_millis_when_shutdown``; orderly batches at
least 10 s, since an abandoned orderly batch would run beside its next owner's) and their results are
committed, while failures are neither sent back nor committed; then offsets are persisted, the queues'
broker locks released at once and the group left, so the other members take over within a second (the
broker notifies them). No message is both sent back and left uncommitted by a shutdown (RocketMQ #7182).
Leaving by cancellation is graceful too: the client instance runs in a task of its own, shielded, until the
leave is done.

The Pythonic surface, over RocketMQ's (whose names stay):

* ``@consumer.listener(orderly=True)`` registers a listener with a decorator (optionally subscribing too); a
  function of one argument is a per-message handler (returns: consumed; raises: retried);
* ``async for msg in consumer.messages()`` with ``async with msg.process():`` (client.stream);
* ``@consumer.on_assigned`` / ``@consumer.on_revoked``: rebalance callbacks with the queues that came or went;
* under asyncio, ``async with consumer`` works as is, and ``async def`` listeners and callbacks are asyncio code
  (client.aio, docs/EMBEDDING.md).

Operators reach a running consumer through its client instance: GET_CONSUMER_RUNNING_INFO (307) answers
:meth:`PushConsumer.running_info`, SKIP_MESSAGE (9004) calls :meth:`PushConsumer.skip_message`
(docs/PROTOCOL.md).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self, TypeVar, overload

import trio
from prometheus_client import CollectorRegistry

from trimq.client.admin_handlers import register_admin_handlers, watch_stale_resets
from trimq.client.aio import asyncio_native
from trimq.client.config import ConfigError, PushConsumerConfig
from trimq.client.consume.common import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeHooks,
    ConsumeMessageDirectlyResult,
    ConsumeOrderlyStatus,
    ConsumeStats,
    is_async_callable,
)
from trimq.client.consume.concurrently import ConsumeMessageConcurrentlyService
from trimq.client.consume.orderly import ConsumeMessageOrderlyService
from trimq.client.consume.orderly_keyed import ConsumeMessageKeyedService
from trimq.client.consumer_core import ConsumerCore
from trimq.client.errors import ClientClosedError, MQClientError
from trimq.client.instance import ClientInstance
from trimq.client.metrics import ConsumerMetrics, QueueState
from trimq.client.offset_store import OffsetStore
from trimq.client.process_queue import ProcessQueue
from trimq.client.rebalance.strategies import AllocateStrategy
from trimq.client.stream import MessageStream
from trimq.client.subscription import build_subscription_data
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.logs import get_logger
from trimq.runtime.metrics_http import serve_metrics

__all__ = ["PushConsumer"]

log = get_logger("trimq.push_consumer")

F = TypeVar("F", bound=Callable[..., Any])
QueuesCallback = Callable[[list[MessageQueue]], Any]
"""``on_assigned`` / ``on_revoked`` callbacks: ``fn(queues)``, a plain or an ``async def`` function."""

ROUTE_WATCH_S = 60.0

ConsumeService = ConsumeMessageOrderlyService | ConsumeMessageConcurrentlyService

# The push consumers started on each client instance, by group: the targets of broker -> client requests.
_CONSUMERS: weakref.WeakKeyDictionary[ClientInstance, dict[str, PushConsumer]] = weakref.WeakKeyDictionary()


class _Core(ConsumerCore):
    """The consumer core, timing each rebalance pass for the metrics."""

    on_rebalance: Callable[[float], None] | None = None
    on_rebalanced: Callable[[], Awaitable[None]] | None = None
    """Called after each rebalance pass (the consumer tells its on_assigned / on_revoked callbacks)."""

    async def do_rebalance(self) -> None:
        if not self.running:
            return
        start = trio.current_time()
        try:
            await super().do_rebalance()
        finally:
            if self.on_rebalance is not None:
                self.on_rebalance(trio.current_time() - start)
        if self.on_rebalanced is not None:
            await self.on_rebalanced()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _takes_one_message(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` takes exactly one positional argument (a per-message handler), False for RocketMQ's
    ``(msgs, context)`` listeners and whatever cannot be inspected."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    return len(required) == 1 and len(positional) == 1 and not varargs


def _failed(value: Any) -> bool:
    return value is False or value in (ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
                                       ConsumeConcurrentlyStatus.RECONSUME_LATER, ConsumeOrderlyStatus.ROLLBACK)


def per_message_listener(handler: Callable[[MessageExt], Any], orderly: bool) -> Callable[..., Any]:
    """RocketMQ's ``(msgs, context) -> status`` listener calling ``handler(msg)`` for each message in order.

    A handler that returns (anything but False or a failure status) consumed its message; one that raises or
    returns a failure makes its message retried: orderly, the whole batch is retried in place (exceptions
    propagate to the consume service, which logs them); concurrently, the messages before it are committed
    (``ack_index``) and it and the rest are retried. With the default ``consume_message_batch_max_size`` of 1
    this is exactly "the message is retried"."""
    ok: Any = ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    retry: Any = (ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT if orderly
                  else ConsumeConcurrentlyStatus.RECONSUME_LATER)

    def failed_at(i: int, context: Any, exc: BaseException | None) -> Any:
        if i == 0 or orderly or not isinstance(context, ConsumeConcurrentlyContext):
            if exc is not None:
                raise exc
            return retry
        if exc is not None:
            log.warning("push_consumer.handler_failed", error=f"{type(exc).__name__}: {exc}", index=i)
        context.ack_index = i - 1
        return ok

    async def async_listener(msgs: list[MessageExt], context: Any) -> Any:
        for i, m in enumerate(msgs):
            try:
                value = await handler(m)
            except Exception as exc:
                return failed_at(i, context, exc)
            if _failed(value):
                return failed_at(i, context, None)
        return ok

    def sync_listener(msgs: list[MessageExt], context: Any) -> Any:
        for i, m in enumerate(msgs):
            try:
                value = handler(m)
            except Exception as exc:
                return failed_at(i, context, exc)
            if _failed(value):
                return failed_at(i, context, None)
        return ok

    listener: Callable[..., Any] = async_listener if is_async_callable(handler) else sync_listener
    functools.update_wrapper(listener, handler)
    return listener


@asyncio_native("shutdown", "skip_message", "consume_message_directly", idle_ok=("shutdown",))
class PushConsumer:
    """A push consumer; see the module documentation. Use as ``async with`` (in a trio task or a running asyncio
    loop); start it once."""

    def __init__(
        self,
        config: PushConsumerConfig,
        *,
        instance: ClientInstance | None = None,
        registry: CollectorRegistry | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        allocate_strategy: AllocateStrategy | None = None,
        offset_store: OffsetStore | None = None,
        clock: Callable[[], int] | None = None,
        wall_clock: Callable[[], int] | None = None,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        """``instance``: share a running ClientInstance (else the consumer runs its own); ``registry``: the
        prometheus registry for its metrics (else one of its own, :attr:`metrics`); ``metrics_port``: also
        serve ``GET /metrics`` on ``metrics_host:metrics_port`` (0 = any free port, see
        :attr:`metrics_address`); ``allocate_strategy``: a strategy object (else the config's by name);
        ``offset_store``: replaces the default (remote for CLUSTERING, local files for BROADCASTING);
        ``clock``: milliseconds for lock/pull/consume timing (default trio's clock); ``wall_clock``:
        epoch milliseconds (CONSUME_START_TIME, born timestamps); ``shutdown_timeout_s``: bound of the
        leave (persist, unlock, unregister) after the consume service drained."""
        if not isinstance(config, PushConsumerConfig):
            raise TypeError(f"config must be a PushConsumerConfig, got {type(config).__name__}")
        self.config = config.validate()
        if metrics_port is not None and (isinstance(metrics_port, bool) or not isinstance(metrics_port, int)
                                         or not 0 <= metrics_port <= 65535):
            raise ConfigError(f"metrics_port = {metrics_port!r}: must be an integer in [0, 65535] (0 = any free port)")
        if not isinstance(metrics_host, str) or not metrics_host:
            raise ConfigError(f"metrics_host = {metrics_host!r}: must be a host name or address")
        if not isinstance(shutdown_timeout_s, int | float) or shutdown_timeout_s <= 0:
            raise ConfigError(f"shutdown_timeout_s = {shutdown_timeout_s!r}: must be a positive number of seconds")
        self._given_instance = instance
        self.instance: ClientInstance | None = instance
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.metrics_address: tuple[str, int] | None = None
        """Where ``GET /metrics`` is served (with ``metrics_port``), once started."""
        self._strategy = allocate_strategy
        self._offset_store = offset_store
        self._clock = clock
        self._wall_clock = wall_clock
        self.shutdown_timeout_s = float(shutdown_timeout_s)
        self._subscriptions: dict[str, str] = {}
        self._listener: Callable[..., Any] | None = None
        self._orderly = False
        self._stream: MessageStream | None = None
        self._on_assigned: list[QueuesCallback] = []
        self._on_revoked: list[QueuesCallback] = []
        self._assigned: frozenset[MessageQueue] = frozenset()
        self.hooks = ConsumeHooks()
        self.stats = ConsumeStats()
        self.metrics = ConsumerMetrics(self.config.consumer_group, registry)
        self.core: ConsumerCore | None = None
        self.service: ConsumeService | None = None
        self._stack: AsyncExitStack | None = None
        self._started = False
        self._stopping = False
        self._stopped = trio.Event()
        self._suspended = False  # suspend() before the start holds too, as RocketMQ's pause flag does

    # --- configuration before start -------------------------------------------------------------------

    @property
    def group_name(self) -> str:
        """The consumer group (``config.consumer_group``)."""
        return self.config.consumer_group

    @property
    def consume_orderly(self) -> bool:
        """True when the listener is orderly (each queue in order, under its lock)."""
        return self._orderly

    def subscribe(self, topic: str, sub_expression: str | None = "*") -> None:
        """Consume ``topic``'s messages matching ``sub_expression`` (``*`` or ``"TagA || TagB"``).
        Raises ValueError (InvalidNameError for the topic) naming what is wrong. Allowed while running."""
        sub = build_subscription_data(topic, sub_expression)
        self._subscriptions[topic] = sub.sub_string
        if self.core is not None and self.running:
            self.core.subscribe(topic, sub.sub_string)

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``."""
        self._subscriptions.pop(topic, None)
        if self.core is not None and self.running:
            self.core.unsubscribe(topic)

    def _register(self, listener: Callable[..., Any], orderly: bool) -> None:
        if self._started:
            raise MQClientError("register the message listener before starting the consumer")
        if not callable(listener):
            raise TypeError(f"a message listener must be callable (async def or def), got {listener!r}")
        self._listener = listener
        self._orderly = orderly

    def register_message_listener_orderly(self, listener: Callable[..., Any]) -> None:
        """Consume each queue in order: ``listener(msgs, ConsumeOrderlyContext) -> ConsumeOrderlyStatus``."""
        self._register(listener, True)

    def register_message_listener_concurrently(self, listener: Callable[..., Any]) -> None:
        """Consume in parallel: ``listener(msgs, ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus``."""
        self._register(listener, False)

    @overload
    def listener(self, fn: F, /) -> F: ...

    @overload
    def listener(self, topic: str | None = None, sub_expression: str = "*", *,
                 orderly: bool = False) -> Callable[[F], F]: ...

    def listener(self, topic: Any = None, sub_expression: str = "*", *, orderly: bool = False) -> Any:
        """Register the message listener with a decorator; with ``topic``, also :meth:`subscribe` to it::

            @consumer.listener("Orders", "created || paid", orderly=True)
            async def on_order(msg: MessageExt) -> None:      # one argument: a per-message handler
                await handle(msg)                             # returns: consumed; raises: retried

            @consumer.listener(orderly=True)                  # two: RocketMQ's listener, as register_*
            def on_orders(msgs, context) -> ConsumeOrderlyStatus: ...

        ``orderly`` chooses register_message_listener_orderly (each queue in order, under its lock) or
        register_message_listener_concurrently. A per-message handler's semantics: :func:`per_message_listener`.
        ``async def`` functions run as tasks of the consumer's event loop (trio, or asyncio when the consumer
        is entered from asyncio), plain functions in worker threads. Returns the function unchanged."""
        if callable(topic):
            return self.listener()(topic)

        def register(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"a message listener must be callable (async def or def), got {fn!r}")
            listener = per_message_listener(fn, orderly) if _takes_one_message(fn) else fn
            if topic is not None:
                self.subscribe(topic, sub_expression)
            self._register(listener, orderly)
            return fn

        return register

    def messages(self, *, orderly: bool | None = None) -> MessageStream:
        """The consumer's messages as an async iterator, each settled with ``async with msg.process():``
        (client.stream). The first call, before the consumer starts, makes the stream its listener (orderly or
        concurrently, default concurrently); later calls return the same stream::

            stream = consumer.messages(orderly=True)
            async with consumer:
                async for msg in stream:
                    async with msg.process():
                        ...
        """
        if self._stream is None:
            if self._started:
                raise MQClientError("messages() makes the stream the consumer's listener: call it before starting")
            stream = MessageStream(orderly=bool(orderly))
            self._register(stream, stream.orderly)
            self._stream = stream
        elif orderly is not None and orderly != self._stream.orderly:
            raise MQClientError(f"the stream was created with orderly={self._stream.orderly}")
        return self._stream

    def on_assigned(self, fn: F) -> F:
        """Call ``fn(queues)`` (sorted :class:`MessageQueue` list) after a rebalance gave this consumer queues of
        its subscribed topics: pulling them has started (orderly: their broker locks are held). A plain or an
        ``async def`` function (asyncio code when the consumer runs under asyncio); use as a decorator. It runs
        in the rebalance task (keep it short). An exception is logged. Allowed before or after the start."""
        if not callable(fn):
            raise TypeError(f"on_assigned needs a callable, got {fn!r}")
        self._on_assigned.append(fn)
        return fn

    def on_revoked(self, fn: F) -> F:
        """Call ``fn(queues)`` after queues left this consumer (a rebalance moved them, or the consumer shuts down):
        they are no longer consumed here, their offsets were persisted and (orderly) their locks released, so
        drop per-queue state there. Same rules as :meth:`on_assigned`."""
        if not callable(fn):
            raise TypeError(f"on_revoked needs a callable, got {fn!r}")
        self._on_revoked.append(fn)
        return fn

    async def _tell_assignment(self, final: bool = False) -> None:
        """Tell on_assigned / on_revoked what changed since the last time (module documentation)."""
        core = self.core
        held: frozenset[MessageQueue] = frozenset()
        if core is not None and not final:
            held = frozenset(mq for mq, pq in core.rebalance.process_queue_table.items()
                             if not pq.dropped and mq.topic in self._subscriptions)
        revoked, assigned = sorted(self._assigned - held), sorted(held - self._assigned)
        self._assigned = held
        for callbacks, queues, what in ((self._on_revoked, revoked, "on_revoked"),
                                        (self._on_assigned, assigned, "on_assigned")):
            if not queues:
                continue
            for fn in list(callbacks):
                try:
                    result = fn(list(queues))
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("push_consumer.callback_failed", callback=what, group=self.group_name,
                                  fn=getattr(fn, "__qualname__", repr(fn)))

    def _adapt_callbacks(self, adapt: Callable[[Any], Any]) -> None:
        """Called by client.aio before the consumer is entered from asyncio: ``async def`` listeners, hooks and
        callbacks become asyncio tasks of the host loop (``adapt`` wraps them; trio-native ones stay)."""
        if self._listener is not None:
            self._listener = adapt(self._listener)
        self.hooks.before = [adapt(h) for h in self.hooks.before]
        self.hooks.after = [adapt(h) for h in self.hooks.after]
        self._on_assigned = [adapt(f) for f in self._on_assigned]
        self._on_revoked = [adapt(f) for f in self._on_revoked]

    def add_hook(self, before: Callable[[dict[str, Any]], Any] | None = None,
                 after: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """Consume hooks, called before and after each listener call (client.consume.common.ConsumeHooks)."""
        self.hooks.add(before, after)

    # --- lifecycle --------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Started and not (being) shut down."""
        return self._started and not self._stopping

    @property
    def client_id(self) -> str:
        """This member's client id (``ip@pid[@instance]``), once started."""
        if self.instance is None:
            raise ClientClosedError("the consumer has not been started")
        return self.instance.client_id

    async def __aenter__(self) -> Self:
        if self._started:
            raise MQClientError("a PushConsumer can be started once; create a new one")
        if self._listener is None:
            raise MQClientError("no message listener: call register_message_listener_orderly() or "
                                "register_message_listener_concurrently() (or use @consumer.listener, or "
                                "consumer.messages()) before starting")
        if not self._subscriptions:
            raise MQClientError(f"consumer group {self.group_name!r} has no subscription; call subscribe() first")
        self._started = True
        stack = AsyncExitStack()
        try:
            await self._start(stack)
        except BaseException:
            self._stopping = True
            self._unpublish()
            await stack.aclose()  # not shielded: it exits nurseries opened outside any new scope
            self._stopped.set()
            raise
        self._stack = stack
        log.info("push_consumer.started", group=self.group_name, client_id=self.client_id, orderly=self._orderly,
                 topics=sorted(self._subscriptions), metrics=self.metrics_address)
        return self

    async def _start(self, stack: AsyncExitStack) -> None:
        if self._given_instance is None:
            # The instance (its connections, timers and lease renewals) runs in a task of its own, shielded once
            # started: when the scope owning the consumer is cancelled, the graceful leave (persist offsets,
            # unlock, unregister) still has its transport. It is released after the leave (stack order).
            release = trio.Event()
            holder = await stack.enter_async_context(trio.open_nursery())
            self.instance = await holder.start(_hold_shielded, ClientInstance(self.config), release)
            stack.callback(release.set)
        instance = self.instance
        assert instance is not None and self._listener is not None
        cls: type[ConsumeService] = ConsumeMessageConcurrentlyService
        if self._orderly:  # order_scope "key": a queue's keys in parallel (client.consume.orderly_keyed)
            cls = ConsumeMessageKeyedService if self.config.order_scope == "key" else ConsumeMessageOrderlyService
        service = cls(self.group_name, self.config, self._listener, hooks=self.hooks, stats=self.stats,
                      clock=self._clock, wall_clock=self._wall_clock)
        core = _Core(self.config, service, instance=instance, consume_orderly=self._orderly,
                     strategy=self._strategy, offset_store=self._offset_store, clock=self._clock,
                     shutdown_timeout_s=self.shutdown_timeout_s)
        service.config = core.config  # the core's copy (the rebalance adjusts per-queue thresholds in it)
        core.pull_service.paused = self._suspended  # before the core starts: no pull of a suspended consumer
        for topic, expression in self._subscriptions.items():
            core.subscribe(topic, expression)
        service.attach(rebalance=core.rebalance, offset_store=core.offset_store, client=instance)
        self.core, self.service = core, service

        # metrics
        m = self.metrics
        self.stats.on_consume_rt.append(m.observe_consume)
        self.stats.on_result.append(m.count_consumed)
        self.stats.on_send_back.append(m.count_send_back)
        core.on_rebalance = m.observe_rebalance
        core.on_rebalanced = self._tell_assignment

        def pull_rt(mq: MessageQueue, seconds: float) -> None:
            m.observe_pull(mq.topic, seconds)
            self.stats.inc_pull_rt(mq.topic, seconds)

        core.pull_service.on_pull_rt = pull_rt
        m.attach(self)
        stack.callback(m.detach, self)

        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        service.bind(nursery)
        if self.metrics_port is not None:
            self.metrics_address = await nursery.start(
                functools.partial(serve_metrics, m.registry, self.metrics_host, self.metrics_port))

        self._publish(instance)
        await stack.enter_async_context(core)
        service.start()
        for sub in core.subscriptions():
            nursery.start_soon(self._watch_missing_route, core, instance, sub.topic)

    async def _watch_missing_route(self, core: ConsumerCore, instance: ClientInstance, topic: str) -> None:
        """Look for a subscribed topic that has no route yet soon (0.1 s, doubling to 5 s, for a minute)
        instead of at the next 30 s poll: the broker creates ``%RETRY%<group>`` on the first heartbeat, after
        the start fetched the routes, and a producer may create the topic itself moments after we started.
        Then the regular route poll takes over."""
        delay, waited = 0.1, 0.0
        while waited < ROUTE_WATCH_S and topic not in core.rebalance.topic_subscribe_info_table:
            await trio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 5.0)
            if await instance.update_topic_route_info_from_name_server(topic):
                instance.rebalance_immediately()
                return

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        try:
            await self.shutdown()
        finally:
            stack, self._stack = self._stack, None
            if stack is not None:
                # the body's exception is not passed into the nurseries (they would wrap it in a group); the
                # leave already ran shielded in shutdown(), closing only cancels and joins tasks
                await stack.aclose()
        return False

    async def shutdown(self) -> None:
        """Graceful shutdown (module documentation); idempotent, waits for one already under way."""
        if not self._started:
            return
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        core, service = self.core, self.service
        started = trio.current_time()
        try:
            with trio.CancelScope(shield=True):
                if core is not None and service is not None:
                    core.stop_pulling()
                    if self._stream is not None:
                        self._stream.close()  # messages not handed out yet are given up, the iteration ends
                        await self._stream.returned()  # acks given before the shutdown are committed
                    service.stop()
                    clean = await service.drain()
                    with trio.move_on_after(self.shutdown_timeout_s) as scope:
                        await core.leave()
                    if scope.cancelled_caught:
                        log.error("push_consumer.leave_timeout", group=self.group_name,
                                  timeout_s=self.shutdown_timeout_s)
                    await self._tell_assignment(final=True)
                    log.info("push_consumer.stopped", group=self.group_name, client_id=self.client_id,
                             drained=clean, dropped_results=service.dropped_results,
                             took_ms=int((trio.current_time() - started) * 1000))
        finally:
            self._unpublish()
            self._stopped.set()

    def suspend(self) -> None:
        """Pause pulling (RocketMQ's suspend); consumption of cached messages goes on. Called before the start,
        the consumer starts paused: it joins its group, rebalances and locks its queues, but pulls nothing
        until :meth:`resume`."""
        self._suspended = True
        if self.core is not None:
            self.core.pull_service.paused = True

    def resume(self) -> None:
        """Resume pulling after :meth:`suspend` (before the start: the consumer starts pulling)."""
        self._suspended = False
        if self.core is not None and self.running:
            self.core.pull_service.resume()

    @property
    def suspended(self) -> bool:
        """Pulling is paused by :meth:`suspend`."""
        return self._suspended

    # --- broker -> client requests ----------------------------------------------------------------------

    def _publish(self, instance: ClientInstance) -> None:
        table = _CONSUMERS.setdefault(instance, {})
        table[self.group_name] = self
        instance.remoting.register_handler(RequestCode.GET_CONSUMER_RUNNING_INFO,
                                           functools.partial(_on_get_consumer_running_info, instance))
        instance.remoting.register_handler(RequestCode.SKIP_MESSAGE, functools.partial(_on_skip_message, instance))
        # RESET_CONSUMER_CLIENT_OFFSET (220, trimq-admin consumer reset-offset): client/admin_handlers.py
        register_admin_handlers(instance, lambda group: _CONSUMERS.get(instance, {}).get(group))
        watch_stale_resets(self)  # a member not told of a reset resyncs when a commit is refused (issue 19)

    def _unpublish(self) -> None:
        if self.instance is not None:
            table = _CONSUMERS.get(self.instance)
            if table is not None and table.get(self.group_name) is self:
                del table[self.group_name]

    # --- operations on a running consumer -----------------------------------------------------------------

    def _running_parts(self) -> tuple[ConsumerCore, ConsumeService]:
        if self.core is None or self.service is None or not self.running:
            raise ClientClosedError("the consumer is not running (use it inside `async with`)")
        return self.core, self.service

    def process_queue_table(self) -> dict[MessageQueue, ProcessQueue]:
        """The queues this consumer holds now (a copy; dropped ones excluded)."""
        if self.core is None:
            return {}
        return {mq: pq for mq, pq in self.core.rebalance.process_queue_table.items() if not pq.dropped}

    async def skip_message(self, mq: MessageQueue, offset: int, skipped_by: str = "api") -> dict[str, Any]:
        """Dead-letter the message at ``offset`` of ``mq`` (it must be cached here, typically the one an orderly
        queue is blocked on) and move on. The dead letter carries ``TRIMQ_SKIPPED_BY=<skipped_by>`` so it can be
        told from one that ran out of retries. Returns what was skipped; raises MQClientError saying why not."""
        core, service = self._running_parts()
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise MQClientError(f"offset must be a non-negative integer, got {offset!r}")
        pq = core.rebalance.process_queue_table.get(mq)
        if pq is None or pq.dropped:
            raise MQClientError(f"queue {mq} is not held by this consumer ({self.client_id})")
        result = await service.skip_message(mq, pq, offset, skipped_by)
        return {"consumerGroup": self.group_name, "clientId": self.client_id, "mq": mq.to_wire(), **result}

    async def consume_message_directly(self, msg: MessageExt, broker_name: str) -> ConsumeMessageDirectlyResult:
        """Run the listener on ``msg`` outside any queue (RocketMQ's consumeMessageDirectly); nothing is
        committed or sent back."""
        _, service = self._running_parts()
        return await service.consume_message_directly(msg, broker_name)

    def blocked_queues(self) -> list[dict[str, Any]]:
        """Orderly queues retrying one message: ``mq``, ``offset``, ``msgId``, ``attempts``, ``blockedMs``."""
        service = self.service
        if not isinstance(service, ConsumeMessageOrderlyService):
            return []
        now = service.clock()
        return [b.to_wire(now) for b in service.blocked_queues()]

    def running_info(self) -> dict[str, Any]:
        """RocketMQ's ConsumerRunningInfo, as the body of GET_CONSUMER_RUNNING_INFO (docs/PROTOCOL.md)."""
        core, service = self.core, self.service
        if core is None or service is None:
            raise ClientClosedError("the consumer has not been started")
        now = service.clock()
        offsets: dict[MessageQueue, int] = {}
        for topic in {mq.topic for mq in core.rebalance.process_queue_table}:
            offsets.update(core.offset_store.clone_offset_table(topic))
        mq_table = []
        locked = []
        for mq, pq in sorted(core.rebalance.process_queue_table.items()):
            info = {_camel(k): v for k, v in pq.info(now).items()}
            info["commitOffset"] = offsets.get(mq, -1)
            mq_table.append({"mq": mq.to_wire(), "processQueueInfo": info})
            if pq.locked and not pq.dropped:
                locked.append(mq.to_wire())
        properties = {_camel(f.name): getattr(core.config, f.name) for f in dataclasses.fields(core.config)}
        return {
            "consumerGroup": self.group_name,
            "clientId": self.client_id,
            "consumeType": core.consume_type,
            "messageModel": core.message_model,
            "consumeFromWhere": core.consume_from_where,
            "consumeOrderly": self._orderly,
            "running": self.running,
            "properties": properties,
            "subscriptionSet": [s.to_wire() for s in core.subscriptions()],
            "mqTable": mq_table,
            "lockedQueues": locked,
            "blockedQueues": self.blocked_queues(),
            "orderScope": self.config.order_scope if self._orderly else None,
            "blockedKeys": ([b.to_wire(now) for b in service.blocked_key_list()]
                            if isinstance(service, ConsumeMessageKeyedService) else []),
            "statusTable": service.stats.snapshot(),
            "inFlight": service.in_flight,
            "sendBack": dict(service.stats.sent_back),
            "deadLettered": service.stats.dead_lettered,
            "skipped": service.stats.skipped,
            "pull": core.pull_service.info(),
        }

    def metrics_state(self) -> tuple[list[QueueState], dict[str, int], int]:
        """What the metrics collector reads at scrape time (client.metrics.MetricsSource)."""
        core, service = self.core, self.service
        if core is None or service is None:
            return [], {}, 0
        now = service.clock()
        blocked = {}
        if isinstance(service, ConsumeMessageOrderlyService):
            blocked = {b.message_queue: b for b in service.blocked_queues()}
        blocked_keys = service.blocked_key_counts() if isinstance(service, ConsumeMessageKeyedService) else None
        queues = []
        for mq, pq in list(core.rebalance.process_queue_table.items()):
            if pq.dropped:
                continue
            b = blocked.get(mq)
            queues.append(QueueState(
                topic=mq.topic, broker=mq.broker_name, queue_id=mq.queue_id, messages=pq.msg_count,
                bytes=pq.msg_size, locked=pq.locked and self._orderly,
                blocked_seconds=b.blocked_ms(now) / 1000 if b is not None else None,
                blocked_attempts=b.attempts if b is not None else 0,
                blocked_keys=blocked_keys.get(mq, 0) if blocked_keys is not None else None,
            ))
        return queues, dict(core.pull_service.stats), service.stats.dead_lettered


async def _hold_shielded(cm: Any, release: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """``async with cm`` until ``release`` is set, shielded from outside cancellation once entered (entering may
    still be cancelled)."""
    with trio.CancelScope() as scope:
        async with cm as value:
            scope.shield = True
            task_status.started(value)
            await release.wait()


# --- handlers of broker -> client requests (docs/PROTOCOL.md) -------------------------------------------------

_INT = re.compile(r"-?[0-9]+")


def _ext_str(ext: dict[str, Any], name: str) -> str:
    v = ext.get(name)
    if not isinstance(v, str) or not v:
        raise ValueError(f"header field '{name}' is required (a non-empty string), got {v!r}")
    return v


def _ext_int(ext: dict[str, Any], name: str) -> int:
    v = ext.get(name)
    if isinstance(v, str) and _INT.fullmatch(v.strip()):
        return int(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise ValueError(f"header field '{name}' must be an integer, got {v!r}")


def _target(instance: ClientInstance, cmd: RemotingCommand) -> PushConsumer:
    group = _ext_str(cmd.ext or {}, "consumerGroup")
    consumer = _CONSUMERS.get(instance, {}).get(group)
    if consumer is None or not consumer.running:
        raise LookupError(f"the consumer group {group} does not run on client {instance.client_id}")
    return consumer


async def _on_get_consumer_running_info(instance: ClientInstance, cmd: RemotingCommand,
                                        addr: str) -> RemotingCommand:
    try:
        consumer = _target(instance, cmd)
    except (ValueError, LookupError) as exc:
        return RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
    return RemotingCommand.response_to(cmd, body=consumer.running_info())


async def _on_skip_message(instance: ClientInstance, cmd: RemotingCommand, addr: str) -> RemotingCommand:
    ext = cmd.ext or {}
    try:
        consumer = _target(instance, cmd)
        mq = MessageQueue(_ext_str(ext, "topic"), _ext_str(ext, "brokerName"), _ext_int(ext, "queueId"))
        offset = _ext_int(ext, "queueOffset")
    except (ValueError, LookupError) as exc:
        return RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
    try:
        result = await consumer.skip_message(mq, offset, skipped_by=f"admin via {addr}")
    except MQClientError as exc:
        return RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
    log.info("push_consumer.skip_requested", group=consumer.group_name, mq=str(mq), offset=offset, by=addr)
    return RemotingCommand.response_to(cmd, body=result)
