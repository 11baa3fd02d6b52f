"""Typed calls to brokers and name servers: one method per request code of docs/PROTOCOL.md §4.

``MQClientAPI(remoting)`` wraps a :class:`runtime.client.RemotingClient`. Each method builds the
request's ``ext``/``body`` exactly as the protocol table says, sends it to ``addr``, and returns a small
typed result, or raises:

* :class:`client.errors.MQBrokerError` (or a subclass such as TopicNotExistError, OffsetNotFoundError,
  NoPermissionError) when the peer answered with an error code — ``code`` and ``remark`` are kept;
* :class:`client.errors.MQClientError` when the response is malformed;
* :class:`runtime.client.RemotingError` subclasses for transport failures (connect, timeout).

Pull responses are decoded here: records via ``protocol.record.iter_records``, exact tag filtering
against the subscription's tags, and RocketMQ's MIN_OFFSET / MAX_OFFSET properties on each message.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trimq.client.errors import MQClientError, StaleResetGenerationError, broker_error
from trimq.protocol.address import format_address
from trimq.protocol.codes import RequestCode, ResponseCode, code_name
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RecordError
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.record import RecordDecoder, decode_record, parse_message_id
from trimq.protocol.route import MASTER_ID, PERM_READ, PERM_WRITE, BrokerData, TopicRouteData
from trimq.runtime.client import RemotingClient

__all__ = [
    "ClusterInfo",
    "ConsumerData",
    "HeartbeatData",
    "LockBatchAnswer",
    "MQClientAPI",
    "PullResult",
    "PullStatus",
    "SendResult",
    "SendStatus",
    "TopicConfig",
    "build_pull_sys_flag",
]


PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4


def build_pull_sys_flag(commit_offset: bool, suspend: bool, subscription: bool) -> int:
    """PullSysFlag.buildSysFlag without the class-filter bit."""
    return (
        (PULL_FLAG_COMMIT_OFFSET if commit_offset else 0)
        | (PULL_FLAG_SUSPEND if suspend else 0)
        | (PULL_FLAG_SUBSCRIPTION if subscription else 0)
    )


# ------------------------------------------------------------------------------------------------
# Result types


class SendStatus(enum.Enum):
    """RocketMQ's SendStatus: the message is stored in every case; the others report a weaker guarantee."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


_SEND_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message (or batch) went.

    ``msg_id`` is the producer's unique key (UNIQ_KEY; comma-joined for a batch), ``offset_msg_id`` the
    broker's offset message id, ``queue_offset`` the logical offset of the (first) message.
    """

    status: SendStatus
    msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    offset_msg_id: str = ""


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


_PULL_STATUS_BY_CODE = {int(code): status for code, status in _PULL_STATUS.items()}


@dataclass(slots=True)
class PullResult:
    """A pull's outcome: status, where to pull next, the queue's bounds and the (filtered) messages."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msg_found_list: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = MASTER_ID
    filtered_out: int = 0
    """Messages the broker returned that the exact client-side tag filter dropped."""
    master_epoch: int | None = None
    """The master epoch of the answering broker's log (trimq; None from brokers that do not say)."""


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    broker_addr_table: Mapping[str, BrokerData]
    cluster_addr_table: Mapping[str, frozenset[str]]


@dataclass(slots=True)
class LockBatchAnswer:
    """A LOCK_BATCH_MQ answer with trimq's lease fields (docs/PROTOCOL.md "Queue-lock leases").

    ``held``: the queues now locked by the caller; ``kept``: those nobody else held since its previous lock
    (None from a broker that does not say); ``epochs``: the fencing epoch of each held queue (empty from a
    broker that does not grant epochs); ``lease_ms``: how long the caller may rely on the locks, counted from
    when it sent the request (None: the broker does not say); ``member``: False when the broker does not count
    the caller as a member of the group (it must heartbeat again), None when the broker does not say;
    ``grace_ms``: the broker restarted and keeps some of the requested queues for their claimants for this long
    (ask again then), None otherwise.
    """

    held: set[MessageQueue]
    kept: set[MessageQueue] | None = None
    epochs: dict[MessageQueue, int] = field(default_factory=dict)
    lease_ms: int | None = None
    member: bool | None = None
    grace_ms: int | None = None


