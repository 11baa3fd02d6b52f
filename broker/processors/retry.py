"""Retries and dead letters: CONSUMER_SEND_MSG_BACK, the %RETRY% send rule, and the DLQ admin requests.

CONSUMER_SEND_MSG_BACK follows RocketMQ 4.9.3's ``asyncConsumerSendMsgBack`` step by step
(ROCKETMQ_FACTS.md §6), with one deliberate difference (DESIGN.md §6.6): a copy bound for ``%DLQ%<group>``
never carries a ``DELAY`` property, so the last failure is a dead letter at once, not after one more delay.
One trimq extension: an optional ``reconsumeTimes`` header asks for the copy a client's own sendMessageBack
would produce (RocketMQ's orderly dead letter: that count, ORIGIN_MESSAGE_ID = the unique key), so an orderly
consumer's dead letter is the same whether this request or its producer fallback stored it
(:func:`build_send_back_properties`).

Unknown groups: like RocketMQ 4.9.3, the group's config is looked up with auto-creation, so with
``auto_create_subscription_group`` on (the default, as in RocketMQ) an unknown group gets the default config
(1 retry queue, 16 retries) and the request proceeds; with it off the answer is SUBSCRIPTION_GROUP_NOT_EXIST.

The admin requests are trimq's: QUERY_DLQ_MESSAGES lists a group's dead letters, RESEND_DLQ_MESSAGES puts one
(or all not yet resent) back into the original topic. Which queue a resent message goes to, in order:
the queue of the original message (found through ORIGIN_MESSAGE_ID: the offset message id of a message of
that topic, as the broker's rule sets it, or a unique key, as the client's rule and orderly dead letters set
it, looked up in the message index — the first message of the topic stored with that UNIQ_KEY), else REAL_QID
when REAL_TOPIC is the original topic, else queue 0 — always modulo
the topic's current write queue count. The original queue keeps a key's messages together for orderly
consumers; the fallbacks are deterministic so a retried resend lands where the first one did. Resent
messages start with reconsume times 0 (a fresh set of retries) and carry ``TRIMQ_DLQ_MSG_ID``. What was
resent is tracked per group in ``config/dlqResend.json`` (an offset below which every dead letter was
resent, plus the offsets resent one by one above it), so "resend all" twice resends nothing the second time.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import trio

from trimq.broker.config import BrokerConfig
from trimq.broker.deps import DeadLetterStore, HandlerRegistry, SubscriptionGroups, Topics
from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic
from trimq.broker.store.index_dispatch import QueryMessageResult
from trimq.broker.store.schedule import SCHEDULE_OFFSET_PROPERTY, read_units
from trimq.broker.store.subscription_groups import SubscriptionGroupConfig
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.message import MessageConst, MessageExt, decode_properties, encode_properties, get_property
from trimq.protocol.record import parse_message_id
from trimq.protocol.validation import (
    RETRY_GROUP_TOPIC_PREFIX,
    InvalidNameError,
    check_group,
    dlq_topic,
    is_retry_topic,
    retry_topic,
)
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

__all__ = [
    "DLQ_MSG_ID_PROPERTY",
    "DLQ_NUMS_PER_GROUP",
    "RESEND_FILE_NAME",
    "DlqResendTracker",
    "RetryService",
    "build_send_back_properties",
    "handle_retry_and_dlq",
]

log = get_logger("trimq.broker.retry")

#: RocketMQ's AbstractSendMessageProcessor.DLQ_NUMS_PER_GROUP.
DLQ_NUMS_PER_GROUP = 1
PERM_READ = 4
PERM_WRITE = 2
PERM_READ_WRITE = PERM_READ | PERM_WRITE

#: On a message resent from the DLQ: the dead letter's message id (lineage for audits and people).
DLQ_MSG_ID_PROPERTY = "TRIMQ_DLQ_MSG_ID"
RESEND_FILE_NAME = "dlqResend.json"

DEFAULT_QUERY_MAX_NUMS = 32
MAX_QUERY_MAX_NUMS = 1024
_RESEND_BATCH = 32

_MAX_INT32 = 2**31 - 1

PropertiesT = TypeVar("PropertiesT", dict[str, str], str)


# -- header fields ---------------------------------------------------------------------------------------

def _field(ext: dict[str, Any], name: str, kind: type, *, required: bool = False, default: Any = None) -> Any:
    """A typed header field; SYSTEM_ERROR naming the field when it is missing or of the wrong type.

    Integers may arrive as decimal strings (RocketMQ's headers are strings), booleans as "true"/"false".
    """
    value = ext.get(name)
    if value is None:
        if required:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field '{name}' is required")
        return default
    if kind is int:
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field '{name}' must be an integer, got {value!r}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field '{name}' must be true or false, got {value!r}")
    if not isinstance(value, str):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field '{name}' must be a string, got {value!r}")
    return value


def _group_field(ext: dict[str, Any], name: str) -> str:
    group = _field(ext, name, str, required=True)
    try:
        return check_group(group)
    except InvalidNameError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field '{name}': {exc}") from None


def _status_name(result: Any) -> str:
    status = getattr(result, "status", result)
    return str(getattr(status, "name", status))


# -- the pure rule of a send-back copy -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SendBackTarget:
    """Where a send-back copy goes and with which properties."""

    topic: str
    queue_id: int
    properties: dict[str, str]
    reconsume_times: int
    dead_letter: bool
    delay_level: int


def build_send_back_properties(msg: MessageExt, group: str, *, delay_level: int, max_reconsume_times: int,
                               retry_queue_id: int, skipped_by: str | None = None,
                               reconsume_times: int | None = None) -> SendBackTarget:
    """RocketMQ's rule for the copy CONSUMER_SEND_MSG_BACK stores (after the lookups), as a pure function.

    ``msg`` is the stored message. The copy keeps all its properties; RETRY_TOPIC is set to the message's topic
    when absent; ORIGIN_MESSAGE_ID keeps an existing non-blank value, else becomes the message's offset id
    (RocketMQ's broker: ``msgExt.getMsgId()`` of a message it decoded). The copy's reconsume times is the
    message's + 1. A message whose reconsume times has reached ``max_reconsume_times``, or a negative
    ``delay_level``, sends the copy to ``%DLQ%<group>`` queue 0 with no DELAY property (at once); otherwise
    it goes to ``%RETRY%<group>`` queue ``retry_queue_id`` with DELAY = ``delay_level``, or 3 + reconsume
    times when ``delay_level`` is 0.

    ``reconsume_times`` (the request's trimq ``reconsumeTimes``) asks for the copy the *client's* own
    sendMessageBack would produce instead (RocketMQ 4.9.3's ConsumeMessageOrderlyService at the maximum, which
    produces to ``%RETRY%<group>`` with RECONSUME_TIME = the client's count, stored as is by handleRetryAndDLQ):
    the copy carries exactly that count and is judged by it, and a missing ORIGIN_MESSAGE_ID becomes the
    message's unique key (UNIQ_KEY, the client's ``msg.getMsgId()``; the offset id when it has none). So an
    orderly dead letter is the same whichever path stored it (client.consume.common.SendBack).
    """
    props = dict(msg.properties)
    props.setdefault(MessageConst.RETRY_TOPIC, msg.topic)
    if not (props.get(MessageConst.ORIGIN_MESSAGE_ID) or "").strip():
        props[MessageConst.ORIGIN_MESSAGE_ID] = msg.msg_id if reconsume_times is None else msg.unique_id
    props.pop(SCHEDULE_OFFSET_PROPERTY, None)  # belongs to the copy it was found on, not to this one
    if reconsume_times is None:
        judged = msg.reconsume_times
        times = min(msg.reconsume_times + 1, _MAX_INT32)  # the record field is an int32
    else:
        judged = times = reconsume_times
    if judged >= max_reconsume_times or delay_level < 0:
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        if skipped_by:  # trimq: an operator's skip, not an exhausted retry (docs/ADMIN.md)
            props[MessageConst.SKIPPED_BY] = skipped_by
        return SendBackTarget(dlq_topic(group), 0, props, times, True, 0)
    level = 3 + judged if delay_level == 0 else delay_level
    props[MessageConst.DELAY_TIME_LEVEL] = str(level)
    return SendBackTarget(retry_topic(group), retry_queue_id, props, times, False, level)


# -- the %RETRY% rule of the send path ---------------------------------------------------------------

async def handle_retry_and_dlq(groups: SubscriptionGroups, topics: Topics, topic: str, queue_id: int,
                               properties: PropertiesT, reconsume_times: int | None, max_reconsume: int | None
                               ) -> tuple[str, int, PropertiesT]:
    """RocketMQ's ``handleRetryAndDLQ`` for a plain SEND: where the message really goes.

    For a topic other than ``%RETRY%<group>`` the arguments come back unchanged. For a retry topic the
    group's config is found (auto-created when allowed; else SUBSCRIPTION_GROUP_NOT_EXIST is raised as a
    RequestError); ``max_reconsume`` (the header's ``maxReconsumeTimes``) overrides the group's
    ``retryMaxTimes``; when ``reconsume_times`` (None = 0) has reached it the message is rerouted to
    ``%DLQ%<group>`` queue 0 (created on demand, one queue, read+write) **without its DELAY property**, so
    it is a dead letter at once (DESIGN.md §6.6; RocketMQ 4.9.3 keeps the client's DELAY there).
    ``properties`` may be a dict or a RocketMQ property string; the result has the same form (a new object
    when changed). Returns ``(topic, queue_id, properties)``.
    """
    if not is_retry_topic(topic):
        return topic, queue_id, properties
    group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
    try:
        check_group(group)
    except InvalidNameError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"retry topic {topic!r} names no valid group: {exc}") from None
    cfg = groups.find(group)
    if cfg is None:
        raise RequestError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
    if groups.dirty:
        await groups.persist()
    max_times = cfg.retry_max_times if max_reconsume is None else max_reconsume
    if (reconsume_times or 0) < max_times:
        return topic, queue_id, properties
    new_topic = dlq_topic(group)
    topics.ensure_topic(new_topic, DLQ_NUMS_PER_GROUP, PERM_READ_WRITE)
    log.info("retry.dead_letter", group=group, source="send", reconsume_times=reconsume_times, max=max_times)
    if isinstance(properties, str):
        if get_property(properties, MessageConst.DELAY_TIME_LEVEL) is None:
            return new_topic, 0, properties
        decoded = decode_properties(properties)
        decoded.pop(MessageConst.DELAY_TIME_LEVEL, None)
        return new_topic, 0, cast(PropertiesT, encode_properties(decoded))
    props = dict(properties)
    props.pop(MessageConst.DELAY_TIME_LEVEL, None)
    return new_topic, 0, cast(PropertiesT, props)


# -- resend bookkeeping ---------------------------------------------------------------------------------

@dataclass
class _GroupResend:
    offset: int = 0  # every dead letter below this queue offset was resent
    resent: set[int] = field(default_factory=set)  # queue offsets >= offset resent one by one

    def is_resent(self, queue_offset: int) -> bool:
        return queue_offset < self.offset or queue_offset in self.resent

    def mark(self, queue_offset: int) -> None:
        if queue_offset < self.offset:
            return
        self.resent.add(queue_offset)
        while self.offset in self.resent:  # compact a contiguous prefix into the offset
            self.resent.discard(self.offset)
            self.offset += 1


class DlqResendTracker:
    """Which dead letters of each group were resent (``config/dlqResend.json``, atomic writes)."""

    def __init__(self, store_dir: str) -> None:
        self.path = os.path.join(store_dir, "config", RESEND_FILE_NAME)
        self.groups: dict[str, _GroupResend] = {}
        self._write_lock = trio.Lock()

    def load(self) -> None:
        data = read_json(self.path, default=None)
        self.groups = {}
        if data is None:
            return
        table = data.get("resendTable") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise StateFileError(f"{self.path}: expected a map with a 'resendTable' map")
        for group, entry in table.items():
            try:
                offset = entry["offset"]
                resent = entry.get("resent", [])
                if not isinstance(offset, int) or offset < 0 or not all(
                        isinstance(x, int) and x >= 0 for x in resent):
                    raise TypeError
            except (TypeError, KeyError, AttributeError):
                raise StateFileError(f"{self.path}: bad entry for group {group!r}") from None
            self.groups[group] = _GroupResend(offset, set(resent))

    def group(self, group: str) -> _GroupResend:
        return self.groups.setdefault(group, _GroupResend())

    def encode(self) -> dict[str, Any]:
        return {"resendTable": {g: {"offset": e.offset, "resent": sorted(e.resent)}
                                for g, e in sorted(self.groups.items())}}

    async def persist(self) -> None:
        async with self._write_lock:
            snapshot = self.encode()
            await trio.to_thread.run_sync(write_json_atomic, self.path, snapshot)


class UniqueKeyIndex(Protocol):
    """Messages by unique key (the store's message index, broker/store/index_dispatch.py IndexDispatcher)."""

    def query_messages(self, topic: str, key: str, max_num: int, begin: int, end: int, *,
                       unique: bool = False) -> QueryMessageResult: ...


# -- the service ------------------------------------------------------------------------------------------

class RetryService:
    """CONSUMER_SEND_MSG_BACK (36), QUERY_DLQ_MESSAGES (9002), RESEND_DLQ_MESSAGES (9003)."""

    name = "retry"

    def __init__(self, *, config: BrokerConfig, registry: HandlerRegistry, store: DeadLetterStore, topics: Topics,
                 groups: SubscriptionGroups, acl_enabled: bool, index: UniqueKeyIndex | None = None) -> None:
        """``acl_enabled``: requests are signed, so a send-back may only copy a message of the topic the caller
        may read (step 5 of consumer_send_msg_back). ``index``: the store's message index, to find a dead
        letter's original by unique key (None: only by offset message id)."""
        self.index = index
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.acl_enabled = acl_enabled
        self.resend = DlqResendTracker(config.store_dir)
        self._resend_locks: dict[str, trio.Lock] = {}
        self._random = random.Random()
        self.sent_back = 0
        self.dead_letters = 0
        registry.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.consumer_send_msg_back)
        registry.register(RequestCode.QUERY_DLQ_MESSAGES, self.query_dlq_messages)
        registry.register(RequestCode.RESEND_DLQ_MESSAGES, self.resend_dlq_messages)

    async def start(self) -> None:
        self.resend.load()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        pass

    # -- CONSUMER_SEND_MSG_BACK ---------------------------------------------------------------------
    async def consumer_send_msg_back(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """RocketMQ 4.9.3's ``asyncConsumerSendMsgBack``, in its order (module docstring)."""
        ext = cmd.ext or {}
        group = _group_field(ext, "group")
        commit_log_offset = _field(ext, "offset", int, required=True)
        delay_level = _field(ext, "delayLevel", int, default=0)
        header_max = _field(ext, "maxReconsumeTimes", int)
        client_times = _field(ext, "reconsumeTimes", int)  # trimq: the client's count (build_send_back_properties)
        if client_times is not None and not 0 <= client_times <= _MAX_INT32:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"header field 'reconsumeTimes' must be in [0, {_MAX_INT32}], got {client_times}")
        _field(ext, "originMsgId", str)
        origin_topic = _field(ext, "originTopic", str)
        skipped_by = _field(ext, "skippedBy", str)

        # 1. the group's config (auto-created when allowed)
        cfg: SubscriptionGroupConfig | None = self.groups.find(group)
        if cfg is None:
            raise RequestError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        # 2. the broker must be writable
        if not self.config.broker_permission & PERM_WRITE:
            raise RequestError(ResponseCode.NO_PERMISSION,
                               f"the broker[{self.config.broker_name}] sending message is forbidden")
        # 3. a group without retry queues keeps no retries
        if cfg.retry_queue_nums <= 0:
            if self.groups.dirty:
                await self.groups.persist()
            return RemotingCommand.response_to(cmd)
        # 4. the retry topic, created on demand with the group's queue count
        new_topic = retry_topic(group)
        topic_cfg = self.topics.ensure_topic(new_topic, cfg.retry_queue_nums, PERM_READ_WRITE)
        if not topic_cfg.perm & PERM_WRITE:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{new_topic}] sending message is forbidden")
        # RocketMQ: random % retryQueueNums. Also bounded by the topic's queues, in case the retry topic was
        # created before the group's retryQueueNums grew (RocketMQ would write to a queue nobody reads).
        queue_id = self._random.randrange(99_999_999) % max(1, min(cfg.retry_queue_nums, topic_cfg.write_queue_nums))
        # 5. the message itself
        if commit_log_offset < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {commit_log_offset}")
        msg = self.store.lookup_message_by_offset(commit_log_offset)
        if msg is None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {commit_log_offset}")
        if self.acl_enabled and msg.topic not in (origin_topic, new_topic):
            # With ACL on, the offset must name a message the caller may read (its SUB right on originTopic
            # was checked): otherwise an account could copy any topic's message into its retry topic.
            raise RequestError(ResponseCode.NO_PERMISSION,
                               f"message at offset {commit_log_offset} is not of topic {origin_topic!r} "
                               f"or {new_topic!r}")
        # 6. RETRY_TOPIC, the maximum, the target, ORIGIN_MESSAGE_ID
        max_times = cfg.retry_max_times if header_max is None else header_max
        target = build_send_back_properties(msg, group, delay_level=delay_level, max_reconsume_times=max_times,
                                            retry_queue_id=queue_id, skipped_by=skipped_by,
                                            reconsume_times=client_times)
        if target.dead_letter:
            self.topics.ensure_topic(target.topic, DLQ_NUMS_PER_GROUP, PERM_READ_WRITE)
        if self.groups.dirty:
            await self.groups.persist()
        # 7. store it: a retry copy is parked in SCHEDULE_TOPIC_XXXX by the put path (DELAY > 0)
        result = await self.store.put_message(
            target.topic, target.queue_id, msg.body, target.properties, flag=msg.flag, sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, reconsume_times=target.reconsume_times,
        )
        # SYNC_MASTER: like a send, answered once a slave holds the copy (RocketMQ's asyncPutMessage waits for
        # the slave here too). A success lets the client commit past the original, so a copy only the master
        # holds would be lost with it; SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT go back as SYSTEM_ERROR with
        # the status, as in RocketMQ, and the client falls back to producing the copy itself.
        result = await self.store.handle_ha(result)
        status = _status_name(result)
        if status != "PUT_OK":
            raise RequestError(ResponseCode.SYSTEM_ERROR, status)
        if target.dead_letter:
            self.dead_letters += 1
            log.info("retry.dead_letter", group=group, source="send_back", msg_id=msg.msg_id,
                     origin_msg_id=target.properties.get(MessageConst.ORIGIN_MESSAGE_ID),
                     reconsume_times=target.reconsume_times, max=max_times, delay_level=delay_level)
        else:
            self.sent_back += 1
            log.debug("retry.sent_back", group=group, msg_id=msg.msg_id, level=target.delay_level,
                      reconsume_times=target.reconsume_times)
        return RemotingCommand.response_to(cmd)

    # -- QUERY_DLQ_MESSAGES ---------------------------------------------------------------------------
    async def query_dlq_messages(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """A page of ``%DLQ%<group>`` (queue 0) from queue offset ``offset``, oldest first."""
        ext = cmd.ext or {}
        group = _group_field(ext, "consumerGroup")
        offset = _field(ext, "offset", int, default=0)
        max_nums = _field(ext, "maxNums", int, default=DEFAULT_QUERY_MAX_NUMS)
        include_body = _field(ext, "includeBody", bool, default=False)
        if offset < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field 'offset' must be >= 0, got {offset}")
        if not 1 <= max_nums <= MAX_QUERY_MAX_NUMS:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"header field 'maxNums' must be in [1, {MAX_QUERY_MAX_NUMS}], got {max_nums}")
        topic = dlq_topic(group)
        store = self.store
        min_offset = store.get_min_offset_in_queue(topic, 0)
        max_offset = store.get_max_offset_in_queue(topic, 0)
        state = self.resend.groups.get(group)
        messages: list[dict[str, Any]] = []
        pos = max(offset, min_offset)
        while pos < max_offset and len(messages) < max_nums:
            units = read_units(store, topic, 0, pos, min(max_nums - len(messages), max_offset - pos))
            if not units:
                break
            for i, (phys, _size, _tags) in enumerate(units):
                msg = store.lookup_message_by_offset(phys)
                if msg is None:
                    continue
                entry = _dlq_entry(msg, pos + i, resent=bool(state and state.is_resent(pos + i)))
                if include_body:
                    entry["body"] = msg.body
                messages.append(entry)
            pos += len(units)
        body = {"messages": messages, "minOffset": min_offset, "maxOffset": max_offset, "nextOffset": pos}
        return RemotingCommand.response_to(cmd, body=body)

    # -- RESEND_DLQ_MESSAGES --------------------------------------------------------------------------
    async def resend_dlq_messages(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Resend one dead letter (``msgId``) or every one not resent yet to its original topic."""
        ext = cmd.ext or {}
        group = _group_field(ext, "consumerGroup")
        msg_id = _field(ext, "msgId", str)
        msg_ids = ext.get("msgIds")
        if msg_ids is not None and (not isinstance(msg_ids, list) or not all(isinstance(m, str) for m in msg_ids)):
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"header field 'msgIds' must be a list of strings, got {msg_ids!r}")
        topic = dlq_topic(group)
        lock = self._resend_locks.setdefault(group, trio.Lock())
        async with lock:
            state = self.resend.group(group)
            resent: list[dict[str, Any]] = []
            failed: list[dict[str, Any]] = []
            skipped = 0
            if msg_id and msg_ids is None:
                found = self._find_dead_letter(topic, msg_id)
                if found is None:
                    raise RequestError(ResponseCode.QUERY_NOT_FOUND,
                                       f"no dead letter {msg_id} in {topic}")
                queue_offset, msg = found
                try:
                    resent.append(await self._resend_one(group, msg, queue_offset))
                except RequestError as exc:
                    raise RequestError(exc.code, f"resend of {msg.msg_id} failed: {exc.remark}") from None
                state.mark(queue_offset)
                await self.resend.persist()
            elif msg_id or msg_ids:
                for one_id in ([msg_id] if msg_id else []) + (msg_ids or []):
                    found = self._find_dead_letter(topic, one_id)
                    if found is None:
                        failed.append({"msgId": one_id, "queueOffset": None, "error": f"no dead letter in {topic}"})
                        continue
                    queue_offset, msg = found
                    try:
                        resent.append(await self._resend_one(group, msg, queue_offset))
                    except RequestError as exc:
                        failed.append({"msgId": one_id, "queueOffset": queue_offset, "error": exc.remark})
                        continue
                    state.mark(queue_offset)
                await self.resend.persist()
            else:
                store = self.store
                min_offset = store.get_min_offset_in_queue(topic, 0)
                max_offset = store.get_max_offset_in_queue(topic, 0)
                pos = max(state.offset, min_offset)
                skipped = max(0, min(state.offset, max_offset) - min_offset)  # resent by an earlier request
                while pos < max_offset:
                    units = read_units(store, topic, 0, pos, min(_RESEND_BATCH, max_offset - pos))
                    if not units:
                        break
                    for i, (phys, _size, _tags) in enumerate(units):
                        queue_offset = pos + i
                        if state.is_resent(queue_offset):
                            skipped += 1
                            continue
                        found_msg = store.lookup_message_by_offset(phys)
                        if found_msg is None:
                            failed.append({"queueOffset": queue_offset, "error": "record not found"})
                            continue
                        msg = found_msg
                        try:
                            resent.append(await self._resend_one(group, msg, queue_offset))
                        except RequestError as exc:
                            failed.append({"msgId": msg.msg_id, "queueOffset": queue_offset, "error": exc.remark})
                            continue
                        state.mark(queue_offset)
                    pos += len(units)
                    await self.resend.persist()  # a crash re-sends at most one batch, never loses one
        body = {"resent": resent, "resentCount": len(resent), "skipped": skipped, "failed": failed}
        return RemotingCommand.response_to(cmd, body=body)

    def _find_dead_letter(self, topic: str, msg_id: str) -> tuple[int, MessageExt] | None:
        """A dead letter of ``topic`` by its own id (direct), or by its origin id / unique key (scan)."""
        store = self.store
        try:
            _host, offset = parse_message_id(msg_id)
        except ValueError:
            offset = -1
        if offset >= 0:
            msg = store.lookup_message_by_offset(offset)
            if msg is not None and msg.topic == topic and msg.msg_id.upper() == msg_id.upper():
                return msg.queue_offset, msg
        pos = store.get_min_offset_in_queue(topic, 0)
        max_offset = store.get_max_offset_in_queue(topic, 0)
        while pos < max_offset:
            units = read_units(store, topic, 0, pos, min(256, max_offset - pos))
            if not units:
                break
            for i, (phys, _size, _tags) in enumerate(units):
                msg = store.lookup_message_by_offset(phys)
                if msg is not None and msg_id in (msg.properties.get(MessageConst.ORIGIN_MESSAGE_ID),
                                                  msg.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)):
                    return pos + i, msg
            pos += len(units)
        return None

    def _resend_queue(self, msg: MessageExt, topic: str, write_queue_nums: int) -> int:
        """The queue a resent dead letter goes to (module docstring)."""
        queue_id = 0
        origin = msg.properties.get(MessageConst.ORIGIN_MESSAGE_ID)
        original = None
        if origin:
            try:
                _host, offset = parse_message_id(origin)
                original = self.store.lookup_message_by_offset(offset)
            except ValueError:
                original = None
        if original is not None and origin and original.topic == topic and original.msg_id.upper() == origin.upper():
            queue_id = original.queue_id
        elif origin and (first := self._first_with_unique_key(topic, origin)) is not None:
            queue_id = first.queue_id
        elif msg.properties.get(MessageConst.REAL_TOPIC) == topic:
            try:
                queue_id = int(msg.properties.get(MessageConst.REAL_QUEUE_ID) or "0")
            except ValueError:
                queue_id = 0
        return queue_id % max(1, write_queue_nums)

    def _first_with_unique_key(self, topic: str, uniq: str) -> MessageExt | None:
        """The first message of ``topic`` stored with UNIQ_KEY ``uniq`` (the original: a resent copy keeps it)."""
        if self.index is None:
            return None
        found = self.index.query_messages(topic, uniq, 64, 0, 2**63 - 1, unique=True).messages
        return min(found, key=lambda m: (m.store_timestamp, m.commit_log_offset), default=None)

    async def _resend_one(self, group: str, msg: MessageExt, queue_offset: int) -> dict[str, Any]:
        topic = msg.properties.get(MessageConst.RETRY_TOPIC)
        if not topic:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"dead letter {msg.msg_id} has no RETRY_TOPIC property")
        topic_cfg = self.topics.get(topic)
        if topic_cfg is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        if not topic_cfg.perm & PERM_WRITE:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = self._resend_queue(msg, topic, topic_cfg.write_queue_nums)
        props = dict(msg.properties)
        for name in (MessageConst.DELAY_TIME_LEVEL, MessageConst.REAL_TOPIC, MessageConst.REAL_QUEUE_ID,
                     MessageConst.RECONSUME_TIME, SCHEDULE_OFFSET_PROPERTY):
            props.pop(name, None)
        props[DLQ_MSG_ID_PROPERTY] = msg.msg_id
        result = await self.store.put_message(
            topic, queue_id, msg.body, props, flag=msg.flag, sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=msg.born_host, reconsume_times=0,
        )
        status = _status_name(result)
        if status != "PUT_OK":
            raise RequestError(ResponseCode.SYSTEM_ERROR, status)
        log.info("retry.dlq_resent", group=group, dlq_msg_id=msg.msg_id, topic=topic, queue_id=queue_id,
                 new_msg_id=getattr(result, "msg_id", None))
        return {"dlqMsgId": msg.msg_id, "queueOffset": queue_offset, "topic": topic, "queueId": queue_id,
                "msgId": getattr(result, "msg_id", None)}


def _dlq_entry(msg: MessageExt, queue_offset: int, *, resent: bool) -> dict[str, Any]:
    props = msg.properties
    return {
        "msgId": msg.msg_id,
        "originMsgId": props.get(MessageConst.ORIGIN_MESSAGE_ID),
        "originTopic": props.get(MessageConst.RETRY_TOPIC),
        "uniqKey": props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        "keys": props.get(MessageConst.KEYS),
        "tags": props.get(MessageConst.TAGS),
        "reconsumeTimes": msg.reconsume_times,
        "storeTimestamp": msg.store_timestamp,
        "bornTimestamp": msg.born_timestamp,
        "queueOffset": queue_offset,
        "commitLogOffset": msg.commit_log_offset,
        "bodySize": len(msg.body),
        "skippedBy": props.get(MessageConst.SKIPPED_BY),
        "resent": resent,
    }
