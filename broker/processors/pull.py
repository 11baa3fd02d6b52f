"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + DefaultMessageStore.getMessage).

Store status -> response code (RocketMQ 4.9.3 on a master; docs/PROTOCOL.md §4.1):

==========================  ======================  =========================================
store status                response                nextBeginOffset
==========================  ======================  =========================================
FOUND                       SUCCESS                 past the last unit examined
NO_MATCHED_MESSAGE          PULL_RETRY_IMMEDIATELY  past the units filtered out by tag
MESSAGE_WAS_REMOVING        PULL_RETRY_IMMEDIATELY  past the units examined
NO_MATCHED_LOGIC_QUEUE /    PULL_NOT_FOUND if the   0
NO_MESSAGE_IN_QUEUE         offset is 0, else
                            PULL_OFFSET_MOVED
OFFSET_TOO_SMALL            PULL_OFFSET_MOVED       min offset
OFFSET_OVERFLOW_ONE         PULL_NOT_FOUND          the offset (== max offset)
OFFSET_OVERFLOW_BADLY       PULL_OFFSET_MOVED       max offset (RocketMQ: 0 when min is 0)
OFFSET_FOUND_NULL           PULL_NOT_FOUND          the offset
==========================  ======================  =========================================

A PULL_NOT_FOUND with the suspend flag is held (long polling) for min(suspendTimeoutMillis,
suspend_timeout_ms), or ``short_polling_time_ms`` when long polling is off, and answered as soon as the
queue grows. With the commit-offset flag the group's ``commitOffset`` is stored (first pass only, like
RocketMQ's ``brokerAllowSuspend``) through ``broker.components["offset_manager"]`` when there is one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from broker.long_polling import LongPolling
from broker.processors.send import int_field, str_field
from broker.server import RequestError
from broker.store.consume_queue import tags_string_to_tags_code
from broker.store.message_store import GetMessageResult, GetMessageStatus, MessageStore
from broker.store.topics import TopicConfigManager
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.logs import get_logger

if TYPE_CHECKING:
    from broker.broker import Broker
    from broker.server import Connection

log = get_logger("trimq.pull")

__all__ = ["PullService", "parse_subscription"]

SYSFLAG_COMMIT_OFFSET = 0x1
SYSFLAG_SUSPEND = 0x2
SYSFLAG_SUBSCRIPTION = 0x4
SYSFLAG_CLASS_FILTER = 0x8

_RETRY = ResponseCode.PULL_RETRY_IMMEDIATELY
_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: _RETRY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: _RETRY,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
}


@functools.lru_cache(maxsize=1024)
def parse_subscription(expression: str | None) -> frozenset[int] | None:
    """Tag expression -> the tags codes to accept, or None for every message ("*", empty).

    ``"TagA || TagB"`` accepts messages whose tags hash is one of the two (RocketMQ's FilterAPI); the
    exact tag is compared by the client, since different tags can share a hash.
    """
    if expression is None:
        return None
    expr = expression.strip()
    if not expr or expr == "*":
        return None
    tags = [t.strip() for t in expr.split("||")]
    tags = [t for t in tags if t]
    if not tags:
        return None
    return frozenset(tags_string_to_tags_code(t) for t in tags)


def _grown(store: MessageStore, topic: str, queue_id: int, offset: int) -> Callable[[], bool]:
    return lambda: store.get_max_offset_in_queue(topic, queue_id) > offset