@dataclass(slots=True)
class ConsumerData:
    """One consumer group's entry of a heartbeat."""

    group_name: str
    consume_type: str
    message_model: str
    consume_from_where: str
    consume_orderly: bool
    subscription_data_set: list[dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        return {
            "groupName": self.group_name,
            "consumeType": self.consume_type,
            "messageModel": self.message_model,
            "consumeFromWhere": self.consume_from_where,
            "consumeOrderly": self.consume_orderly,
            "subscriptionDataSet": self.subscription_data_set,
        }


@dataclass(slots=True)
class HeartbeatData:
    client_id: str
    producer_groups: list[str] = field(default_factory=list)
    consumer_data_set: list[ConsumerData] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {
            "clientID": self.client_id,
            "language": "PYTHON",
            "version": _client_version(),
            "producerDataSet": [{"groupName": g} for g in self.producer_groups],
            "consumerDataSet": [c.to_wire() for c in self.consumer_data_set],
        }


def _client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trimq")
    except PackageNotFoundError:
        return "dev"


# ------------------------------------------------------------------------------------------------
# Parsing helpers


def _malformed(what: str, addr: str, detail: str) -> MQClientError:
    return MQClientError(f"malformed {what} response from {addr}: {detail}")


def _int(m: Mapping[str, Any] | None, key: str, what: str, addr: str, default: int | None = None) -> int:
    v = (m or {}).get(key, default)
    if type(v) is int:
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, str):
            try:
                return int(v)
            except ValueError:
                pass
        raise _malformed(what, addr, f"field {key!r} must be an integer, got {v!r}")
    return v


