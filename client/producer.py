"""Producer: send messages to a topic (RocketMQ's DefaultMQProducer, synchronous sends).

::

    async with Producer(ProducerConfig(namesrv_addr="127.0.0.1:9876", producer_group="orders")) as p:
        result = await p.send(Message("Orders", b"hello", tags="created"))
        result = await p.send(msg, selector=SelectMessageQueueByHash(), arg=order_id)   # same key, same queue
        result = await p.send(msg, sharding_key=order_id)            # the same queue, and the key for key scope
        result = await p.send_batch([m1, m2, m3])                                          # one queue

A ``sharding_key`` (RocketMQ 5's) is stored as the ``__SHARDINGKEY`` property, which an orderly consumer with
``order_scope="key"`` keeps in order, and picks the queue exactly as ``SelectMessageQueueByHash`` does with that
string (so a selector's users keep their queues).

A plain ``send`` picks queues round robin and, when an attempt fails, retries up to
``retry_times_when_send_failed`` times on another queue, preferring another broker (RocketMQ's
selectOneMessageQueue avoiding the last failed broker), all within ``send_msg_timeout``. With
``send_latency_fault_enable`` it also avoids, for a while, brokers that failed or answered slowly (RocketMQ's
latency fault tolerance, client/latency_fault.py). A send to a selected queue whose broker's master is down (the
route lists only its slave, or it could not be reached a moment ago) fails at once with BrokerNotAvailableError
(issue 15); selectors choose among the queues of every broker of the route, so the other keys keep their queues.
A send with a
``sharding_key``, a ``selector`` or an explicit ``message_queue`` is not retried elsewhere: that would break the
ordering the caller asked for.

Messages are validated first (topic name, body present and within ``max_message_size``, properties);
violations raise :class:`client.errors.InvalidMessageError` subclasses naming the problem.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import trio

from trimq.client.aio import asyncio_native
from trimq.client.api import SendResult, SendStatus
from trimq.client.config import ProducerConfig
from trimq.client.errors import (
    BrokerNotAvailableError,
    BrokerNotFoundError,
    ClientClosedError,
    EmptyBodyError,
    ForbiddenTopicError,
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    MQBrokerError,
    MQClientError,
    NoRouteError,
    SelectorError,
    SendFailedError,
)
from trimq.client.instance import ClientInstance, TopicPublishInfo
from trimq.client.latency_fault import MQFaultStrategy
from trimq.client.selectors import MessageQueueSelector, SelectMessageQueueByHash
from trimq.protocol.codes import ResponseCode
from trimq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    Message,
    MessageConst,
    check_property_text,
    encode_properties,
)
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import SCHEDULE_TOPIC, InvalidNameError, check_topic, is_retry_topic
from trimq.runtime.client import RemotingError, RemotingTimeoutError
from trimq.runtime.logs import get_logger

__all__ = ["Producer", "UniqIdGenerator", "validate_message", "with_sharding_key"]

log = get_logger("trimq.producer")


def _mono_ms() -> int:
    """The latency fault tolerance's clock (ms): the trio clock, so tests can run it under MockClock."""
    return int(trio.current_time() * 1000)

# RocketMQ's TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET plus the auto-create key topic.
FORBIDDEN_TOPICS = frozenset({
    SCHEDULE_TOPIC,
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
    "TBW102",
})

# Broker answers after which RocketMQ tries another queue (DefaultMQProducerImpl.retryResponseCodes).
RETRY_RESPONSE_CODES = frozenset({
    ResponseCode.TOPIC_NOT_EXIST,
    ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.SYSTEM_BUSY,
    ResponseCode.NO_PERMISSION,
})


