"""``async for msg in consumer.messages()``: a push consumer's messages as an async iterator, each settled with
an ack context (like aio-pika's ``message.process()``).

::

    stream = consumer.messages()                 # before starting: the stream is the consumer's listener
    async with consumer:
        async for msg in stream:
            async with msg.process():            # leaves normally: consumed; raises: retried (and re-raised)
                await handle(msg.body)

How it maps onto RocketMQ's push consumer: the stream is the consumer's listener. Each listener call puts its
messages in the stream and waits until every one of them is settled; the call then returns SUCCESS, or, for a
message settled with :meth:`ReceivedMessage.nack` (an exception in ``process()``), RECONSUME_LATER (concurrently:
the messages from the first failed one on are retried through ``%RETRY%<group>``; those before it are
committed) or SUSPEND_CURRENT_QUEUE_A_MOMENT (orderly: the batch is retried in place). So an offset is
committed only after your code processed its message: at-least-once, as with a listener.

Messages are handed out as the consume service delivers them: concurrently up to ``consume_thread_max``
listener calls (so that many batches may wait in the stream), orderly one batch per queue at a time. A concurrent
stream does not keep queue order (its calls race, as in RocketMQ's concurrent mode): use
``messages(orderly=True)`` for that. Processing them one by one in the ``async for`` body is sequential; start
tasks to process several at once.

The stream works in trio tasks and in asyncio (consumers entered from asyncio, trimq.client.aio). When the
consumer shuts down the iteration ends; messages never handed out are not committed (the next owner of their
queue gets them), and an ack arriving after the consumer gave up on its call is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

import trio

from trimq.client.aio import in_trio
from trimq.client.consume.common import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
)
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue

__all__ = ["MessageStream", "ReceivedMessage"]

_PENDING, _ACKED, _NACKED, _EXPIRED = "pending", "acked", "nacked", "expired"


class _Batch:
    """The messages of one listener call and the event set when all of them are settled."""

    __slots__ = ("done", "on_done", "outcomes", "unsettled")

    def __init__(self, size: int, on_done: Callable[[], None]) -> None:
        self.outcomes = [_PENDING] * size
        self.unsettled = size
        self.done = trio.Event()
        self.on_done = on_done

    def settle(self, index: int, outcome: str) -> bool:
        if self.outcomes[index] != _PENDING:
            return False
        self.outcomes[index] = outcome
        self.unsettled -= 1
        if self.unsettled == 0:
            self.done.set()  # from trio, or from asyncio code in the host thread of a guest run (allowed)
            self.on_done()
        return True

    def expire(self) -> None:
        for i, o in enumerate(self.outcomes):
            if o == _PENDING:
                self.outcomes[i] = _EXPIRED


class ReceivedMessage:
    """One message handed out by :class:`MessageStream`; settle it once, with :meth:`process` (usual),
    :meth:`ack` or :meth:`nack`. The message itself is :attr:`message`; the common fields are mirrored here."""

    __slots__ = ("_batch", "_index", "context", "message")

    def __init__(self, message: MessageExt, context: ConsumeOrderlyContext | ConsumeConcurrentlyContext,
                 batch: _Batch, index: int) -> None:
        self.message = message
        """The message as received (:class:`~trimq.protocol.message.MessageExt`)."""
        self.context = context
        """The listener context of its batch (orderly: ``lock_epoch`` is the queue lock's fencing token)."""
        self._batch = batch
        self._index = index

    # --- the message ------------------------------------------------------------------------------------

    @property
    def body(self) -> bytes:
        """The message body."""
        return self.message.body

    @property
    def topic(self) -> str:
        """The topic it was sent to (a retried message's original topic)."""
        return self.message.topic

    @property
    def tags(self) -> str | None:
        """Its tag, if any."""
        return self.message.tags

    @property
    def keys(self) -> str | None:
        """Its KEYS property (keys separated by spaces), if any."""
        return self.message.keys

    @property
    def sharding_key(self) -> str | None:
        """The producer's ``sharding_key`` (the ``__SHARDINGKEY`` property), if it sent one."""
        return self.message.properties.get(MessageConst.SHARDING_KEY)

    @property
    def msg_id(self) -> str:
        """The message id as RocketMQ's consumers see it: the producer's unique key (UNIQ_KEY) when it set one,
        else the store's message id (``message.msg_id``)."""
        return self.message.unique_id

    @property
    def message_queue(self) -> MessageQueue:
        """The queue it was consumed from."""
        return self.context.message_queue

    @property
    def queue_offset(self) -> int:
        """Its offset in :attr:`message_queue`."""
        return self.message.queue_offset

    @property
    def reconsume_times(self) -> int:
        """How many times it was delivered before (0 on the first delivery)."""
        return self.message.reconsume_times

    @property
    def properties(self) -> dict[str, str]:
        """All its properties (user properties and RocketMQ's)."""
        return self.message.properties

    def __repr__(self) -> str:
        return (f"ReceivedMessage(topic={self.topic!r}, queue_offset={self.queue_offset}, msg_id={self.msg_id!r}, "
                f"state={self.state!r})")

    # --- settling ---------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``pending``, ``acked``, ``nacked``, or ``expired`` (the consumer gave up its call: shutdown)."""
        return self._batch.outcomes[self._index]

    @property
    def processed(self) -> bool:
        """Settled (acked or nacked) or expired."""
        return self.state != _PENDING

    def ack(self) -> bool:
        """Consumed: its offset may be committed. Returns False if it was settled already (the first wins)."""
        return self._batch.settle(self._index, _ACKED)

    def nack(self) -> bool:
        """Failed: deliver it again later (concurrently: through the retry topic; orderly: in place, after
        ``suspend_current_queue_time_millis``). Returns False if it was settled already."""
        return self._batch.settle(self._index, _NACKED)

    def process(self) -> _Processing:
        """``async with msg.process():`` acks when the block ends normally; nacks when it raises, and lets the
        exception propagate (as aio-pika does: catch it around the block to keep iterating). A message settled
        inside the block stays as settled."""
        return _Processing(self)


class _Processing:
    """The ack context of :meth:`ReceivedMessage.process`; awaits nothing, so it works under trio and asyncio."""

    __slots__ = ("_msg",)

    def __init__(self, msg: ReceivedMessage) -> None:
        self._msg = msg

    async def __aenter__(self) -> ReceivedMessage:
        return self._msg

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            self._msg.ack()
        else:
            self._msg.nack()


class MessageStream:
    """The listener behind :meth:`PushConsumer.messages() <trimq.client.push_consumer.PushConsumer.messages>`
    and the async iterator over its messages (module documentation)."""

    __trimq_trio_native__ = True  # the listener side is trio code, also when the consumer runs under asyncio

    def __init__(self, *, orderly: bool = False) -> None:
        self.orderly = orderly
        self._queue: deque[ReceivedMessage] = deque()
        self._waiters: list[Callable[[], None]] = []
        self._closed = False
        self._returning = 0
        """Listener calls whose messages are all settled but which have not returned yet."""

    # --- the listener side (trio) -------------------------------------------------------------------------

    async def __call__(self, msgs: list[MessageExt],
                       context: ConsumeOrderlyContext | ConsumeConcurrentlyContext) -> Any:
        batch = _Batch(len(msgs), self._batch_done)
        if self._closed:
            return self._status(batch, context)
        received = [ReceivedMessage(m, context, batch, i) for i, m in enumerate(msgs)]
        self._queue.extend(received)
        self._wake()
        try:
            await batch.done.wait()
        finally:
            if batch.done.is_set():
                self._returning -= 1
            if batch.unsettled:  # cancelled (a sealed shutdown): whatever is left is not ours to commit
                batch.expire()
                for r in received:
                    with contextlib.suppress(ValueError):
                        self._queue.remove(r)
        return self._status(batch, context)

    def _status(self, batch: _Batch, context: Any) -> Any:
        failed = next((i for i, o in enumerate(batch.outcomes) if o != _ACKED), None)
        if self.orderly:
            if failed is None:
                return ConsumeOrderlyStatus.SUCCESS
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if failed is None:
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        if failed == 0:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        context.ack_index = failed - 1  # the ones before the first failure are consumed
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def _batch_done(self) -> None:
        self._returning += 1

    async def returned(self, timeout_s: float = 1.0) -> None:
        """Wait (up to ``timeout_s``) until every listener call whose messages are all settled has returned: a
        shutdown calls it so that acks given before it are committed rather than dropped by the seal."""
        with trio.move_on_after(timeout_s):
            while self._returning:
                await trio.sleep(0)

    def close(self) -> None:
        """End the iteration (the consumer is shutting down): messages not handed out yet are given up (their
        listener calls return a failure, which a shutdown neither commits nor sends back)."""
        self._closed = True
        while self._queue:
            self._queue.popleft().nack()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()

    # --- the iterator side (trio or asyncio) ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The consumer shut down: the iteration has ended (or will, once the waiting messages are handed out)."""
        return self._closed

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> ReceivedMessage:
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._closed:
                raise StopAsyncIteration
            await self._wait()

    async def _wait(self) -> None:
        if in_trio():
            event = trio.Event()
            self._waiters.append(event.set)
            await event.wait()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        self._waiters.append(wake)
        try:
            await fut
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(wake)

    def __len__(self) -> int:
        """Messages waiting to be handed out."""
        return len(self._queue)