def _opt_int(v: Any) -> int | None:
    """An optional integer field a broker may leave out (trimq's additions; RocketMQ's brokers send none)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _map(v: Any, what: str, addr: str, name: str) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise _malformed(what, addr, f"{name} must be a map, got {type(v).__name__}")
    return v


def _mq_list(v: Any, what: str, addr: str) -> set[MessageQueue]:
    if v is None:
        return set()
    if not isinstance(v, list | tuple):
        raise _malformed(what, addr, f"expected a list of message queues, got {type(v).__name__}")
    try:
        return {MessageQueue.from_wire(m) for m in v}
    except ValueError as exc:
        raise _malformed(what, addr, str(exc)) from None


def _broker_data(v: Any, what: str, addr: str) -> BrokerData:
    try:
        return BrokerData.from_wire(v)
    except ValueError as exc:
        raise _malformed(what, addr, str(exc)) from None


def parse_route(body: Any, addr: str) -> TopicRouteData:
    """Decode a GET_ROUTEINFO_BY_TOPIC body (protocol/route.py); MQClientError when it is malformed."""
    try:
        return TopicRouteData.from_wire(body)
    except ValueError as exc:
        raise _malformed("GET_ROUTEINFO_BY_TOPIC", addr, str(exc)) from None


def process_pull_messages(
    body: Any, tags: Iterable[str] | None, min_offset: int, max_offset: int, addr: str
) -> tuple[list[MessageExt], int]:
    """Decode the records of a FOUND pull, keep those whose tags are subscribed (all when ``tags`` is empty),
    and set MIN_OFFSET / MAX_OFFSET on each (RocketMQ's PullAPIWrapper.processPullResult).

    Returns (messages, how many were filtered out).
    """
    if body is None:
        return [], 0
    if not isinstance(body, bytes | bytearray | memoryview):
        raise _malformed("PULL_MESSAGE", addr, f"body must be bytes, got {type(body).__name__}")
    try:
        msgs = _RECORDS.decode_all(body)
    except RecordError as exc:
        raise _malformed("PULL_MESSAGE", addr, f"undecodable records: {exc}") from None
    tag_set = set(tags or ())
    kept = [m for m in msgs if m.tags is not None and m.tags in tag_set] if tag_set else msgs
    lo, hi = str(min_offset), str(max_offset)
    for m in kept:
        props = m.properties
        props[_MIN_OFFSET] = lo
        props[_MAX_OFFSET] = hi
    return kept, len(msgs) - len(kept)


_RECORDS = RecordDecoder()  # the host/topic caches are shared by every pull of the process
_MIN_OFFSET = MessageConst.MIN_OFFSET
_MAX_OFFSET = MessageConst.MAX_OFFSET


# ------------------------------------------------------------------------------------------------
# The API


class MQClientAPI:
    """Typed requests over one RemotingClient. ``timeout_ms`` is the default per-call timeout."""

    def __init__(self, remoting: RemotingClient, *, timeout_ms: int = 3000) -> None:
        self.remoting = remoting
        self.timeout_ms = timeout_ms

    async def invoke(
        self,
        addr: str,
        code: int,
        ext: dict[str, Any] | None = None,
        body: Any = None,
        *,
        timeout_ms: int | None = None,
        ok: tuple[int, ...] = (ResponseCode.SUCCESS,),
    ) -> RemotingCommand:
        """Send one request; return the response if its code is in ``ok``, else raise MQBrokerError."""
        cmd = RemotingCommand.request(code, {k: v for k, v in (ext or {}).items() if v is not None}, body)
        timeout = (self.timeout_ms if timeout_ms is None else timeout_ms) / 1000
        resp = await self.remoting.invoke(addr, cmd, timeout)
        if resp.code not in ok:
            raise broker_error(resp.code, resp.remark, addr, code_name(code, response=False))
        return resp

    async def invoke_oneway(self, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None) -> None:
        cmd = RemotingCommand.request(code, {k: v for k, v in (ext or {}).items() if v is not None}, body)
        await self.remoting.invoke_oneway(addr, cmd)

    # --- producing -----------------------------------------------------------------------------

    async def send_message(
        self,
        addr: str,
        broker_name: str,
        *,
        producer_group: str,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: str,
        born_timestamp: int,
        flag: int = 0,
        sys_flag: int = 0,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        uniq_id: str = "",
        timeout_ms: int | None = None,
    ) -> SendResult:
        """SEND_MESSAGE. ``properties`` is the encoded property string."""
        ext = {
            "producerGroup": producer_group,
            "topic": topic,
            "queueId": queue_id,
            "sysFlag": sys_flag,
            "bornTimestamp": born_timestamp,
            "flag": flag,
            "properties": properties,
            "reconsumeTimes": reconsume_times,
            "maxReconsumeTimes": max_reconsume_times,
        }
        ok = tuple(_SEND_STATUS)
        resp = await self.invoke(addr, RequestCode.SEND_MESSAGE, ext, bytes(body), timeout_ms=timeout_ms, ok=ok)
        return self._send_result(resp, addr, topic, broker_name, uniq_id, "SEND_MESSAGE")

    async def send_batch(
        self,
        addr: str,
        broker_name: str,
        *,
        producer_group: str,
        topic: str,
        queue_id: int,
        messages: list[dict[str, Any]],
        born_timestamp: int,
        uniq_ids: list[str],
        timeout_ms: int | None = None,
    ) -> SendResult:
        """SEND_BATCH_MESSAGE: ``messages`` are ``{"body": bytes, "properties": str, "flag": int}``, one queue."""
        ext = {
            "producerGroup": producer_group,
            "topic": topic,
            "queueId": queue_id,
            "sysFlag": 0,
            "bornTimestamp": born_timestamp,
            "flag": 0,
            "properties": "",
        }
        ok = tuple(_SEND_STATUS)
        resp = await self.invoke(addr, RequestCode.SEND_BATCH_MESSAGE, ext, messages, timeout_ms=timeout_ms, ok=ok)
        return self._send_result(resp, addr, topic, broker_name, ",".join(uniq_ids), "SEND_BATCH_MESSAGE")

    async def send_batches(
        self,
        addr: str,
        broker_name: str,
        batches: list[tuple[str, int, list[dict[str, Any]], list[str]]],
        *,
        producer_group: str,
        born_timestamp: int,
        timeout_ms: int | None = None,
    ) -> list[SendResult | Exception]:
        """Several SEND_BATCH_MESSAGE requests to one broker, pipelined: ``batches`` are ``(topic, queue id,
        messages, unique ids)``. Returns, in order, each SendResult or the exception its request ended with
        (MQBrokerError for an error answer, a RemotingError when no answer came)."""
        cmds = [
            RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, 0, 0, 0, None, {
                "producerGroup": producer_group, "topic": topic, "queueId": queue_id, "sysFlag": 0,
                "bornTimestamp": born_timestamp, "flag": 0, "properties": "",
            }, messages)
            for topic, queue_id, messages, _ in batches
        ]
        timeout = (self.timeout_ms if timeout_ms is None else timeout_ms) / 1000
        resps = await self.remoting.invoke_many(addr, cmds, timeout)
        out: list[SendResult | Exception] = []
        what = "SEND_BATCH_MESSAGE"
        for (topic, _, _, ids), resp in zip(batches, resps, strict=True):
            if isinstance(resp, Exception):
                out.append(resp)
            elif resp.code not in _SEND_STATUS:
                out.append(broker_error(resp.code, resp.remark, addr, what))
            else:
                try:
                    out.append(self._send_result(resp, addr, topic, broker_name, ",".join(ids), what))
                except MQClientError as exc:
                    out.append(exc)
        return out

    @staticmethod
    def _send_result(
        resp: RemotingCommand, addr: str, topic: str, broker_name: str, uniq_id: str, what: str
    ) -> SendResult:
        queue_id = _int(resp.ext, "queueId", what, addr)
        offset_msg_id = resp.ext.get("msgId") or ""
        return SendResult(
            status=_SEND_STATUS[ResponseCode(resp.code)],
            msg_id=uniq_id or str(offset_msg_id),
            message_queue=MessageQueue(topic, broker_name, queue_id),
            queue_offset=_int(resp.ext, "queueOffset", what, addr),
            offset_msg_id=str(offset_msg_id),
        )

    # --- consuming -----------------------------------------------------------------------------

    async def pull_message(
        self,
        addr: str,
        *,
        consumer_group: str,
        mq: MessageQueue,
        queue_offset: int,
        max_msg_nums: int,
        sys_flag: int,
        commit_offset: int,
        suspend_timeout_millis: int,
        subscription: str,
        sub_version: int,
        tags: Iterable[str] | None = None,
        timeout_ms: int | None = None,
        reset_generation: int | None = None,
        master_epoch: int | None = None,
        lock_epoch: int | None = None,
    ) -> PullResult:
        """PULL_MESSAGE, decoded and tag-filtered. Other response codes raise MQBrokerError. ``reset_generation``
        (trimq): the reset generation ``commit_offset`` was read under (a pull made before a reset of the
        group's offsets does not write its commit offset over it). ``master_epoch`` (trimq): the master epoch
        under which ``queue_offset`` was reached (a broker whose log moved to a newer epoch moves a position past
        where that one began back there: PULL_OFFSET_MOVED). ``lock_epoch`` (trimq): the fencing epoch of the queue
        lock ``commit_offset`` was consumed under (an orderly consumer's): the commit is judged and ranked by it, as
        UPDATE_CONSUMER_OFFSET's ``lockEpoch`` is."""
        ext = {
            "consumerGroup": consumer_group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "queueOffset": queue_offset,
            "maxMsgNums": max_msg_nums,
            "sysFlag": sys_flag,
            "commitOffset": commit_offset,
            "suspendTimeoutMillis": suspend_timeout_millis,
            "subscription": subscription,
            "subVersion": sub_version,
        }
        if reset_generation is not None:
            ext["resetGeneration"] = reset_generation
        if master_epoch is not None:
            ext["masterEpoch"] = master_epoch
        if lock_epoch is not None:
            ext["lockEpoch"] = lock_epoch
        # built directly (every field is set): this is the consumer's hottest request
        cmd = RemotingCommand(RequestCode.PULL_MESSAGE, 0, 0, 0, None, ext, None)
        timeout = (self.timeout_ms if timeout_ms is None else timeout_ms) / 1000
        resp = await self.remoting.invoke(addr, cmd, timeout)
        status = _PULL_STATUS_BY_CODE.get(resp.code)
        if status is None:
            raise broker_error(resp.code, resp.remark, addr, "PULL_MESSAGE")
        what = "PULL_MESSAGE"
        rext = resp.ext
        min_offset = _int(rext, "minOffset", what, addr, 0)
        max_offset = _int(rext, "maxOffset", what, addr, 0)
        result = PullResult(
            status,
            _int(rext, "nextBeginOffset", what, addr, queue_offset),
            min_offset,
            max_offset,
            [],
            _int(rext, "suggestWhichBrokerId", what, addr, MASTER_ID),
        )
        if "masterEpoch" in rext:
            result.master_epoch = _int(rext, "masterEpoch", what, addr, 0)
        if status is PullStatus.FOUND:
            result.msg_found_list, result.filtered_out = process_pull_messages(
                resp.body, tags, min_offset, max_offset, addr
            )
        return result

    async def query_consumer_offset(
        self, addr: str, consumer_group: str, mq: MessageQueue, *, timeout_ms: int | None = None
    ) -> int:
        """QUERY_CONSUMER_OFFSET. Raises OffsetNotFoundError (QUERY_NOT_FOUND) when none is stored."""
        ext = {"consumerGroup": consumer_group, "topic": mq.topic, "queueId": mq.queue_id}
        resp = await self.invoke(addr, RequestCode.QUERY_CONSUMER_OFFSET, ext, timeout_ms=timeout_ms)
        return _int(resp.ext, "offset", "QUERY_CONSUMER_OFFSET", addr)

    async def query_consumer_offset_state(
        self, addr: str, consumer_group: str, mq: MessageQueue, *, timeout_ms: int | None = None
    ) -> tuple[int, int | None, int | None]:
        """QUERY_CONSUMER_OFFSET: (offset, -1 when none is stored; the reset generation it was read under, None
        from a broker that keeps none; the master epoch of the broker's log, None when it says none). Commits of
        that offset carry the generation (issue 19) and the epoch (docs/PROTOCOL.md §7) back."""
        ext = {"consumerGroup": consumer_group, "topic": mq.topic, "queueId": mq.queue_id}
        resp = await self.invoke(addr, RequestCode.QUERY_CONSUMER_OFFSET, ext, timeout_ms=timeout_ms,
                                 ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        rext = resp.ext or {}
        generation, epoch = _opt_int(rext.get("resetGeneration")), _opt_int(rext.get("masterEpoch"))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1, generation, epoch
        return _int(resp.ext, "offset", "QUERY_CONSUMER_OFFSET", addr), generation, epoch

    async def update_consumer_offset(
        self,
        addr: str,
        consumer_group: str,
        mq: MessageQueue,
        offset: int,
        client_id: str | None = None,
        *,
        oneway: bool = False,
        timeout_ms: int | None = None,
        lock_epoch: int | None = None,
        reset_generation: int | None = None,
        master_epoch: int | None = None,
    ) -> None:
        """UPDATE_CONSUMER_OFFSET. A fenced update raises NoPermissionError (not with ``oneway``). ``lock_epoch``
        (trimq): the fencing epoch of the queue lock the offset was consumed under; the broker refuses the
        update when the queue's lock has been granted with a newer epoch since. ``reset_generation`` (trimq):
        the reset generation the offset was read under; an update made before a reset of the group's offsets
        raises StaleResetGenerationError (a NoPermissionError) naming the broker's current one. ``master_epoch``
        (trimq): the master epoch of the log the offset was reached in; a broker whose log began a newer one since
        stores at most the queue offset where that one began."""
        ext = {
            "consumerGroup": consumer_group,
            "topic": mq.topic,
            "queueId": mq.queue_id,
            "commitOffset": offset,
            "clientId": client_id,
            "lockEpoch": lock_epoch,
            "resetGeneration": reset_generation,
            "masterEpoch": master_epoch,
        }
        if oneway:
            await self.invoke_oneway(addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
            return
        resp = await self.invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext, timeout_ms=timeout_ms,
                                 ok=(ResponseCode.SUCCESS, ResponseCode.NO_PERMISSION))
        if resp.code == ResponseCode.NO_PERMISSION:
            current = _opt_int((resp.ext or {}).get("resetGeneration"))
            if current is not None:
                raise StaleResetGenerationError(resp.code, resp.remark, addr, "UPDATE_CONSUMER_OFFSET",
                                                reset_generation=current)
            raise broker_error(resp.code, resp.remark, addr, "UPDATE_CONSUMER_OFFSET")

    async def get_max_offset(self, addr: str, mq: MessageQueue, *, timeout_ms: int | None = None) -> int:
        """GET_MAX_OFFSET: the next offset to be written (0 for an empty queue)."""
        ext = {"topic": mq.topic, "queueId": mq.queue_id}
        resp = await self.invoke(addr, RequestCode.GET_MAX_OFFSET, ext, timeout_ms=timeout_ms)
        return _int(resp.ext, "offset", "GET_MAX_OFFSET", addr)

    async def get_min_offset(self, addr: str, mq: MessageQueue, *, timeout_ms: int | None = None) -> int:
        """GET_MIN_OFFSET: the smallest offset still stored."""
        ext = {"topic": mq.topic, "queueId": mq.queue_id}
        resp = await self.invoke(addr, RequestCode.GET_MIN_OFFSET, ext, timeout_ms=timeout_ms)
        return _int(resp.ext, "offset", "GET_MIN_OFFSET", addr)

    async def search_offset(
        self, addr: str, mq: MessageQueue, timestamp_ms: int, *, timeout_ms: int | None = None
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``."""
        ext = {"topic": mq.topic, "queueId": mq.queue_id, "timestamp": timestamp_ms}
        resp = await self.invoke(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ext, timeout_ms=timeout_ms)
        return _int(resp.ext, "offset", "SEARCH_OFFSET_BY_TIMESTAMP", addr)

    async def get_earliest_msg_store_time(
        self, addr: str, mq: MessageQueue, *, timeout_ms: int | None = None
    ) -> int:
        """GET_EARLIEST_MSG_STORETIME: store timestamp (ms) of the oldest message of the queue."""
        ext = {"topic": mq.topic, "queueId": mq.queue_id}
        resp = await self.invoke(addr, RequestCode.GET_EARLIEST_MSG_STORETIME, ext, timeout_ms=timeout_ms)
        return _int(resp.ext, "timestamp", "GET_EARLIEST_MSG_STORETIME", addr)

    async def view_message(self, addr: str, commit_log_offset: int, *, timeout_ms: int | None = None) -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the stored message at a commit-log offset (from an offset message id)."""
        resp = await self.invoke(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": commit_log_offset},
                                 timeout_ms=timeout_ms)
        if not isinstance(resp.body, bytes | bytearray):
            raise _malformed("VIEW_MESSAGE_BY_ID", addr, "body must be the record bytes")
        try:
            return decode_record(resp.body)
        except RecordError as exc:
            raise _malformed("VIEW_MESSAGE_BY_ID", addr, str(exc)) from None

    async def query_message(
        self,
        addr: str,
        topic: str | None,
        key: str,
        *,
        max_num: int = 64,
        begin_timestamp: int = 0,
        end_timestamp: int = 2**63 - 1,
        unique: bool = False,
        timeout_ms: int | None = None,
    ) -> list[MessageExt]:
        """QUERY_MESSAGE: the broker's stored messages of ``topic`` (None: of every topic it stores, trimq) whose
        KEYS hold ``key`` (``unique``: whose UNIQ_KEY is ``key``), stored in ``[begin_timestamp,
        end_timestamp]``: the newest ``max_num`` (the broker caps it, 64 by default), oldest first; [] when
        none (QUERY_NOT_FOUND)."""
        ext: dict[str, Any] = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_timestamp,
                               "endTimestamp": end_timestamp}
        if unique:
            ext["_UNIQUE_KEY_QUERY"] = "true"  # RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG
        resp = await self.invoke(addr, RequestCode.QUERY_MESSAGE, ext, timeout_ms=timeout_ms,
                                 ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if not isinstance(resp.body, bytes | bytearray):
            raise _malformed("QUERY_MESSAGE", addr, "body must be the records' bytes")
        try:
            return RecordDecoder().decode_all(resp.body)
        except RecordError as exc:
            raise _malformed("QUERY_MESSAGE", addr, str(exc)) from None

    async def view_message_by_id(self, msg_id: str, *, timeout_ms: int | None = None) -> MessageExt:
        """VIEW_MESSAGE_BY_ID for an offset message id: the id names the broker (store host) and the offset."""
        try:
            (host, port), offset = parse_message_id(msg_id)
        except ValueError as exc:
            raise MQClientError(str(exc)) from None
        return await self.view_message(format_address(host, port), offset, timeout_ms=timeout_ms)

    async def consumer_send_msg_back(
        self,
        addr: str,
        *,
        group: str,
        commit_log_offset: int,
        delay_level: int,
        origin_msg_id: str,
        origin_topic: str,
        max_reconsume_times: int | None = None,
        skipped_by: str | None = None,
        timeout_ms: int | None = 5000,
        reconsume_times: int | None = None,
    ) -> None:
        """CONSUMER_SEND_MSG_BACK: store a consumed message again in the group's retry (or DLQ) topic.

        ``skipped_by`` (trimq) marks a dead letter an operator skipped, rather than one that ran out of retries.
        ``reconsume_times`` (trimq) asks for the copy the client's own send-back would produce: exactly this
        count, and the unique key as ORIGIN_MESSAGE_ID (an orderly dead letter, RocketMQ's rule).
        """
        ext: dict[str, Any] = {
            "group": group,
            "offset": commit_log_offset,
            "delayLevel": delay_level,
            "originMsgId": origin_msg_id,
            "originTopic": origin_topic,
            "maxReconsumeTimes": max_reconsume_times,
        }
        if skipped_by:
            ext["skippedBy"] = skipped_by
        if reconsume_times is not None:
            ext["reconsumeTimes"] = reconsume_times
        await self.invoke(addr, RequestCode.CONSUMER_SEND_MSG_BACK, ext, timeout_ms=timeout_ms)

    # --- membership and locks --------------------------------------------------------------------

    async def heartbeat(self, addr: str, data: HeartbeatData, *, timeout_ms: int | None = None) -> None:
        """HEART_BEAT: register this client's producer and consumer groups with the broker."""
        await self.invoke(addr, RequestCode.HEART_BEAT, body=data.to_wire(), timeout_ms=timeout_ms)

    async def unregister_client(
        self,
        addr: str,
        client_id: str,
        *,
        producer_group: str | None = None,
        consumer_group: str | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """UNREGISTER_CLIENT: leave a producer and/or consumer group on that broker."""
        ext = {"clientID": client_id, "producerGroup": producer_group, "consumerGroup": consumer_group}
        await self.invoke(addr, RequestCode.UNREGISTER_CLIENT, ext, timeout_ms=timeout_ms)

    async def get_consumer_id_list_by_group(
        self, addr: str, consumer_group: str, *, timeout_ms: int | None = None
    ) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: client ids of the group's live members on that broker."""
        resp = await self.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": consumer_group},
                                 timeout_ms=timeout_ms)
        body = _map(resp.body, "GET_CONSUMER_LIST_BY_GROUP", addr, "body")
        ids = body.get("consumerIdList")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise _malformed("GET_CONSUMER_LIST_BY_GROUP", addr, f"consumerIdList must be a list of strings: {ids!r}")
        return list(ids)

    async def lock_batch_mq(
        self,
        addr: str,
        consumer_group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        *,
        timeout_ms: int | None = 1000,
    ) -> set[MessageQueue]:
        """LOCK_BATCH_MQ: try to lock the queues for this client; returns those now held by it."""
        body = {"consumerGroup": consumer_group, "clientId": client_id, "mqSet": [m.to_wire() for m in mqs]}
        resp = await self.invoke(addr, RequestCode.LOCK_BATCH_MQ, body=body, timeout_ms=timeout_ms)
        m = _map(resp.body, "LOCK_BATCH_MQ", addr, "body")
        return _mq_list(m.get("lockOKMQSet"), "LOCK_BATCH_MQ", addr)

    async def lock_batch_mq_detailed(
        self,
        addr: str,
        consumer_group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        *,
        timeout_ms: int | None = 1000,
    ) -> tuple[set[MessageQueue], set[MessageQueue] | None]:
        """LOCK_BATCH_MQ returning ``(held, kept)``: ``kept`` are the held queues nobody else locked since this
        client's previous lock (trimq's ``keptMQSet``; None from a broker that does not say)."""
        body = {"consumerGroup": consumer_group, "clientId": client_id, "mqSet": [m.to_wire() for m in mqs]}
        resp = await self.invoke(addr, RequestCode.LOCK_BATCH_MQ, body=body, timeout_ms=timeout_ms)
        m = _map(resp.body, "LOCK_BATCH_MQ", addr, "body")
        held = _mq_list(m.get("lockOKMQSet"), "LOCK_BATCH_MQ", addr)
        kept = m.get("keptMQSet")
        return held, None if kept is None else _mq_list(kept, "LOCK_BATCH_MQ", addr) & held

    async def lock_batch_mq_lease(
        self,
        addr: str,
        consumer_group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        *,
        claims: Mapping[MessageQueue, int] | None = None,
        timeout_ms: int | None = 1000,
    ) -> LockBatchAnswer:
        """LOCK_BATCH_MQ with trimq's lease fields: ``claims`` maps queues to the epoch this client still holds
        them under (its own clock says the lease has not run out), which a restarted broker honours during its
        restart grace. An empty ``mqs`` renews the client's group membership only."""
        body: dict[str, Any] = {"consumerGroup": consumer_group, "clientId": client_id,
                                "mqSet": [m.to_wire() for m in mqs]}
        if claims:
            body["claims"] = [{**mq.to_wire(), "lockEpoch": epoch} for mq, epoch in sorted(claims.items())]
        resp = await self.invoke(addr, RequestCode.LOCK_BATCH_MQ, body=body, timeout_ms=timeout_ms)
        what = "LOCK_BATCH_MQ"
        m = _map(resp.body, what, addr, "body")
        ok_raw = m.get("lockOKMQSet") or []
        held = _mq_list(ok_raw, what, addr)
        kept_raw = m.get("keptMQSet")
        kept = None if kept_raw is None else _mq_list(kept_raw, what, addr) & held
        epochs: dict[MessageQueue, int] = {}
        raw_epochs = m.get("lockEpochs")
        if raw_epochs is not None:
            if (not isinstance(raw_epochs, list) or len(raw_epochs) != len(ok_raw)
                    or not all(type(e) is int and e >= 0 for e in raw_epochs)):
                raise _malformed(what, addr, "lockEpochs must be one non-negative integer per lockOKMQSet entry")
            epochs = {MessageQueue.from_wire(q): e for q, e in zip(ok_raw, raw_epochs, strict=True)}
        lease = m.get("leaseMs")
        if lease is not None and (type(lease) is not int or lease <= 0):
            raise _malformed(what, addr, f"leaseMs must be a positive integer, got {lease!r}")
        member = m.get("member")
        if member is not None and not isinstance(member, bool):
            raise _malformed(what, addr, f"member must be true or false, got {member!r}")
        grace = m.get("graceMs")
        if grace is not None and (type(grace) is not int or grace < 0):
            raise _malformed(what, addr, f"graceMs must be a non-negative integer, got {grace!r}")
        return LockBatchAnswer(held, kept, epochs, lease, member, grace)

    async def unlock_batch_mq(
        self,
        addr: str,
        consumer_group: str,
        client_id: str,
        mqs: Iterable[MessageQueue],
        *,
        oneway: bool = False,
        timeout_ms: int | None = 1000,
    ) -> None:
        """UNLOCK_BATCH_MQ: release this client's locks on the queues."""
        body = {"consumerGroup": consumer_group, "clientId": client_id, "mqSet": [m.to_wire() for m in mqs]}
        if oneway:
            await self.invoke_oneway(addr, RequestCode.UNLOCK_BATCH_MQ, body=body)
        else:
            await self.invoke(addr, RequestCode.UNLOCK_BATCH_MQ, body=body, timeout_ms=timeout_ms)

    # --- routes, topics, cluster -------------------------------------------------------------------

    async def get_topic_route(self, namesrv_addr: str, topic: str, *, timeout_ms: int | None = None) -> TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC from a name server. Raises TopicNotExistError for an unknown topic."""
        resp = await self.invoke(namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic},
                                 timeout_ms=timeout_ms)
        return parse_route(resp.body, namesrv_addr)

    async def create_topic(
        self,
        addr: str,
        topic: str,
        *,
        read_queue_nums: int = 4,
        write_queue_nums: int = 4,
        perm: int = PERM_READ | PERM_WRITE,
        timeout_ms: int | None = None,
    ) -> None:
        """UPDATE_AND_CREATE_TOPIC on one broker."""
        ext = {"topic": topic, "readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums, "perm": perm}
        await self.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext, timeout_ms=timeout_ms)

    async def get_all_topic_config(self, addr: str, *, timeout_ms: int | None = None) -> dict[str, TopicConfig]:
        """GET_ALL_TOPIC_CONFIG: every topic the broker hosts."""
        what = "GET_ALL_TOPIC_CONFIG"
        resp = await self.invoke(addr, RequestCode.GET_ALL_TOPIC_CONFIG, timeout_ms=timeout_ms)
        table = _map(_map(resp.body, what, addr, "body").get("topicConfigTable", {}), what, addr, "topicConfigTable")
        out: dict[str, TopicConfig] = {}
        for name, tc in table.items():
            m = _map(tc, what, addr, f"topic config of {name!r}")
            out[str(name)] = TopicConfig(
                topic_name=str(m.get("topicName", name)),
                read_queue_nums=_int(m, "readQueueNums", what, addr),
                write_queue_nums=_int(m, "writeQueueNums", what, addr),
                perm=_int(m, "perm", what, addr, PERM_READ | PERM_WRITE),
            )
        return out

    async def get_broker_cluster_info(self, namesrv_addr: str, *, timeout_ms: int | None = None) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO from a name server: brokers by name and broker names by cluster."""
        what = "GET_BROKER_CLUSTER_INFO"
        resp = await self.invoke(namesrv_addr, RequestCode.GET_BROKER_CLUSTER_INFO, timeout_ms=timeout_ms)
        body = _map(resp.body, what, namesrv_addr, "body")
        brokers = {
            str(k): _broker_data(v, what, namesrv_addr)
            for k, v in _map(body.get("brokerAddrTable", {}), what, namesrv_addr, "brokerAddrTable").items()
        }
        clusters = {
            str(k): frozenset(str(n) for n in (v or []))
            for k, v in _map(body.get("clusterAddrTable", {}), what, namesrv_addr, "clusterAddrTable").items()
        }
        return ClusterInfo(broker_addr_table=brokers, cluster_addr_table=clusters)

    async def get_all_topic_list(self, namesrv_addr: str, *, timeout_ms: int | None = None) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic some broker registered."""
        what = "GET_ALL_TOPIC_LIST_FROM_NAMESERVER"
        resp = await self.invoke(namesrv_addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, timeout_ms=timeout_ms)
        topics = _map(resp.body, what, namesrv_addr, "body").get("topicList")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise _malformed(what, namesrv_addr, f"topicList must be a list of strings: {topics!r}")
        return list(topics)

    async def get_broker_runtime_info(self, addr: str, *, timeout_ms: int | None = None) -> dict[str, Any]:
        """GET_BROKER_RUNTIME_INFO: name, cluster, version, uptime, connections..."""
        resp = await self.invoke(addr, RequestCode.GET_BROKER_RUNTIME_INFO, timeout_ms=timeout_ms)
        return _map(resp.body, "GET_BROKER_RUNTIME_INFO", addr, "body")

    # --- admin queries (structured bodies, returned as decoded maps; docs/PROTOCOL.md §4) --------------

    async def get_consumer_connection_list(
        self, addr: str, consumer_group: str, *, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """GET_CONSUMER_CONNECTION_LIST: the group's members, subscriptions and whether they agree."""
        resp = await self.invoke(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": consumer_group},
                                 timeout_ms=timeout_ms)
        return _map(resp.body, "GET_CONSUMER_CONNECTION_LIST", addr, "body")

    async def get_consume_stats(
        self, addr: str, consumer_group: str, topic: str | None = None, *, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """GET_CONSUME_STATS: per queue broker offset, consumer offset, lag and lock owner."""
        resp = await self.invoke(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": consumer_group, "topic": topic},
                                 timeout_ms=timeout_ms)
        return _map(resp.body, "GET_CONSUME_STATS", addr, "body")

    async def get_lock_table(
        self, addr: str, consumer_group: str | None = None, *, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """GET_LOCK_TABLE (trimq): the broker's queue locks, fenced update counts and lock statistics."""
        resp = await self.invoke(addr, RequestCode.GET_LOCK_TABLE, {"consumerGroup": consumer_group},
                                 timeout_ms=timeout_ms)
        return _map(resp.body, "GET_LOCK_TABLE", addr, "body")

    async def get_subscription_consistency(
        self, addr: str, consumer_group: str | None = None, *, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """GET_SUBSCRIPTION_CONSISTENCY (trimq): whether each group's members subscribe alike."""
        resp = await self.invoke(addr, RequestCode.GET_SUBSCRIPTION_CONSISTENCY, {"consumerGroup": consumer_group},
                                 timeout_ms=timeout_ms)
        return _map(resp.body, "GET_SUBSCRIPTION_CONSISTENCY", addr, "body")

    async def admin_query(
        self,
        addr: str,
        code: int,
        ext: dict[str, Any] | None = None,
        body: Any = None,
        *,
        timeout_ms: int | None = None,
    ) -> Any:
        """Any admin request answered with a structured body (trimq's 9000+ codes, stats...): the body."""
        resp = await self.invoke(addr, code, ext, body, timeout_ms=timeout_ms)
        return resp.body