class UniqIdGenerator:
    """RocketMQ-style unique message keys (UNIQ_KEY): 32 hex digits.

    ip (4 bytes) + pid (2) + a per-generator random (4) + milliseconds since the start of the month (4)
    + a counter (2): unique per process, roughly time-ordered, and cheap.
    """

    def __init__(self, ip: str) -> None:
        try:
            ip_bytes = bytes(int(p) & 0xFF for p in ip.split("."))[:4].rjust(4, b"\0")
        except ValueError:
            ip_bytes = b"\x7f\x00\x00\x01"
        self._prefix = (ip_bytes + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)).hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _roll_month(self, now_ms: int) -> None:
        now = datetime.fromtimestamp(now_ms / 1000)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def next_id(self, now_ms: int | None = None) -> str:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms >= self._next_month_ms or now_ms < self._month_start_ms:
            self._roll_month(now_ms)
        self._counter = (self._counter + 1) & 0xFFFF
        return f"{self._prefix}{(now_ms - self._month_start_ms) & 0xFFFFFFFF:08X}{self._counter:04X}"

    def next_ids(self, n: int, now_ms: int | None = None) -> list[str]:
        """``n`` ids at once (one clock read): what a batch send needs."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms >= self._next_month_ms or now_ms < self._month_start_ms:
            self._roll_month(now_ms)
        head = f"{self._prefix}{(now_ms - self._month_start_ms) & 0xFFFFFFFF:08X}"
        c = self._counter
        self._counter = (c + n) & 0xFFFF
        return [f"{head}{(c + i) & 0xFFFF:04X}" for i in range(1, n + 1)]


_BY_HASH = SelectMessageQueueByHash()


def with_sharding_key(msg: Message, sharding_key: str) -> Message:
    """A copy of ``msg`` carrying ``sharding_key`` as its ``__SHARDINGKEY`` property (RocketMQ 5's
    MessageConst.PROPERTY_SHARDING_KEY); InvalidMessageError when the key is not a non-empty string or holds a
    property separator."""
    if not isinstance(sharding_key, str) or not sharding_key:
        raise InvalidMessageError(f"sharding_key must be a non-empty string, got {sharding_key!r}")
    if not isinstance(msg, Message):
        raise InvalidMessageError(f"expected a protocol.message.Message, got {type(msg).__name__}")
    try:
        check_property_text(MessageConst.SHARDING_KEY, sharding_key)
    except ValueError as exc:
        raise InvalidMessageError(f"sharding_key: {exc}") from None
    return dataclasses.replace(msg, properties={**msg.properties, MessageConst.SHARDING_KEY: sharding_key})


def validate_message(msg: Any, max_message_size: int) -> None:
    """RocketMQ's Validators.checkMessage plus property checks; raises an InvalidMessageError subclass."""
    if not isinstance(msg, Message):
        raise InvalidMessageError(f"expected a protocol.message.Message, got {type(msg).__name__}")
    _check_topic_for_send(msg.topic)
    _validated_properties(msg, max_message_size)


def _check_topic_for_send(topic: Any) -> None:
    try:
        check_topic(topic)
    except InvalidNameError as exc:
        raise InvalidTopicError(str(exc)) from None
    if topic in FORBIDDEN_TOPICS:
        raise ForbiddenTopicError(f"sending messages to topic {topic!r} is forbidden (system topic)")


