"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (RocketMQ's SendMessageProcessor).

Checks, in RocketMQ's order: the topic name (SYSTEM_ERROR, RocketMQ's TopicValidator code), topics clients
may not send to (NO_PERMISSION), message and property sizes (MESSAGE_ILLEGAL), the topic config
(auto-created with ``default_topic_queue_nums`` queues when enabled, else TOPIC_NOT_EXIST), the queue id
(SYSTEM_ERROR "request queueId[..] is illegal"; a negative id picks a random queue, as RocketMQ does). Only
then is anything stored, so a rejected request leaves the store as it was. The born host is the
connection's peer address; the store host is the broker's address.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from trimq.broker.config import BrokerConfig
from trimq.broker.deps import HandlerRegistry, ProducerWriter, SubscriptionGroups, Topics
from trimq.broker.processors.retry import handle_retry_and_dlq
from trimq.broker.services import HandlerService
from trimq.broker.store.store_base import PutMessageStatus, PutResult
from trimq.broker.store.topics import TopicConfig
from trimq.protocol.address import parse_address
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import int_field, str_field
from trimq.protocol.message import MAX_PROPERTIES_BYTES
from trimq.protocol.validation import SCHEDULE_TOPIC, InvalidNameError, check_topic

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

__all__ = ["SendService", "born_host_of"]

#: Topics producers may not send to (RocketMQ's TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET, trimq's subset).
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC})

_STATUS_CODE = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.OS_PAGECACHE_BUSY: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
}
#: Statuses of a message that is stored (RocketMQ's SendResult: SEND_OK, FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
#: SLAVE_NOT_AVAILABLE): the answer carries its id and offset whatever the code.
_STORED = frozenset({PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT, PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
                     PutMessageStatus.SLAVE_NOT_AVAILABLE})


def born_host_of(conn: Connection) -> tuple[str, int]:
    """The peer address of ``conn`` as ``(ip, port)`` (cached on the connection)."""
    host = conn.attributes.get("_born_host")
    if host is None:
        try:
            host = parse_address(conn.remote)
        except ValueError:
            host = ("0.0.0.0", 0)
        conn.attributes["_born_host"] = host
    return host  # type: ignore[no-any-return]