class PullService:
    """Registers PULL_MESSAGE and feeds the long-polling waiting rooms from the store."""

    name = "pull"

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.store: MessageStore = broker.components["store"]
        self.topics: TopicConfigManager = broker.components["topic_config_manager"]
        self.long_polling = LongPolling()
        self.store.arrival_listeners.append(self.long_polling.notify)
        broker.components["long_polling"] = self.long_polling
        #: (topic, group) -> [messages, record bytes] returned by pulls, read by broker/metrics.py at scrape time.
        self.get_stats: dict[tuple[str, str], list[int]] = {}
        broker.server.register(RequestCode.PULL_MESSAGE, self.pull_message)

    async def start(self) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        # Held pulls must be answered as soon as the broker starts draining, not after their timeout.
        await self.broker.server.wait_shutdown()
        self.long_polling.shutdown()

    async def stop(self) -> None:
        self.long_polling.shutdown()

    # ------------------------------------------------------------------------------------------------
    async def pull_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ext = cmd.ext
        group = str_field(ext, "consumerGroup")
        topic = str_field(ext, "topic")
        queue_id = int_field(ext, "queueId")
        offset = int_field(ext, "queueOffset")
        max_nums = int_field(ext, "maxMsgNums", 32)
        sys_flag = int_field(ext, "sysFlag", 0)
        if offset < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"queueOffset {offset} is negative")
        if max_nums < 1:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"maxMsgNums {max_nums} must be at least 1")
        subscription = ext.get("subscription")
        if subscription is not None and not isinstance(subscription, str):
            raise RequestError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "subscription must be a string")
        cfg = self.topics.get(topic)
        if cfg is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg.readable:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= queue_id < cfg.read_queue_nums:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                f"[{cfg.read_queue_nums}] consumer:[{conn.remote}]",
            )
        tag_codes = parse_subscription(subscription)
        result = self.store.get_message(topic, queue_id, offset, max_nums, tag_codes)
        code = self._code(result, offset)

        if sys_flag & SYSFLAG_COMMIT_OFFSET:
            self._commit_offset(group, topic, queue_id, ext, conn)

        if code == ResponseCode.PULL_NOT_FOUND and sys_flag & SYSFLAG_SUSPEND:
            if self.config.long_polling_enable:
                hold_ms = min(max(0, int_field(ext, "suspendTimeoutMillis", 15_000)), self.config.suspend_timeout_ms)
            else:
                hold_ms = self.config.short_polling_time_ms
            result, code = await self._hold(topic, queue_id, result.next_begin_offset, max_nums, tag_codes,
                                            hold_ms, result)
        if result.message_count:
            st = self.get_stats.get((topic, group))
            if st is None:
                # Group names come from clients: bound the table rather than trust them.
                st = [0, 0] if len(self.get_stats) >= 100_000 else self.get_stats.setdefault((topic, group), [0, 0])
            st[0] += result.message_count
            st[1] += len(result.body)
        return self._response(cmd, code, result)

    def _code(self, result: GetMessageResult, offset: int) -> int:
        code = _CODES.get(result.status)
        if code is None:  # NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        return code

    async def _hold(self, topic: str, queue_id: int, offset: int, max_nums: int, tag_codes: frozenset[int] | None,
                    hold_ms: int, result: GetMessageResult) -> tuple[GetMessageResult, int]:
        """Wait for the queue to grow past ``offset``; pull again when it does (no second suspend)."""
        deadline = trio.current_time() + hold_ms / 1000
        store = self.store
        code: int = ResponseCode.PULL_NOT_FOUND
        while True:
            arrived = await self.long_polling.wait(topic, queue_id, deadline, _grown(store, topic, queue_id, offset))
            if not arrived:
                # Keep how far filtering already moved us: the client continues from there.
                result.next_begin_offset = offset
                result.max_offset = store.get_max_offset_in_queue(topic, queue_id)
                return result, ResponseCode.PULL_NOT_FOUND
            result = store.get_message(topic, queue_id, offset, max_nums, tag_codes)
            code = self._code(result, offset)
            if (result.status is GetMessageStatus.NO_MATCHED_MESSAGE and trio.current_time() < deadline
                    and not self.long_polling.closed):
                offset = result.next_begin_offset  # only messages of other tags arrived: keep holding
                continue
            return result, code

    def _commit_offset(self, group: str, topic: str, queue_id: int, ext: dict[str, Any], conn: Connection) -> None:
        manager = self.broker.components.get("offset_manager")
        if manager is None:
            return
        commit = int_field(ext, "commitOffset", -1)
        if commit < 0:
            return
        try:
            manager.commit_offset(group, topic, queue_id, commit, conn.attributes.get("client_id"), source="pull")
        except Exception:
            log.exception("pull.commit_offset_failed", group=group, topic=topic, queue_id=queue_id)

    @staticmethod
    def _response(cmd: RemotingCommand, code: int, result: GetMessageResult) -> RemotingCommand:
        ext = {
            "nextBeginOffset": result.next_begin_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
            "suggestWhichBrokerId": 0,
        }
        body = result.body if code == ResponseCode.SUCCESS else None
        return RemotingCommand(code=int(code), opaque=cmd.opaque, flag=1, ext=ext, body=body)