def _validated_properties(msg: Message, max_message_size: int) -> dict[str, str]:
    """validate_message's checks past the topic; returns ``msg.all_properties()`` (checked)."""
    body = msg.body
    if (type(body) is bytes and 0 < len(body) <= max_message_size and type(msg.delay_time_level) is int
            and msg.delay_time_level == 0 and not msg.properties and not msg.tags and not msg.keys):
        return {}  # the plain case: a non-empty bytes body and no property at all
    if msg.body is None:
        raise EmptyBodyError(f"the message body is missing (topic {msg.topic!r})")
    if not isinstance(msg.body, bytes | bytearray | memoryview):
        raise InvalidMessageError(
            f"the message body must be bytes, got {type(msg.body).__name__} (encode text, e.g. s.encode())"
        )
    size = len(msg.body)
    if size == 0:
        raise EmptyBodyError(f"the message body is empty (topic {msg.topic!r})")
    if size > max_message_size:
        raise MessageTooLargeError(size, max_message_size)
    if isinstance(msg.delay_time_level, bool) or not isinstance(msg.delay_time_level, int):
        raise InvalidMessageError(f"delay_time_level must be an int, got {msg.delay_time_level!r}")
    if msg.delay_time_level < 0:
        raise InvalidMessageError(f"delay_time_level must be >= 0 (0 = no delay), got {msg.delay_time_level}")
    props = msg.all_properties()
    if not props:
        return props
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidMessageError(f"property {k!r} = {v!r}: names and values must be strings")
        try:
            check_property_text(k, v)
        except ValueError as exc:
            raise InvalidMessageError(str(exc)) from None
    encoded = len(encode_properties(props).encode("utf-8"))
    if encoded > MAX_PROPERTIES_BYTES - 64:  # leave room for UNIQ_KEY and friends
        raise InvalidMessageError(f"the message properties take {encoded} bytes; the limit is {MAX_PROPERTIES_BYTES}")
    return props