class SendService(HandlerService):
    """The send handlers: messages into ``store``, topics checked (and auto-created) in ``topics``, the
    %RETRY% rule (handle_retry_and_dlq) through the consumer ``groups``."""

    name = "send"

    def __init__(self, *, config: BrokerConfig, registry: HandlerRegistry, store: ProducerWriter, topics: Topics,
                 groups: SubscriptionGroups) -> None:
        self.store = store
        self.topics = topics
        self.groups = groups
        self.max_message_size = config.max_message_size
        self._valid_topics: set[str] = set()  # names already checked (the regex costs more than the lookup)
        #: topic -> [messages, record bytes] stored by sends, read by broker/metrics.py at scrape time.
        self.put_stats: dict[str, list[int]] = {}
        # Under ASYNC_FLUSH a send never waits (the append has no await but the rare segment creation), so it
        # runs in the connection's reading task: no task per request. A SYNC_FLUSH send waits for its fsync.
        # A SYNC_MASTER send waits for its slave (so does a slave's, which may be promoted to one): not inline.
        inline = not config.sync_flush and config.broker_role == "ASYNC_MASTER"
        registry.register(RequestCode.SEND_MESSAGE, self.send_message, inline=inline)
        registry.register(RequestCode.SEND_MESSAGE_V2, self.send_message, inline=inline)
        registry.register(RequestCode.SEND_BATCH_MESSAGE, self.send_batch_message, inline=inline)

    # ------------------------------------------------------------------------------------------------
    def _check(self, ext: dict[str, Any], conn: Connection, sizes: list[tuple[int, int]]) -> tuple[TopicConfig, int]:
        """RocketMQ's msgCheck; returns the topic config and the queue id to use."""
        raw = ext.get("topic")
        if not isinstance(raw, str) or raw not in self._valid_topics:
            try:
                check_topic(raw)
            except InvalidNameError as exc:
                raise RequestError(ResponseCode.SYSTEM_ERROR, f"the specified topic is invalid: {exc}") from None
        topic: str = raw  # type: ignore[assignment]  # check_topic accepted it: a valid str
        if len(self._valid_topics) < 100_000:
            self._valid_topics.add(topic)
        if topic in NOT_ALLOWED_SEND_TOPICS:
            raise RequestError(ResponseCode.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden")
        for body_len, props_len in sizes:
            if props_len > MAX_PROPERTIES_BYTES:
                raise RequestError(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"message properties are {props_len} bytes; the maximum is {MAX_PROPERTIES_BYTES}",
                )
            if body_len > self.max_message_size:
                raise RequestError(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"message body is {body_len} bytes; the maximum is {self.max_message_size}",
                )
        queue_id = int_field(ext, "queueId", bits=32)
        cfg = self.topics.get(topic)
        if cfg is None:
            cfg = self.topics.auto_create_topic(topic)
            if cfg is None:
                raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg.writable:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        valid = max(cfg.write_queue_nums, cfg.read_queue_nums)
        if queue_id >= valid:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic[{topic}] has {valid} queues, Producer: {conn.remote}",
            )
        if queue_id < 0:
            queue_id = random.randrange(max(1, cfg.write_queue_nums))
        return cfg, queue_id

    def _count(self, topic: str, res: PutResult) -> None:
        """Count stored messages per topic for the metrics: a dict update per request, no label lookup."""
        if res.status in _STORED:
            st = self.put_stats.get(topic)
            if st is None:
                st = self.put_stats[topic] = [0, 0]
            st[0] += len(res.msg_ids) or 1
            st[1] += res.wrote_bytes

    def _response(self, cmd: RemotingCommand, res: PutResult, msg_id: str, queue_id: int) -> RemotingCommand:
        """The send answer. ``queue_id`` is the queue the request resolved to (RocketMQ's ``queueIdInt``), not
        where the record went: a delayed message is stored in SCHEDULE_TOPIC_XXXX queue ``level - 1`` and an
        exhausted retry in ``%DLQ%group`` queue 0, yet the producer is told the queue it asked for (its
        SendResult's message queue). ``queueOffset`` is the stored record's, as RocketMQ answers it."""
        code = _STATUS_CODE.get(res.status, ResponseCode.SYSTEM_ERROR)
        if res.status in _STORED:
            ext = {"msgId": msg_id, "queueId": queue_id, "queueOffset": res.queue_offset}
            return RemotingCommand.response_to(cmd, code, res.remark or None, ext)
        return RemotingCommand.response_to(cmd, code, f"{res.status.value}: {res.remark}")

    async def send_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ext = cmd.ext
        body = cmd.body
        if not isinstance(body, bytes):
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "the message body is missing (it must be bin)")
        props = str_field(ext, "properties", "")
        cfg, queue_id = self._check(ext, conn, [(len(body), len(props))])
        topic = cfg.topic_name
        requested_queue_id = queue_id  # answered whatever the store does with the message (_response)
        if topic.startswith("%RETRY%"):
            # Issue 5: RocketMQ's handleRetryAndDLQ (exhausted retries go to %DLQ%group at once).
            max_rt = None if ext.get("maxReconsumeTimes") is None else int_field(ext, "maxReconsumeTimes", bits=32)
            topic, queue_id, props = await handle_retry_and_dlq(
                self.groups, self.topics, topic, queue_id, props, int_field(ext, "reconsumeTimes", 0, bits=32),
                max_rt)
        res = await self.store.put_message(
            topic, queue_id, body, props,
            flag=int_field(ext, "flag", 0, bits=32), sys_flag=int_field(ext, "sysFlag", 0, bits=32),
            born_timestamp=int_field(ext, "bornTimestamp", 0), born_host=born_host_of(conn),
            reconsume_times=int_field(ext, "reconsumeTimes", 0, bits=32),
        )
        res = await self.store.handle_ha(res)  # SYNC_MASTER: answered once a slave has it (issue 15)
        self._count(cfg.topic_name, res)
        return self._response(cmd, res, res.msg_id, requested_queue_id)

    async def send_batch_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ext = cmd.ext
        items = cmd.body
        if not isinstance(items, list) or not items:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "a batch body must be a non-empty array of messages")
        messages: list[tuple[bytes, str, int]] = []
        append = messages.append
        max_body = max_props = 0
        try:
            for item in items:  # the well-formed case, cheaply; anything else is explained below
                body = item["body"]
                props = item.get("properties", "")
                flag = item.get("flag", 0)
                if type(body) is not bytes or type(props) is not str or type(flag) is not int or not (
                        -2147483648 <= flag <= 2147483647):
                    raise TypeError
                append((body, props, flag))
                if len(body) > max_body:
                    max_body = len(body)
                if len(props) > max_props:
                    max_props = len(props)
        except (TypeError, KeyError, AttributeError):
            _explain_bad_batch(items)
            raise
        sizes = [(max_body, max_props)]
        cfg, queue_id = self._check(ext, conn, sizes)
        res = await self.store.put_messages(
            cfg.topic_name, queue_id, messages, sys_flag=int_field(ext, "sysFlag", 0, bits=32),
            born_timestamp=int_field(ext, "bornTimestamp", 0), born_host=born_host_of(conn),
            reconsume_times=int_field(ext, "reconsumeTimes", 0, bits=32),
        )
        res = await self.store.handle_ha(res)
        self._count(cfg.topic_name, res)
        return self._response(cmd, res, ",".join(res.msg_ids), queue_id)


def _explain_bad_batch(items: list[Any]) -> None:
    """Raise the RequestError naming the first malformed message of a batch."""
    for i, item in enumerate(items):
        try:
            body = item["body"]
            props = item.get("properties", "")
            flag = item.get("flag", 0)
        except (TypeError, KeyError, AttributeError):
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL,
                               f"batch message {i} is not a map with a 'body'") from None
        if type(flag) is int and not -(2**31) <= flag < 2**31:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"batch message {i}: flag {flag} is outside int32")
        if type(body) is not bytes or type(props) is not str or type(flag) is not int:
            what = ("body must be bin" if type(body) is not bytes else
                    "properties must be a string" if type(props) is not str else "flag must be an integer")
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"batch message {i}: {what}")
