"""What the orderly and the concurrent consume services share.

* the listener statuses, contexts and results of RocketMQ 4.9.3 (ConsumeOrderlyStatus,
  ConsumeConcurrentlyStatus, ConsumeReturnType, CMResult, ConsumeOrderlyContext, ConsumeConcurrentlyContext);
* :class:`ListenerInvoker`: calls the user's listener, ``async def`` as a trio task or a plain function in a
  worker thread; an exception or ``None`` is reported as "no status" (the services read it as SUSPEND /
  RECONSUME_LATER);
* :class:`ConsumeHooks` (RocketMQ's ConsumeMessageHook, before/after, sync or async callables);
* :class:`ConsumeStats` (RocketMQ's ConsumerStatsManager, simplified to totals and latency);
* :class:`SendBack`: CONSUMER_SEND_MSG_BACK with RocketMQ's fallback of producing to ``%RETRY%group``;
* :class:`ConsumeServiceBase`: the consume services' task bookkeeping and the drain of a graceful shutdown.

Shutdown (PushConsumer.shutdown) is three steps here, each a guarantee:

1. :meth:`ConsumeServiceBase.stop`: no new batch starts. From now on a failed result is neither sent back
   nor committed: its messages stay uncommitted, so the next owner consumes them from the queue. (A
   send-back during shutdown is how RocketMQ #7182 duplicates messages: the retry copy is stored, but the
   offset that would cover the original is never persisted.)
2. :meth:`ConsumeServiceBase.drain`: wait, up to a bound, for the listener calls under way and their result
   processing; then **seal**: a listener result arriving later is dropped whole (no commit, no send-back)
   and the calls still running are cancelled (a thread running a plain listener is abandoned).
3. result processing that had started before the seal (a send-back RPC, then the offset update) is always
   allowed to finish, so a stored retry copy is always followed by the offset that covers its original.

Only then does the consumer persist its offsets, unlock its queues and leave the group.
"""

from __future__ import annotations

import enum
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from trimq.client.api import MQClientAPI
from trimq.client.config import PushConsumerConfig
from trimq.client.consume_lock import ConsumeLock
from trimq.client.errors import MQBrokerError, MQClientError, NoRouteError
from trimq.client.instance import TopicPublishInfo
from trimq.protocol.address import format_address
from trimq.protocol.message import MessageConst, MessageExt, encode_properties
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import retry_topic
from trimq.runtime.client import RemotingError
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = [
    "CONSUMER_SEND_BACK_TIMEOUT_MS",
    "INNER_PRODUCER_GROUP",
    "JAVA_INT_MAX",
    "CMResult",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeHooks",
    "ConsumeMessageDirectlyResult",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeReturnType",
    "ConsumeServiceBase",
    "ConsumeStats",
    "ListenerInvoker",
    "ListenerOutcome",
    "MessageModel",
    "SendBack",
    "SendBackClient",
    "held",
    "is_async_callable",
    "normalize_status",
    "reset_retry_and_namespace",
]

log = get_logger("trimq.consume")

JAVA_INT_MAX = 2**31 - 1
E = TypeVar("E", bound=enum.Enum)
CONSUMER_SEND_BACK_TIMEOUT_MS = 5000
INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
RETRY_PRODUCE_ATTEMPTS = 3  # RocketMQ's inner producer: 1 + retryTimesWhenSendFailed (2)