@asyncio_native("send", "send_batch", "send_batches", "message_queues")
class Producer:
    """Sends messages; see the module documentation. Use as ``async with`` in a trio task or in a running asyncio
    loop (client.aio: ``await producer.send(...)`` from asyncio without a thread)."""

    def __init__(self, config: ProducerConfig, *, instance: ClientInstance | None = None) -> None:
        self.config = config.validate()
        self._given_instance = instance
        self.instance: ClientInstance | None = instance
        self._stack: AsyncExitStack | None = None
        self._uniq: UniqIdGenerator | None = None
        self._running = False
        #: RocketMQ's MQFaultStrategy (``send_latency_fault_enable``; issue 15).
        self.fault_strategy = MQFaultStrategy(self.config.send_latency_fault_enable)

    @property
    def group_name(self) -> str:
        """The producer group (``config.producer_group``)."""
        return self.config.producer_group

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        try:
            if self._given_instance is None:
                self.instance = await stack.enter_async_context(ClientInstance(self.config))
            assert self.instance is not None
            self._uniq = UniqIdGenerator(self.instance.client_ip)
            await self.instance.register_producer(self)
            stack.push_async_callback(self.instance.unregister_producer, self.group_name)
            # A master that (re-)registers is used again at once, not after the time its failure earned it.
            listeners = self.instance.master_listeners
            listeners.append(self.fault_strategy.latency_fault_tolerance.remove)
            stack.callback(listeners.remove, self.fault_strategy.latency_fault_tolerance.remove)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._running = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._running = False
        assert self._stack is not None
        stack, self._stack = self._stack, None
        return await stack.__aexit__(exc_type, exc, tb)

    def _client(self) -> ClientInstance:
        if not self._running or self.instance is None:
            raise ClientClosedError("the producer is not running (use it inside `async with`)")
        return self.instance

    # --- public API ---------------------------------------------------------------------------------

    async def send(
        self,
        msg: Message,
        timeout_ms: int | None = None,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        message_queue: MessageQueue | None = None,
        sharding_key: str | None = None,
    ) -> SendResult:
        """Send one message and wait until the broker stored it.

        * no ``selector`` / ``message_queue`` / ``sharding_key``: round robin with retries on another queue/broker;
        * ``selector(mqs, msg, arg)``: the queue it returns (no retry elsewhere);
        * ``message_queue``: exactly that queue (no retry elsewhere);
        * ``sharding_key``: the message carries it as the ``__SHARDINGKEY`` property (``msg`` itself is not
          changed) and goes to ``SelectMessageQueueByHash()(mqs, msg, sharding_key)`` (no retry elsewhere). An
          orderly consumer with ``order_scope="key"`` consumes each sharding key in order, different keys of one
          queue in parallel.

        ``timeout_ms`` defaults to ``send_msg_timeout``. Raises InvalidMessageError subclasses, NoRouteError,
        SelectorError, MQBrokerError (a non-retryable broker answer), SendFailedError (all attempts of a
        round-robin send failed) or, for a selected queue, the RemotingError of its one attempt.
        """
        client = self._client()
        validate_message(msg, self.config.max_message_size)
        timeout = self.config.send_msg_timeout if timeout_ms is None else timeout_ms
        if selector is not None and message_queue is not None:
            raise MQClientError("pass either selector or message_queue, not both")
        if sharding_key is not None:
            if selector is not None or message_queue is not None:
                raise MQClientError("sharding_key picks the queue: pass it without selector or message_queue")
            msg = with_sharding_key(msg, sharding_key)
            validate_message(msg, self.config.max_message_size)
            selector, arg = _BY_HASH, sharding_key
        if selector is not None or message_queue is not None:
            start = trio.current_time()
            info = await self._publish_info_within(client, msg.topic, timeout)
            if message_queue is not None:
                mq = message_queue
            else:
                assert selector is not None
                mq = self._select(info, selector, msg, arg)
            if message_queue is not None and mq.topic != msg.topic:
                raise MQClientError(f"message queue {mq} is not a queue of topic {msg.topic!r}")
            remaining = timeout - int((trio.current_time() - start) * 1000)
            if remaining <= 0:  # (RocketMQ's sendSelectImpl: "call timeout")
                raise RemotingTimeoutError(f"send timed out after {timeout} ms finding the route of {msg.topic!r}")
            return await self._send_kernel(client, msg, mq, remaining, self._uniq_id_of(msg))
        # One unique key per send, kept by every retry (RocketMQ's setUniqID before sendKernelImpl): a message
        # stored twice because an answer was lost then shows one id twice, which consumers and the audit can tell.
        uniq = self._uniq_id_of(msg)
        return await self._send_with_retries(
            client, msg.topic, lambda mq, t: self._send_kernel(client, msg, mq, t, uniq), timeout)

    async def send_batch(
        self,
        msgs: Sequence[Message],
        timeout_ms: int | None = None,
        *,
        message_queue: MessageQueue | None = None,
    ) -> SendResult:
        """Send several messages of one topic to one queue in one request.

        Batches may not use delay levels or retry topics (as in RocketMQ). ``msg_id`` of the result holds
        the unique keys joined by commas; ``queue_offset`` is the offset of the first message.
        """
        client = self._client()
        msgs, entries, ids = self._prepare_batch(msgs)
        timeout = self.config.send_msg_timeout if timeout_ms is None else timeout_ms
        if message_queue is not None:
            return await self._send_batch_kernel(client, entries, ids, message_queue, timeout)
        return await self._send_with_retries(
            client, msgs[0].topic, lambda mq, t: self._send_batch_kernel(client, entries, ids, mq, t), timeout
        )

    async def send_batches(
        self,
        batches: Sequence[tuple[Sequence[Message], MessageQueue]],
        timeout_ms: int | None = None,
    ) -> list[SendResult]:
        """Send several batches, each to its queue, pipelined: every request goes out at once (per broker, in
        one write) and the call returns when all are answered, results in the order given.

        Each batch is checked as :meth:`send_batch` checks it, before anything is sent. Batches to one queue
        are stored in the order given. Nothing is retried elsewhere (the queues are chosen by the caller). If a
        batch fails, the others still complete, then the first failure is raised (MQBrokerError for an error
        answer, RemotingError when no answer came) — so a caller that keeps per-key order must treat the whole
        call as failed. Use it to send one window of an ordered stream split by queue in one round trip.
        """
        client = self._client()
        timeout = self.config.send_msg_timeout if timeout_ms is None else timeout_ms
        prepared = []
        for msgs, mq in batches:
            _, entries, ids = self._prepare_batch(msgs)
            if mq.topic != msgs[0].topic:
                raise MQClientError(f"message queue {mq} is not a queue of topic {msgs[0].topic!r}")
            prepared.append((mq, entries, ids))
        by_addr: dict[str, list[int]] = {}
        for i, (mq, _, _) in enumerate(prepared):
            by_addr.setdefault(await self._broker_addr(client, mq), []).append(i)
        results: list[SendResult | Exception | None] = [None] * len(prepared)
        born = int(time.time() * 1000)

        async def one_broker(addr: str, idx: list[int]) -> None:
            brokers = {prepared[i][0].broker_name for i in idx}
            name = next(iter(brokers)) if len(brokers) == 1 else ""
            got = await client.api.send_batches(
                addr, name, [(prepared[i][0].topic, prepared[i][0].queue_id, prepared[i][1], prepared[i][2])
                             for i in idx],
                producer_group=self.config.producer_group, born_timestamp=born, timeout_ms=timeout)
            for i, r in zip(idx, got, strict=True):
                if isinstance(r, SendResult) and r.message_queue.broker_name != prepared[i][0].broker_name:
                    r = SendResult(r.status, r.msg_id, prepared[i][0], r.queue_offset, r.offset_msg_id)
                results[i] = r

        if len(by_addr) == 1:
            ((addr, idx),) = by_addr.items()
            await one_broker(addr, idx)
        else:
            async with trio.open_nursery() as nursery:
                for addr, idx in by_addr.items():
                    nursery.start_soon(one_broker, addr, idx)
        for r in results:
            if isinstance(r, Exception):
                raise r
        return [r for r in results if isinstance(r, SendResult)]

    def _prepare_batch(self, msgs: Sequence[Message]) -> tuple[list[Message], list[dict[str, Any]], list[str]]:
        """send_batch's checks, then the wire entries and unique ids of the batch."""
        msgs = list(msgs)
        if not msgs:
            raise InvalidMessageError("a batch needs at least one message")
        first = msgs[0]
        if not isinstance(first, Message):
            raise InvalidMessageError(f"expected a protocol.message.Message, got {type(first).__name__}")
        topic = first.topic
        _check_topic_for_send(topic)  # one topic per batch: checked once
        if is_retry_topic(topic):
            raise InvalidMessageError("retry topics are not supported in batches")
        max_size = self.config.max_message_size
        total = 0
        props_list: list[dict[str, str]] = []
        for m in msgs:
            if type(m) is not Message and not isinstance(m, Message):
                raise InvalidMessageError(f"expected a protocol.message.Message, got {type(m).__name__}")
            if m.topic != topic:
                _check_topic_for_send(m.topic)
            props_list.append(_validated_properties(m, max_size))
            if m.topic != topic:
                raise InvalidMessageError(f"all messages of a batch must have one topic: {topic!r} and {m.topic!r}")
            if m.delay_time_level > 0:
                raise InvalidMessageError("delay levels are not supported in batches")
            total += len(m.body)
        if total > max_size:
            raise MessageTooLargeError(total, max_size)
        entries, ids = self._batch_entries(msgs, props_list)
        return msgs, entries, ids

    async def message_queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic`` (what a selector chooses from)."""
        return list((await self._publish_info(self._client(), topic)).selectable_queues())

    # --- internals ----------------------------------------------------------------------------------

    async def _publish_info_within(self, client: ClientInstance, topic: str, timeout_ms: int) -> TopicPublishInfo:
        """``_publish_info`` within a send's timeout: a name server that does not answer (a paused process, an
        address that drops packets) would otherwise hold the send for up to three route requests of 3 s each."""
        info = client.topic_publish_info_table.get(topic)
        if info is not None and info.ok():
            return info  # known: no name server is asked, and a send does not pay for a deadline scope (~6 µs)
        with trio.move_on_after(timeout_ms / 1000):
            return await self._publish_info(client, topic)
        raise NoRouteError(topic, f"no name server ({';'.join(client.config.namesrv_addrs)}) answered within the "
                                  f"send's timeout of {timeout_ms} ms")

    async def _publish_info(self, client: ClientInstance, topic: str) -> TopicPublishInfo:
        if not client.config.namesrv_addrs:
            raise NoRouteError(topic, "no name server address configured (namesrv_addr)")
        cfg = self.config
        info = await client.get_publish_info(
            topic, create_topic_key=cfg.create_topic_key, default_queue_nums=cfg.default_topic_queue_nums
        )
        if info is None:
            route = client.topic_route_table.get(topic)
            if route is not None and route.broker_datas:  # HA (issue 15): its brokers are listed, their masters not
                down = ", ".join(sorted(bd.broker_name for bd in route.broker_datas if not bd.master_addr))
                raise NoRouteError(topic, f"no broker of it has a master now (down: {down}; their slaves serve reads "
                                          "but not sends)")
            failed = client.route_fetch_errors.get(topic)
            if failed is not None:  # not "unknown": no name server answered the question
                raise NoRouteError(topic, f"its route could not be fetched from the name server "
                                          f"({';'.join(client.config.namesrv_addrs)}): {failed}")
            raise NoRouteError(topic, "the name server does not know it and it cannot be auto-created")
        return info

    @staticmethod
    def _select(info: TopicPublishInfo, selector: MessageQueueSelector, msg: Message, arg: Any) -> MessageQueue:
        mqs = info.selectable_queues()  # a broker whose master is down keeps its queues: no key moves (issue 15)
        try:
            mq = selector(mqs, msg, arg)
        except Exception as exc:
            raise SelectorError(f"the message queue selector raised {type(exc).__name__}: {exc}") from exc
        if mq is None:
            raise SelectorError("the message queue selector returned None")
        if mq not in mqs:
            raise SelectorError(f"the message queue selector returned {mq!r}, which is not one of the topic's queues")
        return mq

    async def _send_with_retries(self, client: ClientInstance, topic: str, attempt: Any, timeout: int) -> SendResult:
        start = trio.current_time()  # the route's lookup counts too (RocketMQ's beginTimestampFirst)
        info = await self._publish_info_within(client, topic, timeout)
        times_total = 1 + self.config.retry_times_when_send_failed
        last_broker: str | None = None
        attempts: list[tuple[object, BaseException]] = []
        result: SendResult | None = None
        fault = self.fault_strategy
        for times in range(times_total):
            mq = fault.select_one_message_queue(info, last_broker, _mono_ms())
            last_broker = mq.broker_name
            remaining = timeout - int((trio.current_time() - start) * 1000)
            if remaining <= 0:
                attempts.append((mq, TimeoutError(f"send timed out after {timeout} ms")))
                break
            began = _mono_ms()
            try:
                result = await attempt(mq, remaining)
            except (RemotingError, MQClientError) as exc:
                fault.update_fault_item(mq.broker_name, _mono_ms() - began, True, _mono_ms())
                addr = client.find_broker_address_in_publish(mq.broker_name)
                if isinstance(exc, RemotingError) and addr is not None:
                    client.note_failure(addr, exc)  # routes refreshed now, the address avoided (issue 15)
                attempts.append((mq, exc))
                log.info("send.retry", topic=topic, mq=str(mq), attempt=times + 1, error=str(exc))
                continue
            except MQBrokerError as exc:
                fault.update_fault_item(mq.broker_name, _mono_ms() - began, True, _mono_ms())
                if exc.code in RETRY_RESPONSE_CODES:
                    attempts.append((mq, exc))
                    log.info("send.retry", topic=topic, mq=str(mq), attempt=times + 1, error=str(exc))
                    continue
                raise
            fault.update_fault_item(mq.broker_name, _mono_ms() - began, False, _mono_ms())
            if result.status is not SendStatus.SEND_OK and self.config.retry_another_broker_when_not_store_ok:
                attempts.append((mq, MQClientError(f"broker answered {result.status.value}")))
                continue
            return result
        if result is not None:
            return result  # stored, only the flush/slave guarantee is missing
        cost = int((trio.current_time() - start) * 1000)
        last = attempts[-1][1] if attempts else None
        err = SendFailedError(
            f"sending to topic {topic!r} failed after {len(attempts)} attempt(s) in {cost} ms"
            + (f"; last error: {last}" if last else ""),
            attempts,
        )
        raise err from last

    async def _broker_addr(self, client: ClientInstance, mq: MessageQueue) -> str:
        addr = await client.find_broker_addr(mq.broker_name, mq.topic)
        if addr is None:
            if client.broker_addr_table.get(mq.broker_name):
                raise BrokerNotAvailableError(mq.broker_name, "its master is down (the route lists only its slave "
                                              "until it returns or a slave is promoted)")
            raise BrokerNotFoundError(mq.broker_name)
        if not client.is_reachable(addr):
            raise BrokerNotAvailableError(mq.broker_name, f"its master {addr} could not be reached a moment ago")
        return addr

    def _uniq_id_of(self, msg: Message) -> str:
        """The message's own UNIQ_KEY, or a new one."""
        assert self._uniq is not None
        return msg.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self._uniq.next_id()

    async def _send_kernel(self, client: ClientInstance, msg: Message, mq: MessageQueue, timeout: int,
                           uniq: str) -> SendResult:
        addr = await self._broker_addr(client, mq)
        props = msg.all_properties()
        props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        reconsume_times = max_reconsume = None
        if is_retry_topic(msg.topic):
            # RocketMQ moves these two properties into the request header for retry-topic sends.
            rt = props.pop(MessageConst.RECONSUME_TIME, None)
            mr = props.pop(MessageConst.MAX_RECONSUME_TIMES, None)
            reconsume_times = int(rt) if rt and rt.lstrip("-").isdigit() else None
            max_reconsume = int(mr) if mr and mr.lstrip("-").isdigit() else None
        return await client.api.send_message(
            addr,
            mq.broker_name,
            producer_group=self.config.producer_group,
            topic=msg.topic,
            queue_id=mq.queue_id,
            body=bytes(msg.body),
            properties=encode_properties(props),
            born_timestamp=int(time.time() * 1000),
            flag=msg.flag,
            reconsume_times=reconsume_times,
            max_reconsume_times=max_reconsume,
            uniq_id=uniq,
            timeout_ms=timeout,
        )

    def _batch_entries(self, msgs: list[Message], props_list: list[dict[str, str]]
                       ) -> tuple[list[dict[str, Any]], list[str]]:
        """The wire entries of a batch (UNIQ_KEY added where missing, properties encoded once) and the ids."""
        assert self._uniq is not None
        fresh = iter(self._uniq.next_ids(len(msgs)))
        key = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        entries: list[dict[str, Any]] = []
        ids: list[str] = []
        for m, props in zip(msgs, props_list, strict=True):
            body = m.body if type(m.body) is bytes else bytes(m.body)
            if not props:  # the common case: only the unique key
                uniq = next(fresh)
                encoded = f"{key}\x01{uniq}\x02"
            else:
                uniq = props.get(key) or next(fresh)
                props[key] = uniq
                encoded = encode_properties(props)
            ids.append(uniq)
            entries.append({"body": body, "properties": encoded, "flag": m.flag})
        return entries, ids

    async def _send_batch_kernel(
        self, client: ClientInstance, entries: list[dict[str, Any]], ids: list[str], mq: MessageQueue, timeout: int
    ) -> SendResult:
        addr = await self._broker_addr(client, mq)
        return await client.api.send_batch(
            addr,
            mq.broker_name,
            producer_group=self.config.producer_group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            messages=entries,
            born_timestamp=int(time.time() * 1000),
            uniq_ids=ids,
            timeout_ms=timeout,
        )