# --------------------------------------------------------------------------------------------------
# Statuses, contexts, results


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener returns (RocketMQ's ConsumeOrderlyStatus)."""

    SUCCESS = "SUCCESS"
    """Consumed: commit the batch's offset."""
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    """Failed: retry the same batch, in place, after ``suspend_current_queue_time_millis``."""
    ROLLBACK = "ROLLBACK"
    """Deprecated (as in RocketMQ): with ``auto_commit`` false, put the in-flight messages back."""
    COMMIT = "COMMIT"
    """Deprecated (as in RocketMQ): with ``auto_commit`` false, commit everything in flight."""


class ConsumeConcurrentlyStatus(enum.Enum):
    """What a concurrent listener returns (RocketMQ's ConsumeConcurrentlyStatus)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    """Consumed (up to ``context.ack_index``; the rest are retried)."""
    RECONSUME_LATER = "RECONSUME_LATER"
    """Failed: every message of the batch comes back later through ``%RETRY%<group>``."""


class ConsumeReturnType(enum.Enum):
    """How a listener call ended, for consume hooks (RocketMQ's ConsumeReturnType)."""

    SUCCESS = "SUCCESS"
    TIME_OUT = "TIME_OUT"
    EXCEPTION = "EXCEPTION"
    RETURNNULL = "RETURNNULL"
    FAILED = "FAILED"


class CMResult(enum.Enum):
    """Result of consuming one message directly (RocketMQ's CMResult)."""

    CR_SUCCESS = "CR_SUCCESS"
    CR_LATER = "CR_LATER"
    CR_ROLLBACK = "CR_ROLLBACK"
    CR_COMMIT = "CR_COMMIT"
    CR_THROW_EXCEPTION = "CR_THROW_EXCEPTION"
    CR_RETURN_NULL = "CR_RETURN_NULL"


class ConsumeFromWhere(enum.StrEnum):
    """Where a group without a stored offset starts (usable wherever the config takes the string)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class MessageModel(enum.StrEnum):
    """CLUSTERING shares a group's queues among its members; BROADCASTING gives every member everything."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


@dataclass
class ConsumeOrderlyContext:
    """Passed to an orderly listener with each batch; the listener may change the two settings."""

    message_queue: MessageQueue
    auto_commit: bool = True
    """False enables the deprecated COMMIT / ROLLBACK protocol (SUCCESS then commits nothing)."""
    suspend_current_queue_time_millis: int = -1
    """Pause after SUSPEND for this batch; -1 = the consumer's ``suspend_current_queue_time_millis``."""
    lock_epoch: int | None = None
    """The fencing token of the queue lock this batch runs under (CLUSTERING with a trimq broker; None otherwise):
    it only grows per (group, queue), across broker restarts too, so a service that stores it with what it
    writes for this queue can refuse writes carrying an older one, e.g. those of a paused ex-holder that wakes
    up after the queue moved (docs/EMBEDDING.md "Fencing your own writes")."""


@dataclass
class ConsumeConcurrentlyContext:
    """Passed to a concurrent listener with each batch; the listener may change the two settings."""

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0
    """Delay level of the retry copy: 0 = the broker's choice (3 + reconsume times), < 0 = DLQ at once."""
    ack_index: int = JAVA_INT_MAX
    """With CONSUME_SUCCESS, messages after this index are retried (default: every message is consumed)."""


@dataclass
class ConsumeMessageDirectlyResult:
    """Outcome of :meth:`consume_message_directly` (RocketMQ's ConsumeMessageDirectlyResult)."""

    order: bool
    auto_commit: bool
    consume_result: CMResult
    remark: str | None
    spent_time_millis: int


def normalize_status(value: Any, kind: type[E]) -> E | None:
    """``value`` as a member of ``kind`` (a member, or its name as a string); None otherwise."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str) and value in kind.__members__:
        return kind[value]
    if value is not None:
        log.warning("consume.bad_status", returned=repr(value)[:200], expected=kind.__name__)
    return None


def reset_retry_and_namespace(msgs: Sequence[MessageExt], consumer_group: str) -> None:
    """Messages of ``%RETRY%<group>`` get their real topic back (RETRY_TOPIC) before the listener sees them."""
    rt = retry_topic(consumer_group)
    for msg in msgs:
        real = msg.properties.get(MessageConst.RETRY_TOPIC)
        if real and msg.topic == rt:
            msg.topic = real


# --------------------------------------------------------------------------------------------------
# Listener calls


class held:
    """``async with held(lock)``: a trio Lock or CapacityLimiter, taken without a scheduling round when it is
    free (the uncontended case of every batch of a queue), waited for as usual when it is not."""

    __slots__ = ("_lock",)

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions, partials of them and objects with an ``async def __call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - we want the class's __call__, not callable()
    return call is not None and inspect.iscoroutinefunction(call)


@dataclass
class ListenerOutcome:
    """What one listener call gave: its return value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None
    spent_ms: int = 0


class ListenerInvoker:
    """Calls a listener ``(msgs, context) -> status``: ``async def`` in the calling task, a plain function in a
    worker thread (``trio.to_thread.run_sync``), so blocking user code never stalls the trio loop."""

    def __init__(self, listener: Callable[..., Any], thread_limit: int) -> None:
        if not callable(listener):
            raise TypeError(f"a message listener must be callable, got {listener!r}")
        self.listener = listener
        self.is_async = is_async_callable(listener)
        # The service's CapacityLimiter bounds the calls; this one only has to be big enough never to bind.
        self._thread_limiter = trio.CapacityLimiter(max(1, thread_limit))

    async def invoke(self, msgs: list[MessageExt], context: Any) -> ListenerOutcome:
        """Call the listener once; exceptions are captured in the outcome (cancellation propagates)."""
        start = trio.current_time()
        try:
            if self.is_async:
                value = await self.listener(msgs, context)
            else:
                value = await trio.to_thread.run_sync(
                    self.listener, msgs, context, abandon_on_cancel=True, limiter=self._thread_limiter
                )
                if inspect.isawaitable(value):  # a plain callable that returned a coroutine
                    value = await value
            return ListenerOutcome(value=value, spent_ms=_elapsed_ms(start))
        except Exception as exc:
            return ListenerOutcome(error=exc, spent_ms=_elapsed_ms(start))


def _elapsed_ms(start: float) -> int:
    return int((trio.current_time() - start) * 1000)


# --------------------------------------------------------------------------------------------------
# Hooks and statistics


Hook = Callable[[dict[str, Any]], Any]


class ConsumeHooks:
    """Consume hooks (RocketMQ's ConsumeMessageHook): ``before(ctx)`` runs before each listener call,
    ``after(ctx)`` after it. ``ctx`` is one dict per call with ``consumer_group``, ``message_queue``, ``msgs``,
    ``orderly``, ``props`` and, for ``after``, ``status`` (the status name), ``success``, ``return_type`` and
    ``consume_rt_ms``. Hooks run in the trio thread (keep them short); they may be ``async def``. A hook's
    exception is logged and ignored, as in RocketMQ."""

    def __init__(self) -> None:
        self.before: list[Hook] = []
        self.after: list[Hook] = []

    def add(self, before: Hook | None = None, after: Hook | None = None) -> None:
        for fn, name in ((before, "before"), (after, "after")):
            if fn is not None and not callable(fn):
                raise TypeError(f"hook {name} must be callable, got {fn!r}")
        if before is not None:
            self.before.append(before)
        if after is not None:
            self.after.append(after)

    def __bool__(self) -> bool:
        return bool(self.before or self.after)

    async def run(self, which: str, ctx: dict[str, Any]) -> None:
        for fn in list(self.before if which == "before" else self.after):
            try:
                result = fn(ctx)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("consume.hook_failed", hook=which, fn=getattr(fn, "__name__", repr(fn)))


@dataclass
class _TopicStats:
    consume_ok: int = 0
    consume_failed: int = 0
    consume_rt_count: int = 0
    consume_rt_total_ms: int = 0
    consume_rt_max_ms: int = 0
    pull_rt_count: int = 0
    pull_rt_total_ms: float = 0.0


@dataclass
class ConsumeStats:
    """Per-topic consume statistics (RocketMQ's ConsumerStatsManager, as totals); observers (the metrics)
    are told of every event."""

    topics: dict[str, _TopicStats] = field(default_factory=dict)
    sent_back: dict[str, int] = field(default_factory=lambda: {"broker": 0, "retry_topic": 0, "failed": 0})
    dead_lettered: int = 0
    skipped: int = 0
    on_consume_rt: list[Callable[[str, float], None]] = field(default_factory=list)
    on_result: list[Callable[[str, int, int], None]] = field(default_factory=list)
    on_send_back: list[Callable[[str], None]] = field(default_factory=list)

    def _t(self, topic: str) -> _TopicStats:
        t = self.topics.get(topic)
        if t is None:
            t = self.topics[topic] = _TopicStats()
        return t

    def inc_consume_rt(self, topic: str, rt_ms: int) -> None:
        t = self._t(topic)
        t.consume_rt_count += 1
        t.consume_rt_total_ms += rt_ms
        t.consume_rt_max_ms = max(t.consume_rt_max_ms, rt_ms)
        for fn in self.on_consume_rt:
            fn(topic, rt_ms / 1000)

    def inc_consume(self, topic: str, ok: int, failed: int) -> None:
        t = self._t(topic)
        t.consume_ok += ok
        t.consume_failed += failed
        for fn in self.on_result:
            fn(topic, ok, failed)

    def inc_pull_rt(self, topic: str, rt_s: float) -> None:
        t = self._t(topic)
        t.pull_rt_count += 1
        t.pull_rt_total_ms += rt_s * 1000

    def inc_send_back(self, how: str) -> None:
        """``how``: "broker" (CONSUMER_SEND_MSG_BACK), "retry_topic" (produced), "failed"."""
        self.sent_back[how] = self.sent_back.get(how, 0) + 1
        for fn in self.on_send_back:
            fn(how)

    def snapshot(self) -> dict[str, Any]:
        """RocketMQ's statusTable, one entry per topic (latencies in ms, averages over the consumer's life)."""
        out: dict[str, Any] = {}
        for topic, t in sorted(self.topics.items()):
            out[topic] = {
                "consumeOK": t.consume_ok,
                "consumeFailed": t.consume_failed,
                "consumeRT": round(t.consume_rt_total_ms / t.consume_rt_count, 3) if t.consume_rt_count else 0.0,
                "consumeRTMax": t.consume_rt_max_ms,
                "consumeCount": t.consume_rt_count,
                "pullRT": round(t.pull_rt_total_ms / t.pull_rt_count, 3) if t.pull_rt_count else 0.0,
                "pullCount": t.pull_rt_count,
            }
        return out


# --------------------------------------------------------------------------------------------------
# Sending messages back


class SendBackClient(Protocol):
    """What sending back needs from the client instance."""

    @property
    def api(self) -> MQClientAPI: ...

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None: ...

    async def get_publish_info(
        self, topic: str, *, create_topic_key: str = "", default_queue_nums: int = 4
    ) -> TopicPublishInfo | None: ...


#: Properties about one delivery rather than the message: what the pull decoder and the consume services add on
#: receipt, and the broker's mark on a copy delivered from SCHEDULE_TOPIC_XXXX (SCHEDULE_OFFSET_PROPERTY of
#: broker/store/schedule.py). Neither send-back path copies them.
_RECEIPT_PROPERTIES = (MessageConst.MIN_OFFSET, MessageConst.MAX_OFFSET, MessageConst.CONSUME_START_TIME,
                       "TRIMQ_SCHEDULE_OFFSET")


def wire_int(value: int) -> int:
    """A count as a Java int on the wire (the orderly "unbounded" maximum is sys.maxsize here)."""
    return min(value, JAVA_INT_MAX)


class SendBack:
    """Stores a consumed message again for a later retry or as a dead letter.

    :meth:`consumer_send_back` is CONSUMER_SEND_MSG_BACK to the broker holding the message;
    :meth:`produce_to_retry` is RocketMQ's fallback when that fails: the client itself produces a copy to
    ``%RETRY%<group>`` with RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME and MAX_RECONSUME_TIMES, which the
    broker dead-letters at once when RECONSUME_TIME has reached MAX_RECONSUME_TIMES.

    ORIGIN_MESSAGE_ID, when the message has none yet: the broker's rule (CONSUMER_SEND_MSG_BACK) uses the stored
    message's offset id, the client's rule (the fallback, and CONSUMER_SEND_MSG_BACK with ``reconsume_times``)
    its unique key, ``msg.getMsgId()`` of RocketMQ's client. RocketMQ 4.9.3's fallbacks set that value and then
    lose it (``setProperties`` replaces the map after ``setOriginMessageId``; fixed for the orderly service in
    4.9.4, RocketMQ #4050); trimq keeps it.
    """

    def __init__(self, client: SendBackClient, consumer_group: str, *,
                 timeout_ms: int = CONSUMER_SEND_BACK_TIMEOUT_MS,
                 wall_clock: Callable[[], int] | None = None) -> None:
        self.client = client
        self.consumer_group = consumer_group
        self.timeout_ms = timeout_ms
        self.wall_clock = wall_clock or (lambda: int(time.time() * 1000))

    async def _broker_addr(self, msg: MessageExt, broker_name: str | None) -> str:
        if broker_name:
            addr = await self.client.find_broker_addr(broker_name, msg.topic)
            if addr is not None:
                return addr
        return format_address(*msg.store_host)

    async def consumer_send_back(self, msg: MessageExt, delay_level: int, broker_name: str | None,
                                 max_reconsume_times: int, skipped_by: str | None = None,
                                 reconsume_times: int | None = None) -> None:
        """CONSUMER_SEND_MSG_BACK; raises RemotingError / MQBrokerError / MQClientError.

        With ``reconsume_times`` the broker stores the copy :meth:`produce_to_retry` would (the client's rule)."""
        addr = await self._broker_addr(msg, broker_name)
        await self.client.api.consumer_send_msg_back(
            addr,
            group=self.consumer_group,
            commit_log_offset=msg.commit_log_offset,
            delay_level=delay_level,
            origin_msg_id=msg.msg_id,
            origin_topic=msg.topic,
            max_reconsume_times=wire_int(max_reconsume_times),
            skipped_by=skipped_by,
            timeout_ms=self.timeout_ms,
            reconsume_times=reconsume_times,
        )

    async def produce_to_retry(self, msg: MessageExt, *, reconsume_times: int, max_reconsume_times: int,
                               delay_level: int, extra_properties: dict[str, str] | None = None) -> None:
        """Produce a copy of ``msg`` to ``%RETRY%<group>`` (RocketMQ's inner-producer fallback); raises
        NoRouteError or the last send error.

        The copy carries the message's properties as the broker's copy does: what describes this delivery
        (MIN_OFFSET / MAX_OFFSET of the pull, CONSUME_START_TIME, TRIMQ_SCHEDULE_OFFSET) is left out, where
        RocketMQ's client copies it too."""
        topic = retry_topic(self.consumer_group)
        props = dict(msg.properties)
        for name in _RECEIPT_PROPERTIES:
            props.pop(name, None)
        origin = (props.get(MessageConst.ORIGIN_MESSAGE_ID) or "").strip()
        props[MessageConst.ORIGIN_MESSAGE_ID] = origin or msg.unique_id  # RocketMQ's client msg.getMsgId()
        props[MessageConst.RETRY_TOPIC] = msg.topic
        props.pop(MessageConst.TRANSACTION_PREPARED, None)
        props.pop(MessageConst.RECONSUME_TIME, None)  # they travel in the request header
        props.pop(MessageConst.MAX_RECONSUME_TIMES, None)
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        if delay_level > 0:
            props[MessageConst.DELAY_TIME_LEVEL] = str(delay_level)
        props.update(extra_properties or {})
        info = await self.client.get_publish_info(topic)
        if info is None or not info.ok():
            raise NoRouteError(topic, "the retry topic has no route (has the consumer sent a heartbeat?)")
        last_broker: str | None = None
        last_error: Exception | None = None
        for _ in range(RETRY_PRODUCE_ATTEMPTS):
            mq = info.select_one_message_queue(last_broker)
            last_broker = mq.broker_name
            try:
                addr = await self.client.find_broker_addr(mq.broker_name, topic)
                if addr is None:
                    raise MQClientError(f"broker {mq.broker_name!r} of {mq} is not in any known route")
                await self.client.api.send_message(
                    addr, mq.broker_name,
                    producer_group=INNER_PRODUCER_GROUP,
                    topic=topic,
                    queue_id=mq.queue_id,
                    body=bytes(msg.body or b""),
                    properties=encode_properties(props),
                    born_timestamp=self.wall_clock(),
                    flag=msg.flag,
                    reconsume_times=reconsume_times,
                    max_reconsume_times=wire_int(max_reconsume_times),
                    uniq_id=props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, ""),
                    timeout_ms=self.timeout_ms,
                )
                return
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    async def send(self, msg: MessageExt, *, delay_level: int, broker_name: str | None,
                   max_reconsume_times: int, fallback_reconsume_times: int, fallback_delay_level: int,
                   stats: ConsumeStats | None = None, skipped_by: str | None = None,
                   reconsume_times: int | None = None) -> bool:
        """CONSUMER_SEND_MSG_BACK, else :meth:`produce_to_retry`; False (logged) when both fail.

        ``skipped_by`` marks an operator's skip on the dead letter (the TRIMQ_SKIPPED_BY property).
        ``reconsume_times`` asks the broker for the client's rule (:meth:`consumer_send_back`); pass the same
        count as ``fallback_reconsume_times`` so both paths store the same copy."""
        try:
            await self.consumer_send_back(msg, delay_level, broker_name, max_reconsume_times, skipped_by,
                                          reconsume_times)
            if stats is not None:
                stats.inc_send_back("broker")
            return True
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            log.warning("consume.send_back_failed", group=self.consumer_group, topic=msg.topic,
                        msg_id=msg.msg_id, queue_offset=msg.queue_offset, error=str(exc), fallback="retry_topic")
        try:
            await self.produce_to_retry(
                msg, reconsume_times=fallback_reconsume_times, max_reconsume_times=max_reconsume_times,
                delay_level=fallback_delay_level,
                extra_properties={MessageConst.SKIPPED_BY: skipped_by} if skipped_by else None)
            if stats is not None:
                stats.inc_send_back("retry_topic")
            return True
        except (RemotingError, MQBrokerError, MQClientError) as exc:
            log.warning("consume.retry_produce_failed", group=self.consumer_group, topic=msg.topic,
                        msg_id=msg.msg_id, queue_offset=msg.queue_offset, error=str(exc))
            if stats is not None:
                stats.inc_send_back("failed")
            return False


# --------------------------------------------------------------------------------------------------
# The consume services' common machinery


class RebalanceView(Protocol):
    """What the consume services read from the rebalance (client.rebalance.impl.RebalanceImpl)."""

    process_queue_table: dict[MessageQueue, Any]

    @property
    def clustering(self) -> bool: ...

    def consume_lock(self, pq: Any) -> ConsumeLock | trio.Lock: ...

    async def lock(self, mq: MessageQueue) -> bool: ...


class OffsetWriter(Protocol):
    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None: ...


class ConsumeServiceBase:
    """Task bookkeeping shared by both services: spawning in the service's nursery, the CapacityLimiter of
    ``consume_thread_max`` around listener calls, and the stop / drain / seal of a graceful shutdown (see
    the module documentation)."""

    orderly = False

    def __init__(
        self,
        consumer_group: str,
        config: PushConsumerConfig,
        listener: Callable[..., Any],
        *,
        hooks: ConsumeHooks | None = None,
        stats: ConsumeStats | None = None,
        clock: Callable[[], int] | None = None,
        wall_clock: Callable[[], int] | None = None,
    ) -> None:
        self.consumer_group = consumer_group
        self.config = config
        self.invoker = ListenerInvoker(listener, config.consume_thread_max)
        self.limiter = trio.CapacityLimiter(config.consume_thread_max)
        self.hooks = hooks or ConsumeHooks()
        self.stats = stats or ConsumeStats()
        self.clock: Callable[[], int] = clock or (lambda: int(trio.current_time() * 1000))
        self.wall_clock: Callable[[], int] = wall_clock or (lambda: int(time.time() * 1000))
        self.rebalance: RebalanceView | None = None
        self.offset_store: OffsetWriter | None = None
        self.send_back: SendBack | None = None
        self.nursery: trio.Nursery | None = None
        self.stopping = False
        self.sealed = False
        self._listening: set[trio.CancelScope] = set()
        self._processing = 0
        self._changed = trio.Event()
        self._watchers = 0
        self.dropped_results = 0
        """Listener results dropped because the service was sealed (shutdown) before they arrived."""
        self._exc_rate = RateLimiter(10_000)
        self._init_state()

    def _init_state(self) -> None:
        """Per-service state, set up by each service after the shared part."""

    async def _consume_directly(self, msg: MessageExt, context: Any, status_kind: type[E],
                                results: Mapping[E | None, CMResult]) -> tuple[CMResult, str | None, int]:
        """Run the listener on one message outside the queues (RocketMQ's consumeMessageDirectly); returns
        the result (``results`` maps the listener's status), the error remark and the time spent."""
        reset_retry_and_namespace([msg], self.consumer_group)
        outcome = await self.invoker.invoke([msg], context)
        if outcome.error is not None:
            return CMResult.CR_THROW_EXCEPTION, f"{type(outcome.error).__name__}: {outcome.error}", outcome.spent_ms
        return results[normalize_status(outcome.value, status_kind)], None, outcome.spent_ms

    # --- wiring ------------------------------------------------------------------------------------

    def attach(self, *, rebalance: RebalanceView, offset_store: OffsetWriter, client: SendBackClient) -> None:
        """The consumer's rebalance (process queues, locks), offset store and client instance."""
        self.rebalance = rebalance
        self.offset_store = offset_store
        self.send_back = SendBack(client, self.consumer_group, wall_clock=self.wall_clock)

    def bind(self, nursery: trio.Nursery) -> None:
        """The nursery consume tasks run in (owned by the push consumer)."""
        self.nursery = nursery

    def start(self) -> None:
        """Start the service's periodic tasks (none by default)."""

    @property
    def clustering(self) -> bool:
        return self.config.message_model == "CLUSTERING"

    @property
    def max_reconsume_times(self) -> int:
        raise NotImplementedError

    def _spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        if self.nursery is None or self.stopping:
            return False
        self.nursery.start_soon(fn, *args)
        return True

    def _later(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` (sync) after ``delay_ms``, unless the service stops first."""

        async def later() -> None:
            await trio.sleep(delay_ms / 1000)
            if not self.stopping:
                fn(*args)

        self._spawn(later)

    # --- listener calls and shutdown bookkeeping --------------------------------------------------------

    async def call_listener(
        self, msgs: list[MessageExt], context: Any, before: Callable[[], Awaitable[None]] | None = None
    ) -> ListenerOutcome | None:
        """Run the listener within the limiter; None when it did not run (stopping) or was abandoned (sealed)."""
        async with held(self.limiter):
            if self.stopping:
                return None
            if before is not None:
                await before()
            with trio.CancelScope() as scope:
                self._listening.add(scope)
                self._notify()
                try:
                    return await self.invoker.invoke(msgs, context)
                finally:
                    self._listening.discard(scope)
                    self._notify()
            return None  # cancelled by the seal

    @contextmanager
    def processing(self) -> Iterator[None]:
        """Marks result processing (send-back, commit) that a shutdown must let finish."""
        self._processing += 1
        self._notify()
        try:
            yield
        finally:
            self._processing -= 1
            self._notify()

    def _notify(self) -> None:
        if self._watchers:  # only a shutdown waits on this: no Event per listener call otherwise
            self._changed.set()
            self._changed = trio.Event()

    async def _wait_for(self, pred: Callable[[], bool]) -> None:
        self._watchers += 1
        try:
            while not pred():
                await self._changed.wait()
        finally:
            self._watchers -= 1

    @property
    def in_flight(self) -> int:
        """Listener calls under way plus results being processed."""
        return len(self._listening) + self._processing

    def stop(self) -> None:
        """No new batch starts; failed results are no longer sent back (shutdown step 1)."""
        self.stopping = True

    def drain_timeout_s(self) -> float:
        """How long :meth:`drain` waits for listener calls under way."""
        return self.config.await_termination_millis_when_shutdown / 1000

    async def drain(self, timeout_s: float | None = None, processing_timeout_s: float = 15.0) -> bool:
        """Shutdown steps 2 and 3 (module documentation). True when nothing had to be abandoned."""
        self.stop()
        wait = self.drain_timeout_s() if timeout_s is None else timeout_s
        with trio.move_on_after(wait):
            await self._wait_for(lambda: self.in_flight == 0)
        self.sealed = True
        abandoned = len(self._listening)
        for scope in list(self._listening):
            scope.cancel()
        if abandoned:
            log.warning("consume.shutdown_abandoned", group=self.consumer_group, listener_calls=abandoned,
                        waited_s=wait)
        with trio.move_on_after(processing_timeout_s):
            await self._wait_for(lambda: self._processing == 0)
        if self._processing:
            log.error("consume.shutdown_processing_unfinished", group=self.consumer_group, count=self._processing)
        return abandoned == 0 and self._processing == 0

    def log_listener_exception(self, mq: MessageQueue, msgs: Sequence[MessageExt], error: BaseException) -> None:
        """A listener raised: one warning per queue every 10 s (with the count of suppressed ones)."""
        log_rate_limited(self._exc_rate, mq, self.clock(), log.warning, "consume.listener_exception",
                         group=self.consumer_group, mq=str(mq), offsets=[m.queue_offset for m in msgs],
                         error=f"{type(error).__name__}: {error}", exc_info=error)

    def hook_context(self, mq: MessageQueue, msgs: list[MessageExt]) -> dict[str, Any]:
        return {"consumer_group": self.consumer_group, "message_queue": mq, "msgs": msgs, "orderly": self.orderly,
                "success": False, "props": {}}

    def return_type(self, status: enum.Enum | None, outcome: ListenerOutcome, failed: enum.Enum) -> ConsumeReturnType:
        """RocketMQ's classification of a listener call for hooks."""
        if status is None:
            return ConsumeReturnType.EXCEPTION if outcome.error is not None else ConsumeReturnType.RETURNNULL
        if outcome.spent_ms >= self.config.consume_timeout * 60_000:
            return ConsumeReturnType.TIME_OUT
        if status is failed:
            return ConsumeReturnType.FAILED
        return ConsumeReturnType.SUCCESS
